"""Callbacks that let subprocess tests observe a run: per-rank parameters, step markers."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch


class SaveRankParameters(pl.Callback):
    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        params = {n: p.detach().cpu() for n, p in pl_module.named_parameters() if p.requires_grad}
        torch.save(params, self.folder / f"rank{trainer.global_rank}.pt")


class StepMarker(pl.Callback):
    """Touches ``<folder>/<iteration>`` after every training step, so a test knows how far a
    subprocess has got before it signals it."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / str(pl_module.iteration)).touch()
