"""The Trainer's options checked before any model loads (:func:`check_trainer`, run by
:func:`~lit_treegrpo.cli.checks.check_config`), in one line naming the option and the fix."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from .user_errors import UserError


def data_parallel_world(trainer: Any) -> int | None:
    """Data-parallel processes from the trainer options, when they say it plainly (``devices``
    an int, a list or a ``"0,1"`` string); ``None`` for ``auto`` / ``-1`` and for strategies that
    split devices between tensor and data parallelism."""
    strategy = trainer.get("strategy")
    strategy_name = strategy if isinstance(strategy, str) else getattr(strategy, "class_path", "") or ""
    if "ModelParallel" in str(strategy_name) or type(strategy).__name__ == "ModelParallelStrategy":
        return None
    devices = trainer.get("devices", "auto")
    if isinstance(devices, str):
        if devices.strip() in ("auto", "-1"):
            return None
        parts = [d for d in devices.split(",") if d.strip()]
        count = int(parts[0]) if len(parts) == 1 and devices.strip().lstrip("-").isdigit() else len(parts)
    elif isinstance(devices, int):
        count = devices
    elif isinstance(devices, (list, tuple)):
        count = len(devices)
    else:
        return None
    if count < 1:
        return None
    return count * int(trainer.get("num_nodes") or 1)


#: what a duration option takes (Lightning's Timer and time-based val_check_interval)
_DURATION = "a duration DD:HH:MM:SS (e.g. 00:12:00:00 for 12 hours) or a mapping such as {hours: 12}"
_TIMEDELTA_KEYS = ("weeks", "days", "hours", "minutes", "seconds", "milliseconds", "microseconds")
#: the batch limit each command runs on: 0 there runs nothing
_OWN_LIMIT = {
    "fit": "limit_train_batches",
    "validate": "limit_val_batches",
    "test": "limit_test_batches",
    "predict": "limit_predict_batches",
}


def is_number(value: Any) -> bool:
    """An int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _seconds(value: Any, option: str) -> float:
    """The length in seconds of a duration option's value; :class:`UserError` when it is none."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str):
        match = re.fullmatch(r"(\d+):(\d\d):(\d\d):(\d\d)", value.strip())
        if match is None:
            raise UserError(f"{option} {value!r}: not a duration; give {_DURATION}")
        days, hours, minutes, secs = (int(g) for g in match.groups())
        seconds = timedelta(days=days, hours=hours, minutes=minutes, seconds=secs).total_seconds()
    elif isinstance(value, dict):
        unknown = [k for k in value if k not in _TIMEDELTA_KEYS]
        if unknown:
            raise UserError(
                f"{option} {value}: {unknown[0]!r} is no unit of a duration; use {', '.join(_TIMEDELTA_KEYS)}"
            )
        if not all(is_number(v) and v >= 0 for v in value.values()):
            raise UserError(f"{option} {value}: a negative or non-numeric part; give {_DURATION}")
        seconds = timedelta(**value).total_seconds()
    else:
        raise UserError(f"{option} {value!r}: not a duration; give {_DURATION}")
    return seconds


def _batch_limit(trainer: dict[str, Any], name: str) -> None:
    """``limit_*_batches`` / ``overfit_batches``: a fraction in [0, 1] or a whole number >= 0."""
    value = trainer.get(name)
    if value is None or not is_number(value):
        return
    if value < 0 or (value > 1 and value % 1 != 0):
        raise UserError(
            f"--trainer.{name} must be a fraction of the batches in [0.0, 1.0] or a whole number of batches, got {value}"
        )


def _batch_limits(trainer: dict[str, Any], subcommand: str | None) -> None:
    """Every ``limit_*_batches`` and ``overfit_batches``, and the running command's own limit not 0."""
    for name in (
        "limit_train_batches",
        "limit_val_batches",
        "limit_test_batches",
        "limit_predict_batches",
        "overfit_batches",
    ):
        _batch_limit(trainer, name)
    own = _OWN_LIMIT.get(subcommand or "fit")
    if own is not None and is_number(trainer.get(own)) and trainer[own] == 0:
        raise UserError(
            f"--trainer.{own} 0: {subcommand or 'fit'} would run no batch; give a number of batches >= 1, "
            "a fraction in (0, 1], or null for all"
        )


def _devices(trainer: dict[str, Any]) -> None:
    """``devices``: ``auto``, a count >= 1, -1 (every device), or GPU indices (a list, ``"0,1"``);
    on the CPU a count only."""
    devices = trainer.get("devices", "auto")
    option = f"--trainer.devices {devices}"
    accelerator = trainer.get("accelerator", "auto")
    accelerator = accelerator if isinstance(accelerator, str) else ""
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not _has_gpu())
    fix = (
        "give the number of processes (>= 1), or auto"
        if on_cpu
        else ('give a count >= 1, -1 for every device, GPU indices such as [0, 1] or "0,1", or auto')
    )
    if isinstance(devices, str):
        text = devices.strip()
        if text == "auto":
            return
        if re.fullmatch(r"-?\d+", text):
            devices = int(text)
        elif re.fullmatch(r"\d+(\s*,\s*\d+)*\s*,?", text):
            devices = [int(d) for d in text.split(",") if d.strip()]
        else:
            raise UserError(f"{option}: not a device count or a list of device indices; {fix}")
    if isinstance(devices, bool) or (isinstance(devices, int) and (devices == 0 or devices < -1)):
        raise UserError(f"{option}: no device would run; {fix}")
    if isinstance(devices, list):
        if not devices or any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in devices):
            raise UserError(f"{option}: device indices are whole numbers >= 0, at least one; {fix}")
        if on_cpu:
            raise UserError(f"{option}: device indices select GPUs, this run is on the CPU; {fix}")
    if devices == -1 and on_cpu:
        raise UserError(f"{option}: -1 (every device) selects GPUs, this run is on the CPU; {fix}")


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available() or (hasattr(torch.backends, "mps") and torch.backends.mps.is_available())


def _at_least(trainer: dict[str, Any], name: str, low: int, meaning: str = "") -> None:
    value = trainer.get(name)
    if is_number(value) and value < low:
        raise UserError(f"--trainer.{name} must be >= {low}{meaning} or null, got {value}")


def _one_pruning_owner(callbacks: Any) -> None:
    """Two ``PruningSchedule`` callbacks: one line here, instead of Lightning's traceback about
    two stateful callbacks of one type once the model has loaded."""
    callbacks = callbacks if isinstance(callbacks, list) else [callbacks] if callbacks else []
    names = [str(c.get("class_path", "")).rsplit(".", 1)[-1] for c in callbacks if isinstance(c, dict)]
    if names.count("PruningSchedule") > 1:
        raise UserError(
            f"--trainer.callbacks has {names.count('PruningSchedule')} PruningSchedule callbacks; a fit has one "
            "pruning: keep one (its options express every schedule and every fixed pruning)"
        )
    paths = [str(c.get("class_path", "")) for c in callbacks if isinstance(c, dict)]
    for path in dict.fromkeys(paths):
        if paths.count(path) > 1 and _keeps_one_state_per_type(path):
            raise UserError(
                f"--trainer.callbacks has {paths.count(path)} {path.rsplit('.', 1)[-1]} callbacks; each keeps its "
                "state in the checkpoint under its type's name, so a fit can hold one: keep one"
            )


def _keeps_one_state_per_type(class_path: str) -> bool:
    """Whether a callback class saves state under Lightning's default key, its type's name (two of one type then
    collide: Lightning refuses them with a traceback once the model has loaded)."""
    import importlib

    from lightning.pytorch.callbacks import Callback

    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return False  # jsonargparse names a class that cannot be imported
    if not (isinstance(cls, type) and issubclass(cls, Callback)):
        return False
    return cls.state_dict is not Callback.state_dict and cls.state_key is Callback.state_key


#: --trainer.precision values that keep every trained weight in float32 (the model computes in the autocast dtype)
KEEPS_FLOAT32 = ("32-true", "32", "bf16-mixed", "bf16", "16-mixed", "16")


def _precision(trainer: dict[str, Any]) -> None:
    """Only precisions that keep the trained weights in float32: a ``-true`` precision casts the whole module, the
    float32 master weights and LoRA weights with it (Lightning says nothing, and the first step fails or every small
    update rounds away); ``transformer-engine`` swaps the model's layers. Each is refused in one line."""
    value = trainer.get("precision")
    if value is None or str(value) in KEEPS_FLOAT32:
        return
    raise UserError(
        f"--trainer.precision {value}: casts the trained weights themselves (float32 master weights and LoRA "
        "weights included), where AdamW's small updates round away; use --trainer.precision bf16-mixed (the weights "
        "stay float32, the denoiser computes in bfloat16; 16-mixed for float16 on a GPU) and keep "
        "--model.adapter.init_args.master_weights true for a bfloat16 checkpoint fully fine-tuned"
    )


def check_trainer(trainer: dict[str, Any], subcommand: str | None = None) -> None:
    """Raise :class:`UserError` (one line naming the option) for a Trainer option that Lightning would refuse only
    after the model loaded, refuse with a traceback, or accept and then train, validate or log nothing."""
    fit = subcommand in (None, "fit")
    _one_pruning_owner(trainer.get("callbacks"))
    _precision(trainer)
    num_nodes = trainer.get("num_nodes")
    if is_number(num_nodes) and num_nodes < 1:
        raise UserError(f"--trainer.num_nodes must be >= 1, got {num_nodes}")
    _devices(trainer)
    fast_dev_run = trainer.get("fast_dev_run")
    if is_number(fast_dev_run) and fast_dev_run < 0:
        raise UserError(f"--trainer.fast_dev_run must be false, true or a number of batches >= 0, got {fast_dev_run}")
    for name, also in (("max_steps", ""), ("max_epochs", ", or null")):
        value = trainer.get(name)
        if is_number(value) and value < -1:
            raise UserError(f"--trainer.{name} must be >= 1, or -1 for no limit{also}, got {value}")
        if is_number(value) and fit and value == 0:
            raise UserError(f"--trainer.{name} 0: the fit would train nothing; give >= 1, or -1 for no limit{also}")
    _at_least(trainer, "min_epochs", 0)
    _at_least(trainer, "min_steps", 0)
    _minimum_below_stops(trainer)
    _at_least(trainer, "check_val_every_n_epoch", 1)
    _at_least(trainer, "num_sanity_val_steps", -1, " (-1: every validation batch)")
    _at_least(trainer, "reload_dataloaders_every_n_epochs", 0)
    log_every = trainer.get("log_every_n_steps")
    if is_number(log_every) and log_every < 1 and not trainer.get("barebones"):
        raise UserError(
            f"--trainer.log_every_n_steps {log_every}: the run would log nothing; give >= 1 (1: every step)"
        )
    if trainer.get("max_time") is not None and _seconds(trainer["max_time"], "--trainer.max_time") <= 0:
        raise UserError(
            f"--trainer.max_time {trainer['max_time']}: stops the run before its first step; give {_DURATION}"
        )
    _batch_limits(trainer, subcommand)
    _val_check_interval(trainer)
    accumulate = trainer.get("accumulate_grad_batches")
    if accumulate is not None and accumulate != 1:
        raise UserError(
            f"--trainer.accumulate_grad_batches {accumulate}: this module steps its optimizer itself, so "
            "Lightning's accumulation does not apply; leave it at 1 and set --model.accumulate"
        )
    for name in ("gradient_clip_val", "gradient_clip_algorithm"):
        if trainer.get(name) is not None:
            raise UserError(
                f"--trainer.{name} {trainer[name]}: this module clips its own gradients, so Lightning's "
                "clipping does not apply; leave it null and set --model.grad_clip (null: no clipping)"
            )
    root = trainer.get("default_root_dir")
    if root is not None and Path(root).exists() and not Path(root).is_dir():
        raise UserError(f"--trainer.default_root_dir {root}: is a file; give a folder (it is created if missing)")


def _val_check_interval(trainer: dict[str, Any]) -> None:
    """An int >= 1 (training steps), a fraction of an epoch in (0, 1] (with check_val_every_n_epoch)
    or a duration > 0."""
    value = trainer.get("val_check_interval")
    option = "--trainer.val_check_interval"
    if value is None:
        return
    if isinstance(value, (str, dict, timedelta)):
        if _seconds(value, option) <= 0:
            raise UserError(f"{option} {value}: a zero duration; give {_DURATION}, or training steps (>= 1)")
        return
    if not is_number(value):
        return
    if value <= 0 or (value > 1 and value % 1 != 0):
        raise UserError(
            f"{option} {value}: give the training steps between validations (>= 1), a fraction of an epoch "
            "in (0, 1], or a duration; --trainer.limit_val_batches 0 turns validation off"
        )
    if isinstance(value, float) and value <= 1 and trainer.get("check_val_every_n_epoch") is None:
        raise UserError(
            f"{option} {value}: a fraction of an epoch needs --trainer.check_val_every_n_epoch, which is "
            "null; give the training steps between validations (an integer) instead"
        )


def _minimum_below_stops(trainer: dict[str, Any]) -> None:
    """Refuse ``min_steps`` / ``min_epochs`` past a stop they would override: Lightning keeps training until the
    minimum is reached whatever ``max_steps``, ``max_epochs`` or ``max_time`` say (a min_steps of 1e18 ran until
    killed, saying "Time limit reached" at every step)."""
    for name, stop in (("min_steps", "max_steps"), ("min_epochs", "max_epochs")):
        least, most = trainer.get(name), trainer.get(stop)
        if not is_number(least) or least <= 0:
            continue
        if is_number(most) and most >= 0 and least > most:
            raise UserError(f"--trainer.{name} {least} is past --trainer.{stop} {most}, which it overrides; lower it")
        if trainer.get("max_time") is not None:
            raise UserError(
                f"--trainer.{name} {least}: Lightning trains that far whatever --trainer.max_time says; give one of "
                "the two"
            )
