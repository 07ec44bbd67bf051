"""The TensorBoard writers of a Trainer, for the callbacks that write images and text summaries."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_warn


class TensorBoardWriters:
    """``SummaryWriter`` of every ``TensorBoardLogger`` of the trainer; warns once (naming
    ``owner``) when there is none, so that images and tables are skipped knowingly."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._warned = False

    def __call__(self, trainer: pl.Trainer) -> list[Any]:
        writers = [lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if not writers and not self._warned:
            self._warned = True
            kinds = [type(lg).__name__ for lg in trainer.loggers] or ["no logger"]
            rank_zero_warn(
                f"{self.owner} writes images / text summaries to TensorBoard only, and this trainer "
                f"has {', '.join(kinds)}; they are skipped (add a TensorBoardLogger to see them)"
            )
        return writers
