"""Every private Lightning member the package reads or calls, named once, with the reason; each is pinned by a test
of tests/test_lightning_api.py (named beside it), so that a Lightning upgrade that moves one fails there. (The
private methods a subclass must override, LightningCLI's and the TensorBoard logger's, stay in those subclasses,
pinned by the same file.)"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


def attached_trainer(module: Any) -> Any:
    """The module's trainer, or None when it is not attached (``module.trainer`` raises then)."""
    return module._trainer


def validate_inside_fit(trainer: Any) -> None:
    """Run the validation loop now, inside a fit's ``on_train_start``, as Lightning's training epoch loop does around
    its own validations: no public API validates before the first step (the sanity check logs nothing), and the main
    job's curves start at the base model."""
    first_loop_iter = trainer._logger_connector._first_loop_iter
    trainer.validating = True
    trainer.fit_loop.epoch_loop.val_loop.run()
    trainer.training = True
    trainer._logger_connector._first_loop_iter = first_loop_iter


def saves_distributed_checkpoint(strategy: Any) -> bool:
    """Whether ``ModelParallelStrategy`` was asked for sharded checkpoints (no public accessor)."""
    return bool(strategy._save_distributed_checkpoint)


def save_last_checkpoint(callback: Any, trainer: Any) -> None:
    """Have a ``ModelCheckpoint`` write its ``last.ckpt`` now (its own rule for it is private)."""
    callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))


def last_checkpoint_state(callback: Any) -> tuple[str, int | None]:
    """A ``ModelCheckpoint``'s last written ``last.ckpt`` path (empty: none in this fit) and step."""
    return getattr(callback, "_last_checkpoint_saved", ""), getattr(callback, "_last_global_step_saved", None)


@contextlib.contextmanager
def fsdp_lazy_load_replaced(load: Callable[[Any], Any]) -> Iterator[None]:
    """``FSDPStrategy`` unpickles a full checkpoint with an unrestricted unpickler of its own (``fsdp._lazy_load``);
    within the block it reads through ``load`` instead."""
    from lightning.pytorch.strategies import fsdp

    if not hasattr(fsdp, "_lazy_load"):
        yield
        return
    lazy_load = fsdp._lazy_load
    fsdp._lazy_load = load
    try:
        yield
    finally:
        fsdp._lazy_load = lazy_load


def is_local_path(path: Any) -> bool:
    """Whether Lightning reads ``path`` from the local file system (not s3://, gs:// ...)."""
    from lightning.fabric.utilities.cloud_io import _is_local_file_protocol

    return _is_local_file_protocol(path)
