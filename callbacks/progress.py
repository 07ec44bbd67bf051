"""Progress for a log file, and a model summary without the lines that say nothing here."""

from __future__ import annotations

import math
import sys
import time
from typing import Any, TextIO

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelSummary
from lightning.pytorch.utilities.model_summary import get_human_readable_count
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from lit_treegrpo.core.interfaces import Iterations

from .iterations import IterationLimit


def format_duration(seconds: float) -> str:
    """``3725`` -> ``1h 02m``, ``931`` -> ``15m 31s``, ``42.4`` -> ``42s``."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


class ProgressLines(Callback):
    """One plain line every ``every_n_iterations`` training iterations (and after the first one, and whenever
    ``every_n_seconds`` have passed since the last line): the iteration, the training reward, seconds per iteration
    and the time left; and one line per validation with the held-out reward.

    Args:
        every_n_iterations: iterations between two lines.
        every_n_seconds: also print when this long has passed since the last line (slow models
            take minutes per iteration); ``null`` for iterations only.
    """

    def __init__(
        self, every_n_iterations: int = 10, every_n_seconds: float | None = 300.0, stream: TextIO | None = None
    ) -> None:
        if every_n_iterations < 1:
            raise ValueError(f"ProgressLines.every_n_iterations must be >= 1, got {every_n_iterations}")
        if every_n_seconds is not None and every_n_seconds <= 0:
            raise ValueError(f"ProgressLines.every_n_seconds must be > 0 or null, got {every_n_seconds}")
        self.every_n_iterations = every_n_iterations
        self.every_n_seconds = every_n_seconds
        self.stream = stream
        self._start: tuple[float, int, int] | None = None  # (time, iteration, optimizer steps) at train start
        self._last: tuple[float, int] = (0.0, 0)  # (time, iteration) of the last line
        self._val_start: float | None = None
        self._val_seconds = 0.0  # validation time since train start, left out of the ETA's pace

    def _print(self, trainer: pl.Trainer, text: str) -> None:
        if trainer.is_global_zero:
            stream = self.stream if self.stream is not None else sys.stdout
            print(text, file=stream, flush=True)

    def _total(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> int | None:
        """The iteration the fit ends at: ``--max_iterations``, or the iteration that reaches
        ``trainer.max_steps`` when each iteration takes a fixed number of optimizer steps
        (``TreeGRPOModule.optimizer_steps_per_iteration``); ``None`` when neither is known."""
        limits = [cb.max_iterations for cb in trainer.callbacks if isinstance(cb, IterationLimit)]
        if limits:
            return min(limits)
        per_iteration = pl_module.optimizer_steps_per_iteration if isinstance(pl_module, Iterations) else None
        if not per_iteration or trainer.max_steps is None or trainer.max_steps < 0:
            return None
        return pl_module.iteration + math.ceil(max(trainer.max_steps - trainer.global_step, 0) / per_iteration)

    def _eta(self, trainer: pl.Trainer, pl_module: pl.LightningModule, iteration: int, now: float) -> str:
        """Time left from the fraction of the run done: iterations under an iteration limit, else optimizer steps out
        of ``max_steps`` (an iteration makes a varying number of them), at the pace of training alone (validations
        left out: the base model's, before the first iteration, would otherwise count as training time)."""
        assert self._start is not None
        t0, it0, steps0 = self._start
        total = self._total(trainer, pl_module)
        if total is not None:
            done, left = iteration - it0, total - iteration
        elif trainer.max_steps is not None and trainer.max_steps > 0:
            done, left = trainer.global_step - steps0, trainer.max_steps - trainer.global_step
        else:
            return ""
        if done <= 0:
            return ""
        return f"  ETA {format_duration((now - t0 - self._val_seconds) / done * max(left, 0))}"

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        now = time.perf_counter()
        self._start = (now, pl_module.iteration, trainer.global_step)
        self._last = (now, pl_module.iteration)
        self._val_seconds = 0.0
        total = self._total(trainer, pl_module)
        until = (
            f"to iteration {total}"
            if total
            else (
                f"to optimizer step {trainer.max_steps}"
                if trainer.max_steps and trainer.max_steps > 0
                else "without a limit"
            )
        )
        self._print(trainer, f"training from iteration {pl_module.iteration} {until}")

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now, iteration = time.perf_counter(), pl_module.iteration
        assert self._start is not None
        first = iteration == self._start[1] + 1
        total = self._total(trainer, pl_module)
        due = iteration % self.every_n_iterations == 0 or iteration == total
        late = self.every_n_seconds is not None and now - self._last[0] >= self.every_n_seconds
        if not (first or due or late):
            return
        reward = trainer.callback_metrics.get("reward")
        text = f"iteration {iteration}" + (f"/{total}" if total else "")
        if reward is not None:
            text += f"  reward {float(reward):.4f}"
        per_it = (now - self._last[0]) / max(iteration - self._last[1], 1)
        text += f"  {per_it:.2f} s/it{self._eta(trainer, pl_module, iteration, now)}"
        self._last = (now, iteration)
        self._print(trainer, text)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_start = time.perf_counter()

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self._start is None:
            return
        value = trainer.callback_metrics.get("val/reward")
        took = time.perf_counter() - self._val_start if self._val_start is not None else 0.0
        shown = f"{float(value):.4f}" if value is not None else "not logged"
        total = self._total(trainer, pl_module)
        where = f"iteration {pl_module.iteration}" + (f"/{total}" if total else "")
        self._print(trainer, f"{where}  held-out reward {shown}  (validation {took:.1f} s)")
        self._last = (self._last[0] + took, self._last[1])  # s/it counts training time only
        self._val_seconds += took

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._start is None:
            return
        took = time.perf_counter() - self._start[0]
        done = pl_module.iteration - self._start[1]
        self._print(
            trainer, f"finished at iteration {pl_module.iteration}: {done} iterations in {format_duration(took)}"
        )


class CompactModelSummary(ModelSummary):
    """The model's parameter counts in two lines, without Lightning's always-zero FLOPs and its
    train / eval mode counts (the adapters stay in eval mode by design)."""

    @staticmethod
    @override
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **kwargs: Any,
    ) -> None:
        columns = dict(summary_data)
        parts = [f"{n} ({t})" for n, t in zip(columns.get("Name", []), columns.get("Type", []))]
        rank_zero_info(
            f"Model: {', '.join(parts)}\n"
            f"Parameters: {get_human_readable_count(trainable_parameters)} trainable of "
            f"{get_human_readable_count(total_parameters)} ({model_size:.1f} MB)"
        )
