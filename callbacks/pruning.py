"""BranchGRPO's pruning schedule: width pruning early in training, a sliding depth window.

BranchGRPO (arXiv 2509.06040, sec. 3.4) prunes only the *backward* pass, after reward fusion and
advantage normalisation: width pruning keeps a subset of leaves' paths (Parent-Top1 / Extreme; its
code keeps a ``ratio`` of edges) for a fraction of training (``pruning_step_ratio``), and depth
pruning trains a window of 4 depths that slides by one depth every 30 iterations until a stop depth.
The paper leaves the direction of the slide ambiguous, so it is an option here. DanceGRPO's
``timestep_fraction`` (train a random 60% of the denoising steps of every iteration) is
``step_fraction``, drawn from ``(seed, iteration)``.

:meth:`PruningSchedule.config_at` is a pure function of the iteration and the run length: a resumed
run gets exactly the configuration the uninterrupted run would have had, with no state to restore
beyond the options themselves (kept in the checkpoint only to warn when they change).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from lit_treegrpo.core.pruning import DepthMode, PruningConfig, WidthPruning

from .iterations import run_iterations

Direction = Literal["deeper", "shallower"]


@dataclass(frozen=True)
class _Options:
    width: WidthPruning
    width_fraction: float
    extreme_n: int
    ratio: float
    depth_window: int | None
    depth_every: int
    depth_shift: int
    depth_start: int
    depth_stop: int | None
    depth_direction: Direction
    depth_mode: DepthMode
    step_fraction: float
    seed: int


class PruningSchedule(Callback):
    """Sets ``pl_module.pruning`` (a :class:`~lit_treegrpo.core.pruning.PruningConfig`) before
    every training step.

    Width pruning: ``width`` is in force for the first ``ceil(width_fraction * max_steps)`` training
    steps (iterations ``0 .. ceil(width_fraction * max_steps) - 1``), ``"none"`` afterwards; with
    ``width_fraction = 1`` it is always on and the run length is not needed. ``max_steps`` is the
    run's length in iterations: ``--max_iterations`` when given, else ``trainer.max_steps``
    (:func:`~lit_treegrpo.callbacks.run_iterations`).

    Depth pruning: the edges with depth (recorded ancestors) in ``[lo, lo + depth_window)`` are left
    out of training (``depth_mode="drop"``) or are the only ones trained (``"keep"``), where
    ``lo = depth_start ± depth_shift * (iteration // depth_every)`` (``+`` for ``"deeper"``, ``-``
    for ``"shallower"``), clamped so that it never passes ``depth_stop`` (for ``"shallower"`` the
    default stop is 0). BranchGRPO's code drops a window of 4 of its deepest depths and slides it
    one depth towards the root every 30 iterations (``depth_mode="drop", depth_window=4,
    depth_start=T-5, depth_direction="shallower", depth_every=30``, stop at the last split).

    Args:
        width: ``none``, ``parent_top1``, ``extreme`` or ``ratio`` (see ``core/pruning.py``).
        width_fraction: fraction of ``trainer.max_steps`` with width pruning on, in (0, 1].
        extreme_n: best and worst leaves per prompt kept by ``extreme``.
        ratio: fraction of edges per prompt kept by ``ratio``, in (0, 1].
        depth_window: size of the depth window; ``None`` trains every depth.
        depth_every: training steps between two moves of the window.
        depth_shift: depths the window moves each time (0 keeps it fixed).
        depth_start: first depth of the window at iteration 0.
        depth_stop: the window's first depth never moves past this depth (``None``: no limit for
            ``"deeper"``, 0 for ``"shallower"``).
        depth_direction: ``"deeper"`` (towards the leaves) or ``"shallower"`` (towards the root).
        depth_mode: ``"drop"`` (the window's depths do not train; BranchGRPO's code) or
            ``"keep"`` (only the window's depths train).
        step_fraction: train the edges of ``ceil(step_fraction * n)`` of the ``n`` stochastic steps
            of each iteration's tree, drawn uniformly without replacement (DanceGRPO: 0.6); 1.0
            trains every step.
        seed: seed of the ``step_fraction`` draws (a pure function of ``(seed, iteration)``).
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
        seed: int = 0,
    ) -> None:
        if width not in ("none", "parent_top1", "extreme", "ratio"):
            raise ValueError(
                f"PruningSchedule.width must be none, parent_top1, extreme or ratio; got {width!r}"
            )
        if not 0.0 < width_fraction <= 1.0:
            raise ValueError(f"PruningSchedule.width_fraction must be in (0, 1], got {width_fraction}")
        if extreme_n < 1:
            raise ValueError(f"PruningSchedule.extreme_n must be >= 1, got {extreme_n}")
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"PruningSchedule.ratio must be in (0, 1], got {ratio}")
        if depth_window is not None and depth_window < 1:
            raise ValueError(f"PruningSchedule.depth_window must be >= 1 or None, got {depth_window}")
        if depth_every < 1:
            raise ValueError(f"PruningSchedule.depth_every must be >= 1 training step, got {depth_every}")
        if depth_shift < 0:
            raise ValueError(f"PruningSchedule.depth_shift must be >= 0, got {depth_shift}")
        if depth_start < 0:
            raise ValueError(f"PruningSchedule.depth_start must be >= 0, got {depth_start}")
        if depth_direction not in ("deeper", "shallower"):
            raise ValueError(
                f"PruningSchedule.depth_direction must be 'deeper' or 'shallower', got {depth_direction!r}"
            )
        if depth_mode not in ("drop", "keep"):
            raise ValueError(f"PruningSchedule.depth_mode must be 'drop' or 'keep', got {depth_mode!r}")
        if not 0.0 < step_fraction <= 1.0:
            raise ValueError(f"PruningSchedule.step_fraction must be in (0, 1], got {step_fraction}")
        if depth_stop is not None:
            if depth_stop < 0:
                raise ValueError(f"PruningSchedule.depth_stop must be >= 0 or None, got {depth_stop}")
            if depth_direction == "deeper" and depth_stop < depth_start:
                raise ValueError(
                    f"PruningSchedule.depth_stop={depth_stop} is above depth_start={depth_start}, but "
                    "depth_direction='deeper' moves the window down; use depth_stop >= depth_start"
                )
            if depth_direction == "shallower" and depth_stop > depth_start:
                raise ValueError(
                    f"PruningSchedule.depth_stop={depth_stop} is below depth_start={depth_start}, but "
                    "depth_direction='shallower' moves the window up; use depth_stop <= depth_start"
                )
        self.options = _Options(
            width=width,
            width_fraction=float(width_fraction),
            extreme_n=extreme_n,
            ratio=float(ratio),
            depth_window=depth_window,
            depth_every=depth_every,
            depth_shift=depth_shift,
            depth_start=depth_start,
            depth_stop=depth_stop,
            depth_direction=depth_direction,
            depth_mode=depth_mode,
            step_fraction=float(step_fraction),
            seed=seed,
        )

    # ------------------------------------------------------------------------ the schedule
    def width_steps(self, max_steps: int | None) -> int | None:
        """Number of first training steps with width pruning on (``None``: all of them)."""
        o = self.options
        if o.width == "none":
            return 0
        if o.width_fraction >= 1.0:
            return None
        if max_steps is None or max_steps < 0:
            raise ValueError(
                f"PruningSchedule.width_fraction={o.width_fraction} needs the run length: set "
                "trainer.max_steps or --max_iterations (both unset / -1), or use width_fraction=1.0"
            )
        # the tolerance keeps 0.07 * 100 = 7.000000000000001 at 7 steps
        return math.ceil(o.width_fraction * max_steps - 1e-9)

    def depth_lo(self, iteration: int) -> int:
        """First depth of the window at ``iteration`` (only meaningful with a ``depth_window``)."""
        o = self.options
        moved = o.depth_shift * (iteration // o.depth_every)
        if o.depth_direction == "deeper":
            lo = o.depth_start + moved
            return lo if o.depth_stop is None else min(lo, o.depth_stop)
        return max(o.depth_start - moved, o.depth_stop or 0)

    def steps_at(self, iteration: int, stochastic_steps: Sequence[int]) -> tuple[int, ...] | None:
        """The denoising steps trained at ``iteration`` (``None``: all), drawn from ``stochastic_steps``."""
        o = self.options
        if o.step_fraction >= 1.0 or not stochastic_steps:
            return None
        n = math.ceil(o.step_fraction * len(stochastic_steps) - 1e-9)
        gen = torch.Generator().manual_seed((o.seed * 1_000_003 + iteration) % 2**63)
        chosen = torch.randperm(len(stochastic_steps), generator=gen)[:n].sort().values.tolist()
        return tuple(stochastic_steps[i] for i in chosen)

    def config_at(
        self, iteration: int, max_steps: int | None, stochastic_steps: Sequence[int] = ()
    ) -> PruningConfig:
        """The pruning of training step ``iteration`` (0-based) of a run of ``max_steps`` steps
        whose tree samples ``stochastic_steps`` at that iteration (needed by ``step_fraction``)."""
        if iteration < 0:
            raise ValueError(f"iteration must be >= 0, got {iteration}")
        o = self.options
        width_steps = self.width_steps(max_steps)
        width_on = o.width != "none" and (width_steps is None or iteration < width_steps)
        window = None
        if o.depth_window is not None:
            lo = self.depth_lo(iteration)
            window = (lo, lo + o.depth_window)
        return PruningConfig(
            width=o.width if width_on else "none",
            extreme_n=o.extreme_n,
            ratio=o.ratio,
            depth_window=window,
            depth_mode=o.depth_mode,
            steps=self.steps_at(iteration, stochastic_steps),
        )

    # ------------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.width_steps(run_iterations(trainer))  # fail before the first step, naming the option

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        stochastic: list[int] = []
        if self.options.step_fraction < 1.0:  # the steps to draw from: this iteration's tree
            spec = pl_module.tree.at(pl_module.iteration)
            stochastic = [t for t in range(spec.num_steps) if spec.is_stochastic(t)]
        # the run length in iterations: --max_iterations, else max_steps (as before that option)
        pl_module.pruning = self.config_at(pl_module.iteration, run_iterations(trainer), stochastic)

    # ------------------------------------------------------------------------ resume
    @override
    def state_dict(self) -> dict[str, Any]:
        return {"options": asdict(self.options)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict["options"]
        mine = asdict(self.options)
        changed = {k: (saved.get(k), v) for k, v in mine.items() if saved.get(k) != v}
        if changed:
            what = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
            rank_zero_warn(
                f"PruningSchedule options differ from the checkpoint's ({what}); the resumed run "
                "follows the new options from its current iteration on"
            )
