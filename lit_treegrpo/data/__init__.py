"""Prompt data: where the prompts come from and how a run draws them.

- :mod:`.datamodule`: :class:`PromptDataModule` (``--data.*``), the held-out split, batch sizes per
  process, resumable state; also importable as ``lit_treegrpo.data.PromptDataModule``.
- :mod:`.prompt_sets`: prompts from a ``.txt`` / ``.jsonl`` / ``.csv`` file or a built-in set
  (``prompts/*.txt``, shipped as package data), checked as they load.
- :mod:`.prompt_stream`: the stateless, seeded, data-parallel stream: batch ``k`` is a pure function
  of ``(seed, k)``, so a resumed run draws what an uninterrupted one draws.

May import: :mod:`lit_treegrpo.common`, torch and Lightning; never the module, the models or the
rewards.
"""

from .datamodule import PromptDataModule

__all__ = ["PromptDataModule"]
