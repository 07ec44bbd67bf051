"""lit_treegrpo: tree-structured GRPO (TreeGRPO, BranchGRPO) for diffusion and flow models.

One folder per concern, each ``__init__`` saying what lives there and what it may import:

- :mod:`.core`: the engine, pure torch (steps, tree spec, rollout, advantages, pruning, loss,
  memory arithmetic).
- :mod:`.models`: the model families behind one adapter interface; :mod:`.rewards`: the reward
  models behind one reward interface, and their registry; :mod:`.shapes`: the Shapes world.
- The Lightning layer: :mod:`.training` (the module and its policies), :mod:`.data` (prompts),
  ``lit_treegrpo.callbacks`` (the callbacks, from the repository's top-level ``callbacks/``),
  :mod:`.artifacts` (run folders, checkpoints, export) and :mod:`.cli` (the command line).
- :mod:`.common`: error messages and hub look-ups that every layer uses.

Importing the package is cheap: it imports none of them. It installs one logging filter, so that
no Trainer the project builds (the command line, the notebook's, the Shapes pre-training, a script's)
prints Lightning's advertisement for its cloud logger ("Tip: For seamless cloud logging ...
litlogger"); every other line of those loggers is kept. ``lit_treegrpo.TreeGRPOModule``,
``lit_treegrpo.PromptDataModule``, ``lit_treegrpo.TreeGRPOCLI`` and ``lit_treegrpo.main`` are
imported on first use.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

__version__ = "0.1.0"

#: the loggers Lightning prints its advertisement through (its ``rank_zero`` module's, which each of
#: its packages replaces with its own on import), and the text only that message holds
VENDOR_TIP_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "lightning_utilities.core.rank_zero",
)
VENDOR_TIP = "try installing [litlogger]"


def _no_vendor_tip(record: logging.LogRecord) -> bool:
    return VENDOR_TIP not in record.getMessage()


for _name in VENDOR_TIP_LOGGERS:
    logging.getLogger(_name).addFilter(_no_vendor_tip)

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
