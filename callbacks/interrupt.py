"""Stop on SIGTERM or Ctrl-C without losing work: finish the step in flight, write last.ckpt."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from lit_treegrpo.core.interfaces import Iterations


class CheckpointOnInterrupt(pl.Callback):
    """Write ``last.ckpt`` when a fit is interrupted by SIGTERM or a first Ctrl-C; stop other commands after their
    batch in flight without writing anything."""

    def __init__(self) -> None:
        self._previous_sigint: Any = None
        self._stopping = False
        self.saved_to: Path | None = None

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._stopping:
            raise KeyboardInterrupt
        self._stopping = True
        rank_zero_info("\nCtrl-C: stopping after the current step and writing a checkpoint (Ctrl-C again aborts)")
        os.kill(os.getpid(), signal.SIGTERM)  # Lightning's own graceful-stop path

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._restore_sigint()
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING:
            return
        checkpointing = trainer.checkpoint_callback
        if isinstance(checkpointing, ModelCheckpoint) and checkpointing.dirpath:
            path = Path(checkpointing.dirpath) / f"{checkpointing.CHECKPOINT_NAME_LAST}{checkpointing.FILE_EXTENSION}"
            # recorded as its own last checkpoint, so that the resumed run overwrites it
            # instead of starting a last-v1.ckpt beside it
            checkpointing.last_model_path = str(path)
        else:
            path = Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"
        trainer.save_checkpoint(path, weights_only=False)  # the whole state (said, not defaulted)
        self.saved_to = path
        step = pl_module.iteration if isinstance(pl_module, Iterations) else trainer.global_step
        rank_zero_info(
            f"Interrupted after training step {step}: checkpoint written to {path}; resume with --ckpt_path last"
        )

    @override
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._stop_if_signalled(trainer)

    @override
    def on_test_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._stop_if_signalled(trainer)

    @override
    def on_predict_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._stop_if_signalled(trainer)

    @staticmethod
    def _stop_if_signalled(trainer: pl.Trainer) -> None:
        # Lightning's evaluation loops check for SIGTERM only after a batch that is not the last,
        # its predict loop never: stop before any further batch, so that it writes nothing more
        if trainer.received_sigterm:
            raise SIGTERMException

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore_sigint()

    def _restore_sigint(self) -> None:
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None
