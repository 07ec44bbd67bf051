"""The export of ``python -m lit_treegrpo export`` at the end of a fit (:mod:`lit_treegrpo.artifacts.export`)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lit_treegrpo.artifacts.export import check_out, export

from .ema import EMA
from .pruning import PruningSchedule


class ExportOnTrainEnd(Callback):
    """When a fit ends (its last iteration, or stopped early), write the trained weights as the
    ``export`` command does.

    Args:
        out: the folder to write; ``null``: ``<default_root_dir>/export``.
        merged: the full denoiser with the LoRA merged in instead of the LoRA alone.
        ema: also write the EMA weights (``<out>/ema``) when an :class:`EMA` callback has updated.
        overwrite: replace an earlier export in ``out`` (a resumed fit's, say): only the files it
            wrote, as ``export --overwrite true``.
    """

    def __init__(self, out: str | None = None, merged: bool = False, ema: bool = True, overwrite: bool = False) -> None:
        self.out = out
        self.merged = merged
        self.ema = ema
        self.overwrite = overwrite
        self.written: Path | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.is_global_zero:
            # a bad out fails before training, not after it
            check_out(self._folder(trainer), overwrite=self.overwrite, option="ExportOnTrainEnd.out")

    def _folder(self, trainer: pl.Trainer) -> Path:
        return Path(self.out) if self.out is not None else Path(trainer.default_root_dir) / "export"

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        emas = [cb for cb in trainer.callbacks if isinstance(cb, EMA)] if self.ema else []
        pruning = [cb for cb in trainer.callbacks if isinstance(cb, PruningSchedule)]
        state = emas[0].state_dict() if emas and emas[0].num_updates > 0 else None
        metrics = trainer.callback_metrics
        rewards = {
            "reward": float(metrics["reward"]) if "reward" in metrics else None,
            "held_out_reward": float(metrics["val/reward"]) if "val/reward" in metrics else None,
        }
        self.written = export(
            pl_module,
            self._folder(trainer),
            merged=self.merged,
            ema=state,
            metrics=rewards,
            optimizer_steps=trainer.global_step,
            pruning=pruning[0].state_dict()["options"] if pruning else None,
            overwrite=self.overwrite,
            option="ExportOnTrainEnd.out",
        )
        rank_zero_info(f"exported the trained weights to {self.written}")
