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


#: TreeSpec fields that bound memory (how many rows per model call, how many leaves a config may
#: ask for) without changing the tree a run samples: a resume may change them
MEMORY_FIELDS = ("max_batch", "max_leaves")


def _shape(tree: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in tree.items() if k not in MEMORY_FIELDS}


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
    # rebuilt, so that a checkpoint from before a TreeSpec field existed reads it at its default;
    # the memory knobs are left out: lowering max_batch is the memory guard's own advice
    if _shape(asdict(TreeSpec.from_dict(saved["tree"]))) != _shape(mine["tree"]):
        raise ValueError(
            f"the checkpoint was trained with tree {saved['tree']}, this run has "
            f"{mine['tree']}; resume with the same --model.tree"
        )
    missing = set(mine["trainable"]) - set(mine["trainable"] if state_dict is None else state_dict)
    if missing:
        raise ValueError(f"the checkpoint lacks {len(missing)} trainable tensors, e.g. {sorted(missing)[:3]}")
