"""The checks of a parsed configuration that need no weights: :func:`check_config`, which the CLI
runs before any model loads (minutes for SD3.5), so that a bad value fails in one line naming the
option instead of after the load or deep inside the first training step."""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import re
import warnings
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from jsonargparse import Namespace

from ..common.values import check_arguments
from ..core.compute import ComputeCost
from ..core.loss import ClippedPolicyLoss, check_kl_reference
from ..core.spec import RolloutLimits, TreeSpec
from ..data.datamodule import PromptDataModule
from ..rewards import REWARDS, check_reward_names
from ..training.faults import FaultPolicy
from ..training.memory_guard import MemoryGuard
from ..training.prompt_cache import PromptCacheSettings
from ..training.resume import (
    ADAPTER_MEMORY_OPTIONS,
    check_resumable,
    class_record,
    fingerprint_of,
    plain,
    reward_record,
)
from ..training.settings import AdvantageSettings, UpdateSettings, check_val_samples
from ..training.work import WorkLimit, check_configured_steps, check_configured_work
from .trainer_checks import check_trainer, data_parallel_world, is_number
from .user_errors import UserError


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


def _build_named(prefix: str, make: Any) -> Any:
    """``make()``, its ``ValueError`` (which names the option) prefixed by ``prefix`` (``--model.``)."""
    try:
        return make()
    except ValueError as err:
        raise UserError(f"{prefix}{err}") from err


def _nan_options(value: Any, option: str) -> list[str]:
    """The options under ``value`` (a parsed section) whose value is a float NaN or infinity."""
    if isinstance(value, float):
        return [option] if not math.isfinite(value) else []
    if isinstance(value, Namespace):
        value = value.as_dict()
    if isinstance(value, dict):
        return [
            found for k, v in value.items() if not str(k).startswith("__") for found in _nan_options(v, f"{option}.{k}")
        ]
    if isinstance(value, (list, tuple)):
        return [found for i, v in enumerate(value) for found in _nan_options(v, f"{option}[{i}]")]
    return []


#: the options that are paths, with the fix an empty one gets
PATH_OPTIONS = {
    "trainer.default_root_dir": "give the run's folder, or leave the option out for runs/lit_treegrpo",
    "ckpt_path": "give a checkpoint file, or last, or leave the option out to start a new run",
    "out": "give the folder to write the export to, e.g. --out exports/my_run",
    "data.prompts": "give a prompt file or the name of a built-in prompt set",
    "data.val_prompts": "give a prompt file, or leave the option out to hold out --data.val_fraction of the prompts",
}


def _value_at(config: Any, option: str) -> Any:
    """The value of ``option`` (``--model.a.b[2]``) in a parsed configuration."""
    value: Any = config
    for key, index in re.findall(r"\.?([^.\[\]]+)|\[(\d+)\]", option.removeprefix("--")):
        value = _plain(value)
        value = value[int(index)] if index else value[key]
    return value


def _class_specs(value: Any, option: str) -> list[tuple[str, Any]]:
    """Every ``class_path`` / ``init_args`` spec under ``value`` (a parsed section), with its option."""
    value = value.as_dict() if isinstance(value, Namespace) else value
    if isinstance(value, dict):
        found = [(option, value)] if "class_path" in value and isinstance(value.get("init_args"), dict) else []
        return found + [
            spec
            for k, v in value.items()
            if not str(k).startswith("__") and k != "init_args"
            for spec in _class_specs(v, f"{option}.{k}")
        ]
    if isinstance(value, (list, tuple)):
        return [spec for i, v in enumerate(value) for spec in _class_specs(v, f"{option}[{i}]")]
    return []


def _path_parameters(class_path: str) -> set[str]:
    """The parameters of a class (``**kwargs`` followed up its bases) whose annotation is a path."""
    module, _, name = str(class_path).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return set()  # jsonargparse has refused such a class path already
    found: set[str] = set()
    for base in getattr(cls, "__mro__", ()):
        init = vars(base).get("__init__")
        if init is None:
            continue
        found |= {k for k, v in getattr(init, "__annotations__", {}).items() if re.search(r"path|PATH", str(v))}
        if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            break
    return found


def check_paths(config: Any) -> None:
    """Refuse a path option that is empty or whitespace (``--trainer.default_root_dir ''`` wrote the
    run into the working directory), among :data:`PATH_OPTIONS` and the path-typed arguments of
    every class the configuration builds (adapter, loggers, callbacks ...)."""
    for key, fix in PATH_OPTIONS.items():
        value = config.get(key) if "." not in key or config.get(key.split(".")[0]) is not None else None
        if isinstance(value, str) and not value.strip():
            raise UserError(f"--{key}: empty; {fix}")
    for section in ("model", "trainer", "data"):
        for option, spec in _class_specs(config.get(section), f"--{section}"):
            paths = _path_parameters(spec["class_path"])
            for arg, value in spec["init_args"].items():
                if arg in paths and isinstance(value, str) and not value.strip():
                    raise UserError(f"{option}.init_args.{arg}: empty; give a path, or leave the option out")


def check_config(config: Any, subcommand: str | None = None) -> None:
    """Everything the run's options say that can be checked without weights: no NaN anywhere, the trainer's options
    (for ``subcommand``; None: as for fit), the tree, advantage, loss, fault and memory settings, the optimizer's
    arguments, the reward names, their loaders' arguments and their extras, the prompts, the batch sizes against the
    world size."""
    # YAML's .nan parses as a float, and would surface (if at all) as a NaN reward or a message
    # from deep inside the optimizer that names no option
    nans = [
        found for section in ("model", "data", "trainer") for found in _nan_options(config.get(section), f"--{section}")
    ]
    if nans:
        value = _value_at(config, nans[0])
        raise UserError(
            f"{nans[0]}: {value} is not a value any option accepts; give a finite number "
            "(an option that can be turned off takes null)"
        )
    check_paths(config)
    check_trainer(_plain(config["trainer"]), subcommand)
    model = config["model"]
    try:
        names = check_reward_names(model.get("reward"), _plain(model.get("reward_kwargs")) or {})
    except (ValueError, ImportError) as err:
        raise UserError(f"--model.reward: {err}") from err
    check_reward_arguments(names, _plain(model.get("reward_kwargs")) or {})
    check_optimizer(model.get("optimizer"), "--model.optimizer")
    check_optimizer(config.get("optimizer"), "--optimizer")  # LightningCLI's own, when given
    check_lr_schedule(model.get("optimizer"), model.get("lr_scheduler"), _plain(config["trainer"]))
    check_adapter_arguments(model.get("adapter"))
    _build_named("--model.", lambda: ComputeCost(**(_plain(model.get("compute_cost")) or {})))
    # before the tree is built: its checks loop over the steps, and a num_steps of 1e18 would never end
    limit = _build("--model.work_limit", lambda: WorkLimit(**_plain(model["work_limit"])))
    tree_steps = _plain(model["tree"]).get("num_steps") if isinstance(model["tree"], Namespace) else None
    _build_named("", lambda: check_configured_steps(limit, tree_steps, adapter_args_of(model).get("num_steps")))
    # the module's own option objects, built as the module builds them (each checks itself)
    tree = _build("--model.tree", lambda: TreeSpec.from_dict(_plain(model["tree"])))
    _build("--model.rollout", lambda: RolloutLimits(**_plain(model["rollout"])))
    _build("--model.advantage", lambda: AdvantageSettings(**_plain(model["advantage"])))
    _build("--model.faults", lambda: FaultPolicy(**_plain(model["faults"])))
    _build("--model.memory_guard", lambda: MemoryGuard(**_plain(model["memory_guard"])))
    _build("--model.prompt_cache", lambda: PromptCacheSettings(**_plain(model["prompt_cache"])))
    loss = _build("--model.loss", lambda: _loss(model.get("loss")))
    _build_named("--model.", lambda: UpdateSettings.of(model))
    _build_named("--model.", lambda: check_val_samples(model["val_samples"]))
    adapter_args = adapter_args_of(model)
    if adapter_args.get("num_steps") is not None:  # the adapter owns the number of steps
        try:
            tree = tree.with_num_steps(adapter_args["num_steps"], prefix="--model.")
        except ValueError as err:  # another num_steps (named already), or a step out of the adapter's range
            text = str(err)
            raise UserError(text if text.startswith("--model.") else f"--model.tree: {text}") from err
    data = _plain(config["data"])
    with warnings.catch_warnings():  # e.g. duplicate prompts: warned when the real module is built
        warnings.simplefilter("ignore")
        datamodule = PromptDataModule(**data)
    world = data_parallel_world(config["trainer"])
    per_rank = datamodule.per_rank_batch_size(world if world is not None else 1)
    counts = dict(prompts=per_rank, val_prompts=len(datamodule.val_set.prompts))
    samples = dict(inner_epochs=int(model["inner_epochs"]), val_samples=int(model["val_samples"]))
    _build_named("", lambda: check_configured_work(limit, tree, adapter_args, **counts, **samples))
    _build_named("", lambda: tree.check_trains(prefix="--model."))
    if loss is not None:  # an adapter's lora defaults on; only an explicit null turns it off before the model loads
        has_lora = adapter_args.get("lora", True) is not None
        _build_named("", lambda: check_kl_reference(loss.kl_beta, has_lora=has_lora, prefix="--model."))


def adapter_args_of(model: Any) -> dict[str, Any]:
    """The adapter's ``init_args`` as given (empty when there are none)."""
    adapter = model.get("adapter")
    found = _plain(adapter.get("init_args")) if isinstance(adapter, Namespace) else None
    return found if isinstance(found, dict) else {}


def _loss(spec: Any) -> ClippedPolicyLoss | None:
    """The loss of a ``class_path`` / ``init_args`` spec, built (it holds no weights), or None."""
    if spec is None:
        return ClippedPolicyLoss()
    if not isinstance(spec, Namespace) or "class_path" not in spec:
        return None
    module, _, name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return cls(**(_plain(spec.get("init_args")) or {}))


# ------------------------------------------------------------------------ the optimizer
#: optimizer arguments checked by name, before torch's own checks: the test and what it wants
_OPTIMIZER_RULES = {
    "lr": (lambda v: v > 0, "> 0 (0 trains nothing)"),
    "weight_decay": (lambda v: v >= 0, ">= 0"),
    "eps": (lambda v: v > 0, "> 0 (it keeps an update finite where a gradient is 0)"),
    "momentum": (lambda v: v >= 0, ">= 0"),
    "dampening": (lambda v: v >= 0, ">= 0"),
    "lr_decay": (lambda v: v >= 0, ">= 0"),
    "initial_accumulator_value": (lambda v: v >= 0, ">= 0"),
    "alpha": (lambda v: v >= 0, ">= 0"),
    "rho": (lambda v: 0 <= v <= 1, "in [0, 1]"),
}
#: arguments that depend on the device the real parameters live on, left out of the trial build
_DEVICE_ARGS = ("fused", "foreach", "capturable", "differentiable")


def check_optimizer(spec: Any, option: str) -> None:
    """Refuse bad arguments of a ``class_path`` / ``init_args`` optimizer in one line naming the argument: those torch
    checks only when the optimizer is built (after the model loaded) and those it accepts although they train
    nothing or give NaN (``lr 0``, ``eps 0``)."""
    spec = _plain(spec)
    if not isinstance(spec, dict) or "class_path" not in spec:
        return
    args = spec.get("init_args") or {}
    for name, value in args.items():
        rule = _OPTIMIZER_RULES.get(name)
        if rule is not None and is_number(value) and not rule[0](value):
            raise UserError(f"{option}.init_args.{name} must be {rule[1]}, got {value}")
    betas = args.get("betas")
    if isinstance(betas, (list, tuple)):
        for i, beta in enumerate(betas):
            if is_number(beta) and not 0 <= beta < 1:
                raise UserError(f"{option}.init_args.betas[{i}] must be in [0, 1), got {beta}")
    import torch

    module, _, name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    trial = {k: v for k, v in args.items() if k not in _DEVICE_ARGS}
    try:
        cls([torch.nn.Parameter(torch.zeros(1))], **trial)
    except ValueError as err:  # torch's own argument checks ("Invalid learning rate: ...")
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        named = [k for k in trial if re.search(rf"\b{re.escape(k)}\b", message)]
        where = f"{option}.init_args.{named[0]}" if named else f"{option}.init_args"
        raise UserError(f"{where}: {spec['class_path']} refuses it: {message}") from err


# ------------------------------------------------------------------------ the learning-rate schedule
#: the most optimizer steps a schedule is simulated over (a run without max_steps: this many)
SCHEDULE_STEPS = 100_000


def check_lr_schedule(optimizer: Any, scheduler: Any, trainer: dict[str, Any]) -> None:
    """Run ``--model.lr_scheduler`` over the run's optimizer steps on a one-value optimizer before any model loads:
    a rate that turns negative or non-finite, or a schedule that raises (``StepLR step_size 0`` divides by zero), is
    refused in one line naming the schedule's options, where it would otherwise train backwards or fail mid-run."""
    scheduler, optimizer = _plain(scheduler), _plain(optimizer)
    if not isinstance(scheduler, dict) or "class_path" not in scheduler:
        return
    import torch

    option = "--model.lr_scheduler"
    param = [torch.nn.Parameter(torch.zeros(1))]
    if isinstance(optimizer, dict) and "class_path" in optimizer:
        module, _, name = optimizer["class_path"].rpartition(".")
        args = {k: v for k, v in (optimizer.get("init_args") or {}).items() if k not in _DEVICE_ARGS}
        trial = getattr(importlib.import_module(module), name)(param, **args)
    else:
        trial = torch.optim.AdamW(param)
    module, _, name = scheduler["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    max_steps = trainer.get("max_steps")
    steps = min(max_steps, SCHEDULE_STEPS) if is_number(max_steps) and max_steps > 0 else SCHEDULE_STEPS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "step() before optimizer.step()": nothing trains here
        try:
            schedule = cls(trial, **(scheduler.get("init_args") or {}))
            for step in range(steps + 1):
                rates = [group["lr"] for group in trial.param_groups]
                bad = [r for r in rates if not (isinstance(r, (int, float)) and math.isfinite(r) and r >= 0)]
                if bad:
                    raise UserError(
                        f"{option}: {scheduler['class_path']} {scheduler.get('init_args') or {}} sets the learning "
                        f"rate to {bad[0]} at optimizer step {step}; a rate must stay finite and >= 0 over the run's "
                        f"{steps} steps: fix the schedule's arguments"
                    )
                if step < steps:
                    schedule.step()
        except (ValueError, TypeError, ZeroDivisionError, OverflowError) as err:
            raise UserError(
                f"{option}: {scheduler['class_path']} {scheduler.get('init_args') or {}} fails: "
                f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}; fix the "
                "schedule's arguments"
            ) from err


# ------------------------------------------------------------------------ the adapter
#: adapter arguments checked by name before the model is built (the family's finer rules, e.g. a resolution's
#: multiple of its VAE and patch, are checked when it is built): the test and what it wants
_ADAPTER_RULES = {
    "num_steps": (lambda v: v >= 1 and v == int(v), "a whole number >= 1"),
    "decode_batch_size": (lambda v: v >= 1 and v == int(v), "a whole number >= 1"),
    "guidance_scale": (lambda v: 0 <= v <= 100, "in [0, 100] (<= 1 turns classifier-free guidance off)"),  # 1e226: NaN
    "noise_level": (lambda v: v > 0, "> 0 (the SDE steps' noise; 0 samples nothing to learn from)"),
    "resolution": (lambda v: v >= 8 and v % 8 == 0, "a multiple of 8 (every family's VAE downsamples by 8), >= 8"),
    "num_frames": (lambda v: v >= 1 and v == int(v), "a whole number >= 1"),
}


def check_adapter_arguments(adapter: Any) -> None:
    """Refuse an adapter argument outside its range in one line naming the option, before the weights load."""
    adapter = _plain(adapter)
    if not isinstance(adapter, dict):
        return
    for name, value in (adapter.get("init_args") or {}).items():
        rule = _ADAPTER_RULES.get(name)
        if rule is not None and is_number(value) and not rule[0](value):
            raise UserError(f"--model.adapter.init_args.{name} must be {rule[1]}, got {value}")


# ------------------------------------------------------------------------ the rewards' loaders
def check_reward_arguments(names: list[str], kwargs: dict[str, dict[str, Any]]) -> None:
    """Refuse ``--model.reward_kwargs`` that a reward's loader does not take, lacks, or that are
    not of the type and range the loader declares (:func:`~lit_treegrpo.common.values.check_arguments`),
    in one line naming the argument: otherwise a ``TypeError`` once the policy has loaded."""
    for name in names:
        _check_loader_arguments(name, kwargs.get(name), f"--model.reward_kwargs.{name}")


def _check_loader_arguments(name: str, given: Any, option: str) -> None:
    """The arguments ``given`` to the loader of reward ``name`` (see :func:`check_reward_arguments`);
    a reward that builds another by name (``frame_average``'s ``image``) has that one's checked too."""
    loader = REWARDS[name]
    given = {} if given is None else given
    if not isinstance(given, dict):
        raise UserError(f"{option}: give a mapping of {name}'s arguments, got {given!r}")
    params = inspect.signature(loader).parameters
    takes = [p for p, v in params.items() if v.kind in (v.POSITIONAL_OR_KEYWORD, v.KEYWORD_ONLY)]
    if not any(v.kind is v.VAR_KEYWORD for v in params.values()):
        for key in given:
            if key not in takes:
                close = difflib.get_close_matches(key, takes, n=1, cutoff=0.6)
                hint = f"did you mean {close[0]}? " if close else ""
                raise UserError(
                    f"{option}.{key}: reward {name!r} takes no argument {key!r}; {hint}it takes {', '.join(takes)}"
                )
    missing = [p for p in takes if params[p].default is inspect.Parameter.empty and p not in given]
    if missing:
        raise UserError(
            f"{option}.{missing[0]}: reward {name!r} needs it; "
            f"give it, e.g. --model.reward_kwargs '{{{name}: {{{missing[0]}: ...}}}}'"
        )
    try:
        check_arguments(loader, given, option)
    except ValueError as err:
        raise UserError(str(err)) from err
    nested = getattr(getattr(loader, "__self__", loader), "nested_reward", None)
    if nested is not None:  # (the argument naming the reward, the argument holding its loader's)
        inner = given.get(nested[0], params[nested[0]].default)
        if isinstance(inner, str):
            try:
                check_reward_names(inner, {})
            except (ValueError, ImportError) as err:
                raise UserError(f"{option}.{nested[0]}: {err}") from err
            _check_loader_arguments(inner, given.get(nested[1]), f"{option}.{nested[1]}")


def adapter_config(model: Any) -> dict[str, Any] | None:
    """The adapter's ``init_args`` as configured, less the memory knobs a resume may change
    (:data:`~lit_treegrpo.training.resume.ADAPTER_MEMORY_OPTIONS`): what a checkpoint records of them
    (``TreeGRPOModule.adapter_config``). None when the adapter is no ``class_path`` spec."""
    adapter = model.get("adapter")
    if not isinstance(adapter, Namespace) or "init_args" not in adapter:
        return None
    args = _plain(adapter.get("init_args")) or {}
    return {k: plain(v) for k, v in args.items() if k not in ADAPTER_MEMORY_OPTIONS}


def configured_fingerprint(config: Any) -> dict[str, Any]:
    """What the options alone say of a resume's fingerprint (:func:`lit_treegrpo.training.resume.fingerprint`:
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
    tree = TreeSpec.from_dict(_plain(model["tree"]))
    found["tree"] = asdict(tree if "num_steps" not in found else tree.with_num_steps(found["num_steps"]))
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


def check_resume_options(config: Any, checkpoint: Mapping[str, Any], ckpt_path: str, *, fitting: bool = True) -> None:
    """A fit that resumes ``checkpoint`` (read from ``ckpt_path`` once, before any model loads), or another command
    that loads it (not ``fitting``): refuse an option it may not change
    (:func:`lit_treegrpo.training.resume.check_resumable`; ``ValueError``, one line, with the fix for that command)."""
    saved = fingerprint_of(checkpoint)
    if saved is not None:
        check_resumable(
            saved, configured_fingerprint(config), None, fitting=fitting, where=f"the checkpoint {ckpt_path}"
        )
