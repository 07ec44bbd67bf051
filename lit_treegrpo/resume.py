"""What a checkpoint's ``lit_treegrpo`` entry records about the run that wrote it, and the checks
that refuse resuming it with another configuration.

The entry holds ``iteration`` (completed training steps), ``fingerprint`` (:func:`fingerprint`) and
``faults`` (:meth:`lit_treegrpo.faults.FaultLedger.state_dict`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any

from .core.spec import TreeSpec


def fingerprint(adapter_type: str, num_steps: int, tree: TreeSpec, trainable: Iterable[str]) -> dict[str, Any]:
    """What a resumed run must share with the one that wrote the checkpoint: the adapter class,
    its number of steps, the tree, and the names of the trainable parameters."""
    return {
        "adapter": adapter_type,
        "num_steps": num_steps,
        "tree": asdict(tree),
        "trainable": sorted(trainable),
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


def check_resumable(saved: Mapping[str, Any], mine: Mapping[str, Any], state_dict: Mapping[str, Any] | None) -> None:
    """Raise ``ValueError`` when the checkpoint's fingerprint ``saved`` differs from this run's
    ``mine``, or its ``state_dict`` lacks a trainable tensor (None: a sharded strategy loads the
    weights itself)."""
    for key in ("adapter", "num_steps", "trainable"):
        if saved[key] != mine[key]:
            raise ValueError(
                f"the checkpoint's {key} differs from this run's configuration; resume with the "
                f"configuration it was trained with"
            )
    if _saved_tree(saved["tree"], mine["tree"]) != dict(mine["tree"]):
        raise ValueError(
            f"the checkpoint was trained with tree {saved['tree']}, this run has "
            f"{mine['tree']}; resume with the same --model.tree"
        )
    missing = set(mine["trainable"]) - set(mine["trainable"] if state_dict is None else state_dict)
    if missing:
        raise ValueError(f"the checkpoint lacks {len(missing)} trainable tensors, e.g. {sorted(missing)[:3]}")
