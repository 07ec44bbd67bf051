"""The owner of a fit's pruning: BranchGRPO's width pruning early in training, a sliding depth window, DanceGRPO's
random subset of steps, or any fixed pruning (a constant schedule)."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from lit_treegrpo.core.interfaces import PrunedModule
from lit_treegrpo.core.pruning import PruningConfig, PruningPlan

from .iterations import run_iterations


class PruningSchedule(PruningPlan, Callback):
    """A fit's pruning: the :class:`~lit_treegrpo.core.pruning.PruningPlan` of these options at each iteration."""

    run_length: int | None = None  # the fit's length in iterations, known at setup

    def pruning_of(self, pl_module: PrunedModule) -> PruningConfig:
        """The pruning of the module's current iteration."""
        iteration = pl_module.iteration
        spec = pl_module.tree_at(iteration)
        stochastic = [t for t in range(spec.num_steps) if spec.is_stochastic(t)]
        return self.at(iteration, self.run_length, stochastic, pl_module.seed)

    def _set(self, pl_module: pl.LightningModule) -> None:
        if not isinstance(pl_module, PrunedModule):
            raise TypeError(
                f"PruningSchedule needs a module with a pruning in force; {type(pl_module).__name__} has none"
            )
        pl_module.pruning = self.pruning_of(pl_module)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        others = [c for c in trainer.callbacks if isinstance(c, PruningSchedule) and c is not self]
        if others:
            raise ValueError(f"the pruning has {len(others) + 1} owners; configure one PruningSchedule callback")
        self.run_length = run_iterations(trainer)
        self.width_steps(self.run_length)  # fail before the first step, naming the option

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._set(pl_module)  # before the callbacks' on_train_start (a TreeView at iteration 0)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._set(pl_module)  # a sharded strategy restores the iteration after on_fit_start

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._set(pl_module)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._set(pl_module)  # the next iteration's, for what draws between iterations

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"options": asdict(self)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict["options"]
        # an option a checkpoint predates was at its default
        old = {f.name: saved.get(f.name, f.default) for f in fields(PruningPlan)}
        changed = {k: (old[k], v) for k, v in asdict(self).items() if old[k] != v}
        if changed:
            what = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
            rank_zero_warn(
                f"PruningSchedule options differ from the checkpoint's ({what}); the resumed run "
                "follows the new options from its current iteration on"
            )
