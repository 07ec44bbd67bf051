"""Prompt data: where the prompts come from and how a run draws them.

May import: :mod:`lit_treegrpo.common`, torch and Lightning; never the module, the models or the
rewards.
"""

from .datamodule import PromptDataModule

__all__ = ["PromptDataModule"]
