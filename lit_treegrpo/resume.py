"""What a checkpoint's ``lit_treegrpo`` entry records about the run that wrote it, and the checks
that refuse resuming it with another configuration.

The entry holds ``iteration`` (completed training steps), ``fingerprint`` (:func:`fingerprint`) and
``faults`` (:meth:`lit_treegrpo.faults.FaultLedger.state_dict`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any, Callable

import torch

from .core.spec import TreeSpec


def fingerprint(
    adapter_type: str,
    num_steps: int,
    tree: TreeSpec,
    trainable: Mapping[str, Sequence[int]],
    *,
    lora: Mapping[str, Any] | None = None,
    reward: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What a resumed run must share with the one that wrote the checkpoint, because it shapes the
    weights or what they were trained for: the adapter class, its number of steps, the tree, the
    trainable parameters (names and shapes: a LoRA rank or target change shows here), the LoRA
    settings (rank, alpha, targets, ...) and the reward (names, weights and loader arguments)."""
    return {
        "adapter": adapter_type,
        "num_steps": num_steps,
        "tree": asdict(tree),
        "trainable": sorted(trainable),
        "shapes": {name: list(shape) for name, shape in sorted(trainable.items())},
        "lora": None if lora is None else dict(lora),
        "reward": None if reward is None else dict(reward),
    }


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


#: the option behind each recorded field, as a user would pass it
OPTION = {
    "adapter": "--model.adapter.class_path",
    "num_steps": "--model.adapter.init_args.num_steps",
    "tree": "--model.tree",
    "lora": "--model.adapter.init_args.lora",
    "reward": "--model.reward / --model.reward_kwargs",
}
_NEW_RUN = "start a new run instead (another --trainer.default_root_dir, or --overwrite true)"


class ResumeMismatchError(ValueError):
    """A resume changes an option that shapes the weights (one line: the option, both values, the fix)."""


def _refuse(option: str, saved: Any, mine: Any) -> ResumeMismatchError:
    return ResumeMismatchError(
        f"{option}: the checkpoint was trained with {saved}, this run has {mine}; resume with {saved}, or {_NEW_RUN}"
    )


def _lora_difference(saved: Mapping[str, Any] | None, mine: Mapping[str, Any] | None) -> ResumeMismatchError | None:
    if saved == mine:
        return None
    if saved is None or mine is None:
        return _refuse(OPTION["lora"], saved or "full fine-tuning (no lora)", mine or "full fine-tuning (no lora)")
    for key in sorted(set(saved) | set(mine)):
        if saved.get(key) != mine.get(key):
            return _refuse(f"{OPTION['lora']}.{key}", saved.get(key), mine.get(key))
    return None


def check_resumable(saved: Mapping[str, Any], mine: Mapping[str, Any], state_dict: Mapping[str, Any] | None) -> None:
    """Raise :class:`ResumeMismatchError` (a ``ValueError``) naming the option when the checkpoint's
    fingerprint ``saved`` differs from this run's ``mine`` in anything that shapes the weights, or
    its ``state_dict`` lacks a trainable tensor (None: a sharded strategy loads the weights itself).
    Fields an older checkpoint did not record (``shapes``, ``lora``, ``reward``) are not compared."""
    for key in ("adapter", "num_steps"):
        if saved[key] != mine[key]:
            raise _refuse(OPTION[key], saved[key], mine[key])
    if _saved_tree(saved["tree"], mine["tree"]) != dict(mine["tree"]):
        raise _refuse(OPTION["tree"], saved["tree"], dict(mine["tree"]))
    if "lora" in saved:
        lora = _lora_difference(saved["lora"], mine["lora"])
        if lora is not None:
            raise lora
    if "reward" in saved and saved["reward"] != mine["reward"]:
        raise _refuse(OPTION["reward"], saved["reward"], mine["reward"])
    if saved["trainable"] != mine["trainable"]:
        ours, theirs = set(mine["trainable"]), set(saved["trainable"])
        example = sorted(ours ^ theirs)[:2]
        raise ResumeMismatchError(
            f"the checkpoint trains {len(theirs)} tensors, this run {len(ours)} ({len(ours ^ theirs)} differ, e.g. "
            f"{example}): the adapter's trainable parameters changed (--model.adapter.init_args.lora or the "
            f"adapter's options); resume with the configuration it was trained with, or {_NEW_RUN}"
        )
    shapes = saved.get("shapes")
    if shapes is not None:
        changed = [n for n in mine["shapes"] if list(shapes.get(n, [])) != list(mine["shapes"][n])]
        if changed:
            name = changed[0]
            raise ResumeMismatchError(
                f"{OPTION['lora']}: the checkpoint's {name} has shape {list(shapes[name])}, this run's "
                f"{list(mine['shapes'][name])} ({len(changed)} tensors differ): the LoRA rank or the model changed; "
                f"resume with the configuration it was trained with, or {_NEW_RUN}"
            )
    missing = set(mine["trainable"]) - set(mine["trainable"] if state_dict is None else state_dict)
    if missing:
        raise ValueError(f"the checkpoint lacks {len(missing)} trainable tensors, e.g. {sorted(missing)[:3]}")


#: a learning-rate scheduler's progress, which a resume continues (every other plain field of its
#: state is a constructor argument, which this run's configuration sets)
SCHEDULER_PROGRESS = frozenset({"last_epoch", "_step_count", "_last_lr", "base_lrs", "_get_lr_called_within_step",
                                "_is_initial", "verbose"})  # fmt: skip


def _plain(value: Any) -> bool:
    """A value a config sets and ``==`` compares: numbers, strings, booleans, None, tuples of them."""
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def retune(
    checkpoint: dict[str, Any],
    optimizer_group: Mapping[str, Any],
    scheduler_state: Mapping[str, Any] | None,
) -> list[str]:
    """Apply this run's optimizer and scheduler options to a checkpoint's optimizer and scheduler
    states before Lightning restores them, and return one ``"option: old -> new"`` line per change.

    Restoring an optimizer's state would otherwise bring back the checkpoint's hyper-parameters
    (its learning rate, weight decay, betas ...) whatever the resumed run was configured with, and
    a scheduler's state its constructor arguments and base rates. ``optimizer_group`` is a param
    group of this run's optimizer as configured (before any scheduler touched it), ``scheduler_state``
    the ``state_dict`` of this run's scheduler built on it (None: no scheduler). A scheduled rate
    keeps its place in the schedule: the group's rate is scaled by new over old base rate."""
    changes: dict[str, str] = {}
    optimizers = checkpoint.get("optimizer_states") or []
    for state in optimizers:
        for group in state.get("param_groups", []):
            for key, new in optimizer_group.items():
                if key in ("params", "initial_lr") or not _plain(new) or key not in group:
                    continue
                if key == "lr" and "initial_lr" in group:  # scheduled: compare base rates
                    old = group["initial_lr"]
                    if old != new:
                        group["lr"] = group["lr"] * new / old if old else new
                        group["initial_lr"] = new
                        changes["--model.optimizer.init_args.lr"] = f"{old:g} -> {new:g}"
                    continue
                old = group[key]
                if old != new and _plain(old):
                    group[key] = type(old)(new) if isinstance(old, (tuple, list)) else new
                    changes[f"--model.optimizer.init_args.{key}"] = f"{old} -> {new}"
    for state in checkpoint.get("lr_schedulers") or []:
        if scheduler_state is None:
            continue
        for key, new in scheduler_state.items():
            if key in SCHEDULER_PROGRESS or key not in state or not _plain(new) or not _plain(state[key]):
                continue
            if state[key] != new:
                changes[f"--model.lr_scheduler.init_args.{key.lstrip('_')}"] = f"{state[key]} -> {new}"
                state[key] = new
        base = optimizer_group.get("lr")
        if "base_lrs" in state and base is not None and any(b != base for b in state["base_lrs"]):
            old_base = state["base_lrs"]
            state["base_lrs"] = [base for _ in old_base]
            if "_last_lr" in state:
                state["_last_lr"] = [last * base / b if b else base for last, b in zip(state["_last_lr"], old_base)]
    return [f"{option} {change}" for option, change in changes.items()]


def configured_options(
    make_optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
    make_scheduler: Callable[[torch.optim.Optimizer], Any] | None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """This run's optimizer options (a param group of an optimizer built as configured, on a
    stand-in parameter, before any scheduler touched it) and its scheduler's state: what
    :func:`retune` applies over a checkpoint's."""
    optimizer = make_optimizer([torch.nn.Parameter(torch.zeros(1))])
    group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    return group, None if make_scheduler is None else make_scheduler(optimizer).state_dict()
