"""``last.ckpt`` is the run's latest state, in the run folder the user names."""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

from lit_treegrpo.common.lightning_private import last_checkpoint_state, save_last_checkpoint
from lit_treegrpo.core.interfaces import Iterations

#: the entries of ``ModelCheckpoint``'s state that name files of its ``dirpath``
_PATH_ENTRIES = ("best_model_path", "kth_best_model_path", "last_model_path")


def _position(trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[int, Any]:
    """Where a fit stands: optimizer steps and training iterations (they part when a step is
    skipped: ``faults.nonfinite: skip`` advances the iteration without an optimizer step)."""
    return trainer.global_step, pl_module.iteration if isinstance(pl_module, Iterations) else None


def _in_folder(path: Any, old: str, new: str) -> Any:
    """``path`` moved from folder ``old`` to folder ``new`` when it lies directly in ``old``."""
    if isinstance(path, str) and path and os.path.normpath(os.path.dirname(path)) == os.path.normpath(old):
        return os.path.join(new, os.path.basename(path))
    return path


def rebased_state(state: dict[str, Any], new_dirpath: str) -> dict[str, Any]:
    """``ModelCheckpoint``'s saved ``state`` with its folder renamed to ``new_dirpath``."""
    old = state["dirpath"]
    moved = {**state, "dirpath": new_dirpath}
    for key in _PATH_ENTRIES:
        if key in moved:
            moved[key] = _in_folder(moved[key], old, new_dirpath)
    if isinstance(moved.get("best_k_models"), dict):
        moved["best_k_models"] = {_in_folder(k, old, new_dirpath): v for k, v in moved["best_k_models"].items()}
    return moved


class KeepLastCheckpoint(pl.Callback):
    """Write ``last.ckpt`` at the end of every fit, and resume a moved or copied run folder into its own ``last.ckpt``
    (see the module docstring)."""

    def __init__(self) -> None:
        self._saved_at: tuple[int, Any] | None = None  # the position of the fit's latest checkpoint write

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # every callback's on_load_checkpoint runs before any load_state_dict, and with the same
        # dict: the state is renamed here, then ModelCheckpoint restores it as in the old folder
        resumed = trainer.ckpt_path
        states = checkpoint.get("callbacks")
        if resumed is None or not isinstance(states, dict):
            return
        folder = os.path.realpath(os.path.dirname(os.fspath(resumed)))
        for callback in trainer.checkpoint_callbacks:
            if not isinstance(callback, ModelCheckpoint) or not callback.dirpath:
                continue
            state = states.get(callback.state_key)
            saved = state.get("dirpath") if isinstance(state, dict) else None
            if not saved or saved == callback.dirpath or os.path.realpath(callback.dirpath) != folder:
                continue  # the same folder, or a checkpoint from another run's folder
            states[callback.state_key] = rebased_state(state, str(callback.dirpath))

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._saved_at = _position(trainer, pl_module)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # every rank runs this hook with the same positions, so every rank takes part in the save
        # (a collective under DDP / FSDP); the ModelCheckpoints' own on_train_end runs after it
        # (Lightning moves them last) and writes when they wrote nothing in this fit
        if trainer.fast_dev_run:  # Lightning writes no checkpoint then
            return
        now = _position(trainer, pl_module)
        for callback in trainer.checkpoint_callbacks:
            if not isinstance(callback, ModelCheckpoint) or callback.save_last is not True:
                continue
            written, step = last_checkpoint_state(callback)
            if not written:
                continue  # nothing written in this fit: ModelCheckpoint.on_train_end writes it
            # ModelCheckpoint writes last.ckpt in the same call as any checkpoint of a step
            if step == now[0] and self._saved_at == now:
                continue
            save_last_checkpoint(callback, trainer)
