"""``last.ckpt`` is the run's latest state, in the run folder the user names.

Two gaps of Lightning's ``ModelCheckpoint(save_last=True)`` that this closes (the CLI adds the
callback beside every ``ModelCheckpoint``):

- **The last steps of a fit.** ``ModelCheckpoint`` writes ``last.ckpt`` only together with a
  scheduled checkpoint: after a validation when validation is scheduled by steps
  (``check_val_every_n_epoch: null``, every shipped config), and at the end of the fit only when it
  had written nothing at all. A fit of ``max_steps: 8`` validated every 3 steps thus ended with
  ``last.ckpt`` at step 6: ``export`` exported older weights and ``--ckpt_path last`` trained steps
  7-8 again. :meth:`KeepLastCheckpoint.on_train_end` writes ``last.ckpt`` once more when the fit
  ends past its last save, however it ends normally (``max_steps``, ``max_time``,
  ``--max_iterations``, a callback's stop); a fit whose last step already saved writes nothing more.
  An interrupted fit (SIGTERM, Ctrl-C) does not reach ``on_train_end``:
  :class:`~lit_treegrpo.callbacks.CheckpointOnInterrupt` writes that one.
- **A moved or copied run folder.** A checkpoint holds ``ModelCheckpoint``'s state with absolute
  paths (its ``dirpath``, ``last_model_path``, the top-k files). Resumed under another folder name,
  Lightning drops that state (the dirpath changed), so ``last_model_path`` is empty, the existing
  ``last.ckpt`` counts as someone else's file and its version counter writes ``last-v1.ckpt``
  beside it; the next ``--ckpt_path last`` then resumed the stale ``last.ckpt``.
  :meth:`KeepLastCheckpoint.on_load_checkpoint` reads that state as this folder's when the
  checkpoint being resumed lies in this folder's checkpoint directory (after ``mv A B`` or
  ``cp -a A B``, ``--trainer.default_root_dir B --ckpt_path last``), so the resumed run goes on as
  in its original folder: it overwrites ``B/checkpoints/last.ckpt`` and replaces its own top-k files
  in ``B`` only. A checkpoint taken from another run's folder keeps Lightning's rules.
"""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

#: the entries of ``ModelCheckpoint``'s state that name files of its ``dirpath``
_PATH_ENTRIES = ("best_model_path", "kth_best_model_path", "last_model_path")


def _position(trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[int, Any]:
    """Where a fit stands: optimizer steps and training iterations (they part when a step is
    skipped: ``faults.nonfinite: skip`` advances the iteration without an optimizer step)."""
    return trainer.global_step, getattr(pl_module, "iteration", None)


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
    """Write ``last.ckpt`` at the end of every fit, and resume a moved or copied run folder into
    its own ``last.ckpt`` (see the module docstring). Acts on every ``ModelCheckpoint`` of the
    trainer with ``save_last``; it saves nothing itself that ``ModelCheckpoint`` would not."""

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
            if not getattr(callback, "_last_checkpoint_saved", ""):
                continue  # nothing written in this fit: ModelCheckpoint.on_train_end writes it
            # ModelCheckpoint writes last.ckpt in the same call as any checkpoint of a step
            if getattr(callback, "_last_global_step_saved", None) == now[0] and self._saved_at == now:
                continue
            callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))
