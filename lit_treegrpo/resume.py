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
    # rebuilt, so that a checkpoint from before a TreeSpec field existed reads it at its default
    if asdict(TreeSpec.from_dict(saved["tree"])) != mine["tree"]:
        raise ValueError(
            f"the checkpoint was trained with tree {saved['tree']}, this run has "
            f"{mine['tree']}; resume with the same --model.tree"
        )
    missing = set(mine["trainable"]) - set(mine["trainable"] if state_dict is None else state_dict)
    if missing:
        raise ValueError(f"the checkpoint lacks {len(missing)} trainable tensors, e.g. {sorted(missing)[:3]}")
