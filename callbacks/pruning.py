"""The owner of a fit's pruning: BranchGRPO's width pruning early in training, a sliding depth
window, DanceGRPO's random subset of steps, or any fixed pruning (a constant schedule).

The schedule itself is :class:`lit_treegrpo.core.pruning.PruningSchedule`, a pure function of the
iteration (BranchGRPO, arXiv 2509.06040, sec. 3.4: pruning acts on the backward pass only, after
reward fusion and advantage normalisation). This callback is the one :class:`~lit_treegrpo.core.
pruning.PruningSource` of a fit: the module asks it for each iteration's pruning
(``TreeGRPOModule.pruning_at``), holds no pruning of its own, and trains every edge without it. A
resumed run gets exactly the pruning the uninterrupted run would have had; the options are kept in
the checkpoint only to say when they change (and for the export's card).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from lit_treegrpo.core.pruning import DepthMode, Direction, PruningConfig, WidthPruning
from lit_treegrpo.core.pruning import PruningSchedule as Schedule

from .iterations import run_iterations


class PruningSchedule(Callback):
    """A fit's pruning: a :class:`~lit_treegrpo.core.pruning.PruningSchedule` (same arguments; see
    it for their meaning) evaluated at each iteration. The run's length, which ``width_fraction``
    needs, is counted in iterations: ``--max_iterations`` when given, else ``trainer.max_steps``
    (:func:`~lit_treegrpo.callbacks.run_iterations`). Without this callback every edge trains.

    Args:
        width: ``none``, ``parent_top1``, ``extreme`` or ``ratio`` (see ``core/pruning.py``).
        width_fraction: fraction of the run's iterations with width pruning on, in (0, 1].
        extreme_n: best and worst leaves per prompt kept by ``extreme``.
        ratio: fraction of edges per prompt kept by ``ratio``, in (0, 1].
        depth_window: size of the depth window; ``None`` trains every depth.
        depth_every: training steps between two moves of the window.
        depth_shift: depths the window moves each time (0 keeps it fixed: a fixed window
            ``[lo, hi)`` is ``depth_start: lo, depth_window: hi - lo, depth_shift: 0``).
        depth_start: first depth of the window at iteration 0.
        depth_stop: the window's first depth never moves past this depth (``None``: no limit for
            ``"deeper"``, 0 for ``"shallower"``).
        depth_direction: ``"deeper"`` (towards the leaves) or ``"shallower"`` (towards the root).
        depth_mode: ``"drop"`` (the window's depths do not train; BranchGRPO's code) or
            ``"keep"`` (only the window's depths train).
        step_fraction: train the edges of ``ceil(step_fraction * n)`` of the ``n`` stochastic steps
            of each iteration's tree, drawn uniformly without replacement (DanceGRPO: 0.6); 1.0
            trains every step.
        steps: train only the edges recorded at these denoising steps, every iteration (``None``:
            every step); not with ``step_fraction < 1``.
        seed: seed of the ``step_fraction`` draws, added to ``--model.seed``.
    """

    def __init__(
        self,
        width: WidthPruning = "none",
        width_fraction: float = 1.0,
        extreme_n: int = 1,
        ratio: float = 0.5,
        depth_window: int | None = None,
        depth_every: int = 30,
        depth_shift: int = 1,
        depth_start: int = 0,
        depth_stop: int | None = None,
        depth_direction: Direction = "deeper",
        depth_mode: DepthMode = "drop",
        step_fraction: float = 1.0,
        steps: list[int] | None = None,
        seed: int = 0,
    ) -> None:
        self.schedule = Schedule(
            width=width,
            width_fraction=width_fraction,
            extreme_n=extreme_n,
            ratio=ratio,
            depth_window=depth_window,
            depth_every=depth_every,
            depth_shift=depth_shift,
            depth_start=depth_start,
            depth_stop=depth_stop,
            depth_direction=depth_direction,
            depth_mode=depth_mode,
            step_fraction=step_fraction,
            steps=tuple(steps) if steps is not None else None,
            seed=seed,
        )
        self.run_length: int | None = None  # the fit's length in iterations, known at setup

    def pruning_at(self, iteration: int, stochastic_steps: Sequence[int] = (), run_seed: int = 0) -> PruningConfig:
        """The pruning of iteration ``iteration`` of this fit (:meth:`Schedule.at`); the module
        calls it once per training step (and ``TreeView`` through the module)."""
        return self.schedule.at(iteration, self.run_length, stochastic_steps, run_seed)

    def config_at(
        self, iteration: int, max_steps: int | None, stochastic_steps: Sequence[int] = (), run_seed: int = 0
    ) -> PruningConfig:
        """The schedule's pruning at ``iteration`` of a run of ``max_steps`` iterations, outside a
        fit (:meth:`Schedule.at`)."""
        return self.schedule.at(iteration, max_steps, stochastic_steps, run_seed)

    # ------------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.run_length = run_iterations(trainer)
        self.schedule.width_steps(self.run_length)  # fail before the first step, naming the option

    # ------------------------------------------------------------------------ resume
    @override
    def state_dict(self) -> dict[str, Any]:
        return {"options": asdict(self.schedule)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict["options"]
        mine = asdict(self.schedule)
        # a checkpoint written before ``steps`` existed had it at its default
        changed = {k: (saved.get(k), v) for k, v in mine.items() if saved.get(k, _DEFAULTS[k]) != v}
        if changed:
            what = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
            rank_zero_warn(
                f"PruningSchedule options differ from the checkpoint's ({what}); the resumed run "
                "follows the new options from its current iteration on"
            )


_DEFAULTS = asdict(Schedule())
