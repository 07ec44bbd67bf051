"""lit_treegrpo: tree-structured GRPO (TreeGRPO, BranchGRPO) for diffusion and flow models.

One folder per concern, each ``__init__`` saying what lives there and what it may import:

- :mod:`.core`: the engine, pure torch (steps, tree spec, rollout, advantages, pruning, loss,
  memory arithmetic).
- :mod:`.models`: the model families behind one adapter interface; :mod:`.rewards`: the reward
  models behind one reward interface, and their registry; :mod:`.shapes`: the Shapes world.
- The Lightning layer: :mod:`.training` (the module and its policies), :mod:`.data` (prompts),
  ``lit_treegrpo.callbacks`` (the callbacks, from the repository's top-level ``callbacks/``),
  :mod:`.runs` (run folders, checkpoints, export) and :mod:`.cli` (the command line).
- :mod:`.common`: error messages and hub look-ups that every layer uses.

Importing the package is cheap: it imports none of them. ``lit_treegrpo.TreeGRPOModule``,
``lit_treegrpo.PromptDataModule``, ``lit_treegrpo.TreeGRPOCLI`` and ``lit_treegrpo.main`` are
imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: the public names, imported from their modules on first use (so that ``import lit_treegrpo.core``
#: never pulls in Lightning)
_PUBLIC = {
    "TreeGRPOModule": "lit_treegrpo.training.module",
    "PromptDataModule": "lit_treegrpo.data.datamodule",
    "TreeGRPOCLI": "lit_treegrpo.cli.app",
    "main": "lit_treegrpo.cli.app",
}

__all__ = ["PromptDataModule", "TreeGRPOCLI", "TreeGRPOModule", "__version__", "main"]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'lit_treegrpo' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
