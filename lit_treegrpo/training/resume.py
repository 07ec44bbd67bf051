"""What a checkpoint's ``lit_treegrpo`` entry records about the run that wrote it, and the rules of
a resume: which options it may change (docs/configs.md, "Resume rules")."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

import torch

from ..core.spec import TreeSpec

#: how every refusal of a resumed fit ends: the two ways to start over instead of resuming
NEW_RUN = "start a new run (--overwrite true or another --trainer.default_root_dir)"
#: the fix for validate / test / predict / export, which load the weights into the configured model
OTHER_RUN = "give the --model.adapter and LoRA settings the run was trained with (its --config), or another --ckpt_path"

#: adapter options that bound memory or speed only (what the model computes does not change, up to
#: float rounding for the last two): a resume may change them, as ``--model.rollout``
ADAPTER_MEMORY_OPTIONS = ("gradient_checkpointing", "decode_batch_size", "compile", "channels_last")

#: (fingerprint key, the option it records, compared by field (True) or as one value (False),
#: compared for every command (True) or only when a fit resumes (False)), in the order
#: :func:`check_resumable` compares them: :data:`FIELDS`, the trainable tensors, the tree,
#: :data:`LATER_FIELDS`. A resumed fit may change none of them; validate / test / predict / export
#: only need the weights to fit the model, and may evaluate them with another reward, guidance ...
FIELDS: tuple[tuple[str, str, bool, bool], ...] = (
    ("adapter", "--model.adapter", False, True),
    ("adapter_config", "--model.adapter.init_args", True, False),
    ("num_steps", "--model.adapter.init_args.num_steps", False, True),
    ("lora", "--model.adapter.init_args.lora", True, False),
    ("adapter_options", "--model.adapter.init_args", True, False),
)
LATER_FIELDS: tuple[tuple[str, str, bool, bool], ...] = (
    ("reward", "--model.reward", False, False),
    ("reward_kwargs", "--model.reward_kwargs", False, False),
    ("advantage", "--model.advantage", True, False),
    ("loss", "--model.loss", True, False),
    ("seed", "--model.seed", False, False),
    ("optimizer", "--model.optimizer", False, False),
)


def plain(value: Any) -> Any:
    """``value`` as the plain types a checkpoint stores and ``torch.load(weights_only=True)``
    reads back: dataclasses as dicts, tuples as lists, paths and other objects as text."""
    if is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items() if not str(k).startswith("__")}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def show(value: Any) -> str:
    """A value as it is written on the command line or in a config (``null``, ``true``, ``[1, 2]``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return str(value)


def refusal(option: str, where: str, saved: Any, mine: Any, *, fitting: bool = True) -> ValueError:
    """The one-line refusal of a resume (``fitting``; else of another command loading the
    checkpoint) that changes ``option`` from ``saved`` to ``mine``, with that command's fix."""
    fix = f"resume with {show(saved)}, or {NEW_RUN}" if fitting else f"give {option} {show(saved)} as the run did"
    return ValueError(f"{option}: {where} was trained with {show(saved)}, this run has {show(mine)}; {fix}")


def reward_record(reward: Any) -> Any:
    """The reward as configured: a registered name, a name -> weight mapping, or the class of a
    ready reward model (a ``class_path`` spec from a config names the same class)."""
    if isinstance(reward, str):
        return reward
    if isinstance(reward, Mapping) and "class_path" in reward:
        return str(reward["class_path"]).rpartition(".")[2]
    if isinstance(reward, Mapping):
        return {str(k): float(v) for k, v in reward.items()}
    return type(reward).__name__


#: init options that objects keep under another attribute name (ClippedPolicyLoss: clip_range is
#: its ``clip_low``, clip_range_high its ``clip_high``, resolved)
RENAMED_OPTIONS = {"clip_range": "clip_low", "clip_range_high": "clip_high"}


def init_options(obj: Any, skip: Iterable[str] = ()) -> dict[str, Any]:
    """The init options of ``obj`` that it keeps as attributes (of the same name, or the one :data:`RENAMED_OPTIONS`
    gives), as plain values, following ``**kwargs`` up its bases: what it was built with, as far as it can tell."""
    found: dict[str, Any] = {}
    for base in type(obj).__mro__:
        if "__init__" not in vars(base):
            continue
        params = inspect.signature(base.__init__).parameters.values()
        for p in params:
            if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in skip:
                continue
            name = p.name if p.name in vars(obj) else RENAMED_OPTIONS.get(p.name)
            if name not in vars(obj):  # not kept (a path a model was loaded from ...)
                continue
            value = vars(obj)[name]
            if value is None or is_dataclass(value) or isinstance(value, (bool, int, float, str, tuple, list)):
                found.setdefault(p.name, plain(value))
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return found


def class_record(obj: Any, skip: Iterable[str] = ()) -> dict[str, Any]:
    """``{class_path, init_args}`` of a built object (a loss), as a config would spell it."""
    cls = type(obj)
    return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": init_options(obj, skip)}


def fingerprint(
    adapter_type: str,
    num_steps: int,
    tree: TreeSpec,
    trainable: Iterable[str] | Mapping[str, Iterable[int]],
    **recorded: Any,
) -> dict[str, Any]:
    """What a resumed run must share with the one that wrote the checkpoint: the adapter class, its number of steps,
    the tree, the trainable parameters (names; with their shapes when given as name -> shape), and the ``recorded``
    fields of :data:`FIELDS` / :data:`LATER_FIELDS` (``lora``, ``adapter_options``, ``adapter_config``, ``reward``,
    ``reward_kwargs``, ``advantage``, ``loss``, ``seed``, ``optimizer``) as plain values."""
    record = {
        "adapter": adapter_type,
        "num_steps": num_steps,
        "tree": asdict(tree),
        "trainable": sorted(trainable),
    }
    if isinstance(trainable, Mapping):
        record["shapes"] = {name: [int(d) for d in shape] for name, shape in sorted(trainable.items())}
    return {**record, **{key: plain(value) for key, value in recorded.items()}}


#: fields that older checkpoints recorded in their tree but that now belong to ``RolloutLimits``
#: (how many rows per model call, how many leaves a config may ask for): not part of the tree a run
#: samples, so a resume may change them (lowering max_batch is the memory guard's own advice)
MEMORY_FIELDS = ("max_batch", "max_leaves")


def _saved_tree(saved: Mapping[str, Any], mine: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint's tree, rebuilt so that a field it predates reads at its default; a
    checkpoint from before ``shared_noise`` joined the tree (it was a module option then, not
    recorded) is compared with this run's value, as nothing says otherwise."""
    fields = {k: v for k, v in saved.items() if k not in MEMORY_FIELDS}
    if "shared_noise" not in fields:
        fields["shared_noise"] = mine.get("shared_noise", False)
    return asdict(TreeSpec.from_dict(fields))


def _difference(saved: Any, mine: Any, option: str, by_field: bool) -> tuple[str, Any, Any] | None:
    """The first option (dotted below ``option``) whose value differs, with both values."""
    if by_field and isinstance(saved, Mapping) and isinstance(mine, Mapping):
        for key in saved:
            if key in mine:
                found = _difference(saved[key], mine[key], f"{option}.{key}", by_field)
                if found is not None:
                    return found
        return None
    return None if plain(saved) == plain(mine) else (option, saved, mine)


def check_resumable(
    saved: Mapping[str, Any],
    mine: Mapping[str, Any],
    state_dict: Mapping[str, Any] | None,
    *,
    fitting: bool = True,
    where: str = "the checkpoint",
) -> None:
    """Raise ``ValueError`` (one line: the option, the checkpoint's value, the fix) when this run's fingerprint
    ``mine`` differs from the checkpoint's ``saved`` in what the weights depend on, or, when ``fitting`` (a resumed
    fit), in what shaped them (see :data:`FIELDS`)."""
    for row in FIELDS:
        _compare(saved, mine, row, where, fitting)
    if "trainable" in mine:
        _check_trainable(saved, mine, state_dict, where, fitting)
    if "tree" in mine:
        found = _difference(_saved_tree(saved["tree"], mine["tree"]), mine["tree"], "--model.tree", True)
        if found is not None:
            raise refusal(found[0], where, *found[1:], fitting=fitting)
    for row in LATER_FIELDS:
        _compare(saved, mine, row, where, fitting)
    if state_dict is not None and "trainable" in mine:
        missing = set(mine["trainable"]) - set(state_dict)
        if missing:
            raise ValueError(f"{where} lacks {len(missing)} trainable tensors, e.g. {sorted(missing)[:3]}")


def _compare(saved: Mapping[str, Any], mine: Mapping[str, Any], row: tuple, where: str, fitting: bool) -> None:
    key, option, by_field, always = row  # of FIELDS
    if not (always or fitting) or key not in saved or key not in mine:
        return
    found = _difference(saved[key], mine[key], option, by_field)
    if found is not None:
        raise refusal(found[0], where, *found[1:], fitting=fitting)


def _check_trainable(
    saved: Mapping[str, Any], mine: Mapping[str, Any], state_dict: Any, where: str, fitting: bool
) -> None:
    """The same trainable tensors, by name and shape, before ``load_state_dict`` would fail on
    them with a traceback (a LoRA of another rank: a size mismatch)."""
    fix = f"resume with the adapter and LoRA settings it was trained with, or {NEW_RUN}" if fitting else OTHER_RUN
    if saved["trainable"] != mine["trainable"]:
        only_saved = sorted(set(saved["trainable"]) - set(mine["trainable"]))
        only_mine = sorted(set(mine["trainable"]) - set(saved["trainable"]))
        example = f"{only_saved[0]} only in the checkpoint" if only_saved else f"{only_mine[0]} only in this run"
        raise ValueError(
            f"--model.adapter: {where} trained {len(saved['trainable'])} tensors, this run trains "
            f"{len(mine['trainable'])} ({len(only_saved) + len(only_mine)} differ, e.g. {example}); {fix}"
        )
    if state_dict is not None:
        theirs = {name: list(state_dict[name].shape) for name in saved["trainable"] if name in state_dict}
    else:
        theirs = saved.get("shapes", {})
    for name, shape in mine.get("shapes", {}).items():
        if name in theirs and list(theirs[name]) != list(shape):
            rank = _lora_rank(name, theirs[name]), _lora_rank(name, shape)
            if None not in rank:
                raise refusal("--model.adapter.init_args.lora.rank", where, *rank, fitting=fitting)
            raise ValueError(
                f"--model.adapter: the trainable tensor {name} has shape {show(theirs[name])} in {where} and "
                f"{show(shape)} in this run; {fix}"
            )


def _lora_rank(name: str, shape: Iterable[int]) -> int | None:
    """The LoRA rank a peft weight's shape says: ``lora_A`` is [r, in], ``lora_B`` [out, r]."""
    dims = list(shape)
    if ".lora_A." in name and len(dims) >= 2:
        return int(dims[0])
    if ".lora_B." in name and len(dims) >= 2:
        return int(dims[1])
    return None


def fingerprint_of(checkpoint: Mapping[str, Any]) -> dict[str, Any] | None:
    """The fingerprint a checkpoint (already read, safely and once) records (None: it has none)."""
    entry = checkpoint.get("lit_treegrpo") if isinstance(checkpoint, Mapping) else None
    return entry.get("fingerprint") if isinstance(entry, Mapping) else None


# ---------------------------------------------------------------------------------- tunable options
#: the options a resume may change that the module records (``settings``), by their option names
SETTINGS_OPTIONS = {
    "minibatches": "--model.minibatches",
    "edges_per_update": "--model.edges_per_update",
    "accumulate": "--model.accumulate",
    "inner_epochs": "--model.inner_epochs",
    "grad_clip": "--model.grad_clip",
    "val_samples": "--model.val_samples",
    "rollout": "--model.rollout",
    "faults": "--model.faults",
    "memory_guard": "--model.memory_guard",
    "work_limit": "--model.work_limit",
    "compute_cost": "--model.compute_cost",
    "global_batch_size": "prompts per training step (--data.batch_size x processes)",
}


def changed_settings(saved: Mapping[str, Any] | None, mine: Mapping[str, Any]) -> list[str]:
    """``--model.minibatches 2 (the checkpoint trained with 1)`` for each recorded setting this
    resumed run changes (none for a checkpoint that recorded no settings)."""
    changes = []
    for key, option in SETTINGS_OPTIONS.items():
        if saved is None or key not in saved or key not in mine:
            continue
        old, new = plain(saved[key]), plain(mine[key])
        if isinstance(old, dict) and isinstance(new, dict):
            pairs = [(f"{option}.{k}", old[k], new[k]) for k in old if k in new and old[k] != new[k]]
        else:
            pairs = [(option, old, new)] if old != new else []
        changes += [f"{name} {show(b)} (the checkpoint trained with {show(a)})" for name, a, b in pairs]
    return changes


#: what a scheduler's state says about where the run is (restored from the checkpoint); the rest of
#: its state is its settings (this run's). ``_schedulers``: the inner schedules of a SequentialLR /
#: ChainedScheduler, restored whole
SCHEDULER_POSITION = (
    "last_epoch",
    "_step_count",
    "_last_lr",
    "_is_initial",
    "_get_lr_called_within_step",
    "_schedulers",
)
#: param-group entries that are no optimizer option
GROUP_BOOKKEEPING = ("params", "param_names", "initial_lr")


@dataclass
class ConfiguredOptimizer:
    """This run's optimizer and LR scheduler options, as built (before any checkpoint restores
    state into them); see :meth:`TreeGRPOModule.configure_optimizers`."""

    groups: list[dict[str, Any]]
    """Each param group's options (lr, weight_decay, betas ...) before a scheduler touched them."""
    scheduler: str | None = None
    """The scheduler's class name."""
    scheduler_state: dict[str, Any] = field(default_factory=dict)
    """The scheduler's state as built: its settings, and its start (last_epoch 0)."""
    scheduler_lrs: list[float] = field(default_factory=list)
    """The groups' learning rates the scheduler set when it was built (its first step's)."""

    @classmethod
    def record(cls, optimizer: torch.optim.Optimizer) -> ConfiguredOptimizer:
        groups = optimizer.param_groups
        return cls([{k: copy.deepcopy(v) for k, v in g.items() if k not in GROUP_BOOKKEEPING} for g in groups])

    def add_scheduler(self, scheduler: Any) -> None:
        self.scheduler = type(scheduler).__name__
        self.scheduler_state = copy.deepcopy(scheduler.state_dict())
        self.scheduler_lrs = [g["lr"] for g in scheduler.optimizer.param_groups]

    def replace_foreign_state(self, saved_scheduler: str | None, states: list[Any] | None) -> None:
        """Before Lightning restores the checkpoint's scheduler ``states`` (the checkpoint's list,
        which Lightning loads later): a scheduler of another class than the checkpoint's
        ``saved_scheduler`` gets its own fresh state instead (another class's state would fail to
        load, or bring foreign settings), so that it starts at this resume."""
        if self.scheduler is not None and saved_scheduler not in (None, self.scheduler) and states:
            states[0] = copy.deepcopy(self.scheduler_state)


def apply_optimizer_options(
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    mine: ConfiguredOptimizer,
    saved_scheduler: str | None,
    scheduler_restored: bool,
) -> list[str]:
    """After Lightning restored a checkpoint's optimizer (and scheduler) state into this run's: every option of this
    run's optimizer wins over the restored param groups; the learning rate is this run's (with a scheduler: its base
    lr, the schedule's position kept and the current lr scaled by new / old base)."""
    restart = scheduler is not None and (
        not scheduler_restored or (saved_scheduler is not None and saved_scheduler != mine.scheduler)
    )
    changes: list[str] = []
    for i, (group, options) in enumerate(zip(optimizer.param_groups, mine.groups)):
        old_base, new_base = group.get("initial_lr", group["lr"]), options["lr"]
        for key, value in options.items():
            if key == "lr":
                continue
            if key in group and plain(group[key]) != plain(value):
                changes.append(f"{key} {show(value)} (the checkpoint trained with {show(group[key])})")
            group[key] = value
        if old_base != new_base:
            changes.append(f"lr {show(new_base)} (the checkpoint trained at {show(old_base)})")
        if scheduler is None:
            group["lr"] = new_base
            group.pop("initial_lr", None)
        elif restart:
            group["lr"], group["initial_lr"] = mine.scheduler_lrs[i], new_base
        else:
            group["lr"] = group["lr"] * new_base / old_base if old_base else new_base
            group["initial_lr"] = new_base
    if scheduler is None:
        if saved_scheduler is not None or scheduler_restored:
            changes.append(
                f"no lr scheduler (the checkpoint had {saved_scheduler or 'one'}): the lr stays at its value"
            )
    elif restart:  # (replace_foreign_state kept another class's state out)
        scheduler.load_state_dict(copy.deepcopy(mine.scheduler_state))
        had = "none" if not scheduler_restored else saved_scheduler
        changes.append(f"lr scheduler {mine.scheduler} from this resume on (the checkpoint had {had})")
    else:
        restored = scheduler.state_dict()
        settings = {k: v for k, v in mine.scheduler_state.items() if k not in SCHEDULER_POSITION}
        for key, value in settings.items():
            if key not in ("base_lrs", "lr_lambdas") and key in restored and plain(restored[key]) != plain(value):
                changes.append(
                    f"{mine.scheduler} {key} {show(value)} (the checkpoint trained with {show(restored[key])})"
                )
        scheduler.load_state_dict({**restored, **copy.deepcopy(settings)})
        bases = [g["initial_lr"] for g in optimizer.param_groups]
        for inner in (scheduler, *getattr(scheduler, "_schedulers", ())):
            if hasattr(inner, "base_lrs"):
                inner.base_lrs = list(bases)
        scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
    return list(dict.fromkeys(changes))  # once, however many groups share it
