"""The Shapes testbed in one folder: a small text-to-image task where RL measurably improves prompt
following.

May import: the world, torch only; :mod:`.model`, :mod:`.reward` and :mod:`.pretrain` also
:mod:`lit_treegrpo.core`, :mod:`lit_treegrpo.common`, the model and reward base classes
(:mod:`lit_treegrpo.models`, :mod:`lit_treegrpo.rewards`), and Lightning (pre-training has its own
small LightningCLI); never the package's Lightning layer (training, data, artifacts, cli), except that the
pre-training, a command line of its own (:mod:`.pretrain`, :mod:`.pretrain_rules`), uses the main command line's
one-line errors and checks and the artifacts' folder lock. Nothing below imports this folder: ``lit_treegrpo.models.shapes`` and ``lit_treegrpo.rewards.shapes`` are
compatibility names resolved by name.
"""

from __future__ import annotations

from typing import Any

_LAZY = {"ShapesAdapter": "model", "ShapesModelConfig": "model", "ShapesReward": "reward", "ShapesAnalysis": "reward"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'lit_treegrpo.shapes' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"lit_treegrpo.shapes.{_LAZY[name]}"), name)


__all__ = ["ShapesAdapter", "ShapesAnalysis", "ShapesModelConfig", "ShapesReward"]
