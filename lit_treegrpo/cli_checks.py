"""The checks of a parsed configuration that need no weights: :func:`check_config`, which the CLI
runs before any model loads (minutes for SD3.5), so that a bad value fails in one line naming the
option instead of after the load or deep inside the first training step."""

from __future__ import annotations

import importlib
import math
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from .cli_errors import UserError
from .core.loss import ClippedPolicyLoss
from .core.pruning import PruningConfig
from .core.spec import RolloutLimits, TreeSpec
from .data import PromptDataModule
from .resume import ADAPTER_MEMORY_OPTIONS, check_resumable, class_record, plain, read_fingerprint, reward_record
from .rewards import check_reward_names
from .settings import AdvantageSettings, FaultPolicy, MemoryGuard, check_settings


def _plain(value: Any) -> Any:
    """A parsed Namespace as plain dicts, without jsonargparse's bookkeeping keys (``__path__`` of
    a section read from its own file)."""
    if isinstance(value, Namespace):
        value = value.as_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if not k.startswith("__")}
    return value


def _build(option: str, make: Any) -> Any:
    """``make()``, its ``ValueError`` prefixed by the option it concerns."""
    try:
        return make()
    except (ValueError, TypeError) as err:
        raise UserError(f"{option}: {err}") from err


def _data_parallel_world(trainer: Any) -> int | None:
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


def _nan_options(value: Any, option: str) -> list[str]:
    """The options under ``value`` (a parsed section) whose value is a float NaN."""
    if isinstance(value, float):
        return [option] if math.isnan(value) else []
    if isinstance(value, Namespace):
        value = value.as_dict()
    if isinstance(value, dict):
        return [found for k, v in value.items() if not str(k).startswith("__") for found in _nan_options(v, f"{option}.{k}")]
    if isinstance(value, (list, tuple)):
        return [found for i, v in enumerate(value) for found in _nan_options(v, f"{option}[{i}]")]
    return []


def check_config(config: Any) -> None:
    """Everything the run's options say that can be checked without weights: no NaN anywhere, the
    tree, advantage, loss, pruning, fault and memory settings, the reward names and their extras,
    the prompts, the batch sizes against the world size. Raises :class:`UserError` /
    ``ValueError`` (one line)."""
    # YAML's .nan parses as a float, and would surface (if at all) as a NaN reward or a message
    # from deep inside the optimizer that names no option
    nans = [found for section in ("model", "data", "trainer") for found in _nan_options(config.get(section), f"--{section}")]
    if nans:
        raise UserError(f"{nans[0]}: nan is not a value any option accepts; give a number")
    model = config["model"]
    try:
        check_reward_names(model.get("reward"), _plain(model.get("reward_kwargs")) or {})
    except (ValueError, ImportError) as err:
        raise UserError(f"--model.reward: {err}") from err
    tree = _build("--model.tree", lambda: TreeSpec.from_dict(_plain(model["tree"])))
    limits = _build("--model.rollout", lambda: RolloutLimits(**_plain(model["rollout"])))
    _build("--model.advantage", lambda: AdvantageSettings(**_plain(model["advantage"])))
    _build("--model.pruning", lambda: PruningConfig(**_plain(model["pruning"])))
    _build("--model.faults", lambda: FaultPolicy(**_plain(model["faults"])))
    _build("--model.memory_guard", lambda: MemoryGuard(**_plain(model["memory_guard"])))
    loss = _build("--model.loss", lambda: _loss(model.get("loss")))
    adapter = model.get("adapter")
    adapter_args = _plain(adapter.get("init_args")) if isinstance(adapter, Namespace) else None
    adapter_args = adapter_args if isinstance(adapter_args, dict) else {}
    try:
        check_settings(
            tree,
            minibatches=model["minibatches"],
            accumulate=model["accumulate"],
            inner_epochs=model["inner_epochs"],
            grad_clip=model["grad_clip"],
            val_samples=model["val_samples"],
            edges_per_update=model["edges_per_update"],
            adapter_num_steps=adapter_args.get("num_steps"),
            limits=limits,
            prefix="--model.",
        )
    except ValueError as err:
        raise UserError(str(err)) from err
    if loss is not None and loss.kl_beta > 0 and "lora" in adapter_args and adapter_args["lora"] is None:
        raise UserError(
            "--model.loss.kl_beta > 0 needs the adapter's lora (the KL reference is the model with "
            "LoRA disabled); set --model.adapter.init_args.lora or --model.loss.kl_beta 0"
        )
    data = _plain(config["data"])
    with warnings.catch_warnings():  # e.g. duplicate prompts: warned when the real module is built
        warnings.simplefilter("ignore")
        datamodule = PromptDataModule(**data)
    world = _data_parallel_world(config["trainer"])
    if world is not None:
        datamodule.per_rank_batch_size(world)


def _loss(spec: Any) -> ClippedPolicyLoss | None:
    """The loss of a ``class_path`` / ``init_args`` spec, built (it holds no weights), or None."""
    if spec is None:
        return ClippedPolicyLoss()
    if not isinstance(spec, Namespace) or "class_path" not in spec:
        return None
    module, _, name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return cls(**(_plain(spec.get("init_args")) or {}))


def adapter_config(model: Any) -> dict[str, Any] | None:
    """The adapter's ``init_args`` as configured, less the memory knobs a resume may change
    (:data:`~lit_treegrpo.resume.ADAPTER_MEMORY_OPTIONS`): what a checkpoint records of them
    (``TreeGRPOModule.adapter_config``). None when the adapter is no ``class_path`` spec."""
    adapter = model.get("adapter")
    if not isinstance(adapter, Namespace) or "init_args" not in adapter:
        return None
    args = _plain(adapter.get("init_args")) or {}
    return {k: plain(v) for k, v in args.items() if k not in ADAPTER_MEMORY_OPTIONS}


def configured_fingerprint(config: Any) -> dict[str, Any]:
    """What the options alone say of a resume's fingerprint (:func:`lit_treegrpo.resume.fingerprint`:
    no trainable tensors, which need the model), built as the module builds its own."""
    model = config["model"]
    adapter = model.get("adapter")
    found: dict[str, Any] = {}
    if isinstance(adapter, Namespace) and adapter.get("class_path"):
        found["adapter"] = str(adapter["class_path"]).rpartition(".")[2]
    args = adapter_config(model)
    if args is not None:
        found["adapter_config"] = args
        if "num_steps" in args:
            found["num_steps"] = args["num_steps"]
    found["tree"] = asdict(TreeSpec.from_dict(_plain(model["tree"])))
    found["reward"] = reward_record(_plain(model.get("reward")))
    found["reward_kwargs"] = _plain(model.get("reward_kwargs")) or {}
    found["advantage"] = plain(AdvantageSettings(**_plain(model["advantage"])))
    loss = _loss(model.get("loss"))
    if loss is not None:
        found["loss"] = class_record(loss)
    found["seed"] = model.get("seed")
    optimizer = model.get("optimizer")
    if isinstance(optimizer, Namespace) and optimizer.get("class_path"):
        found["optimizer"] = str(optimizer["class_path"]).rpartition(".")[2]
    return found


def check_resume_options(config: Any, ckpt_path: str) -> None:
    """A fit that resumes ``ckpt_path``: refuse, before any model loads, an option it may not
    change (:func:`lit_treegrpo.resume.check_resumable`; ``ValueError``, one line). The module
    checks again when the checkpoint loads, with what only the model knows (the trainable tensors),
    and a checkpoint that records none of this (not written by this project's fit) is left to it."""
    saved = read_fingerprint(ckpt_path) if Path(ckpt_path).is_file() else None
    if saved is not None:
        check_resumable(saved, configured_fingerprint(config), None, fitting=True, where=f"the checkpoint {ckpt_path}")
