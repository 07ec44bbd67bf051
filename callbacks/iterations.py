"""Run length in training iterations, the unit this project speaks in."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override


class IterationLimit(Callback):
    """Stop the fit once ``pl_module.iteration`` reaches ``max_iterations`` (training iterations completed, a resumed
    run's included)."""

    def __init__(self, max_iterations: int) -> None:
        if max_iterations < 1:
            raise ValueError(f"--max_iterations must be >= 1, got {max_iterations}")
        self.max_iterations = int(max_iterations)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # a run resumed at or beyond the limit trains nothing (as Lightning does with max_steps)
        if pl_module.iteration >= self.max_iterations:
            trainer.should_stop = True

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if pl_module.iteration >= self.max_iterations:
            trainer.should_stop = True


def run_iterations(trainer: pl.Trainer) -> int | None:
    """The number of training iterations the fit runs to: an :class:`IterationLimit`'s, else
    ``trainer.max_steps`` when it is set (equal to iterations when each makes one optimizer step,
    as every shipped config but the multi-minibatch ones); ``None`` when neither bounds the run."""
    limits = [cb.max_iterations for cb in trainer.callbacks if isinstance(cb, IterationLimit)]
    if limits:
        return min(limits)
    max_steps = trainer.max_steps
    return max_steps if max_steps is not None and max_steps > 0 else None


class EveryNIterations(Callback):
    """Base of the callbacks that draw something of the policy every ``every_n_steps`` training iterations
    (:class:`~lit_treegrpo.callbacks.SampleGridLogger`, :class:`~lit_treegrpo.callbacks.TreeView`): before the first
    iteration of a fit (a resumed run's included), before every iteration whose index is a
    positive multiple of ``every_n_steps`` (= after that many completed ones and their EMA updates, whatever the
    callback order) and at the end of training, never twice at one iteration."""

    every_n_steps: int
    last_logged: int | None

    def log_at(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Draw and log at the module's current iteration, and set ``last_logged`` to it."""
        raise NotImplementedError

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.last_logged != pl_module.iteration:
            self.log_at(trainer, pl_module)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        n = pl_module.iteration
        if n > 0 and n % self.every_n_steps == 0 and self.last_logged != n:
            self.log_at(trainer, pl_module)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.last_logged != pl_module.iteration:
            self.log_at(trainer, pl_module)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"last_logged": self.last_logged}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_logged = state_dict["last_logged"]
