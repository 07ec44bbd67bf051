"""Which edges get gradient work: width and depth pruning as boolean edge masks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .advantages import PathPairs, path_pairs
from .choices import check_choice
from .rollout import RolloutTree
from .seeding import generator

WidthPruning = Literal["none", "parent_top1", "extreme", "ratio"]
DepthMode = Literal["drop", "keep"]


@dataclass(frozen=True)
class PruningConfig:
    """Edge selection for one training step."""

    width: WidthPruning = "none"
    """``none``, ``parent_top1``, ``extreme`` or ``ratio`` (see the module docstring)."""
    ratio: float = 0.5
    """Fraction of edges kept per prompt by ``ratio`` (BranchGRPO's code uses 0.5)."""
    depth_window: tuple[int, int] | None = None
    """Depths ``[lo, hi)`` that ``depth_mode`` acts on; ``None`` trains every depth."""
    depth_mode: DepthMode = "drop"
    """``drop``: leave the edges of ``depth_window`` out of training (BranchGRPO's code);
    ``keep``: train only them."""
    steps: tuple[int, ...] | None = None
    """Train only edges recorded at these denoising steps; ``None`` trains every step."""

    def __post_init__(self) -> None:
        check_choice("pruning.width", self.width, WidthPruning)
        if not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"pruning.ratio must be in (0, 1], got {self.ratio}")
        if self.depth_window is not None:
            lo, hi = self.depth_window
            if not 0 <= lo < hi:
                raise ValueError(f"pruning.depth_window must be [lo, hi) with 0 <= lo < hi, got {self.depth_window}")
        check_choice("pruning.depth_mode", self.depth_mode, DepthMode)
        if self.steps is not None:
            object.__setattr__(self, "steps", tuple(int(t) for t in self.steps))  # lists from YAML
            if any(t < 0 for t in self.steps):
                raise ValueError(f"pruning.steps must be denoising step indices >= 0, got {self.steps}")


def edges_above(tree: RolloutTree, keep_leaf: Tensor, pairs: PathPairs | None = None) -> Tensor:
    """[E] bool: edges with at least one kept leaf (``keep_leaf`` [L] bool) below them."""
    if pairs is None:
        pairs = path_pairs(tree.edge_parent, tree.leaf_edge)
    kept_below = torch.zeros(tree.num_edges, dtype=torch.long, device=keep_leaf.device)
    kept_below.index_add_(0, pairs.edge, keep_leaf[pairs.leaf].long())  # [E]
    return kept_below > 0


def parent_top1_mask(tree: RolloutTree, advantages: Tensor) -> Tensor:
    """[E] bool: at the last split every parent keeps only its highest-advantage child's subtree."""
    E = tree.num_edges
    children = torch.bincount(tree.edge_source, minlength=tree.source_step.shape[0])  # [Ns]
    split_source = children > 1  # [Ns]
    if not bool(split_source.any()):
        return torch.ones(E, dtype=torch.bool, device=advantages.device)
    last_split = int(tree.source_step[split_source].max())
    at_split = tree.source_step[tree.edge_source] == last_split  # [E]
    split_edges = at_split.nonzero().squeeze(1)  # [C]
    src = tree.edge_source[split_edges]  # [C]
    # rank 0 within each parent = the best child; the stable sort lets the first child win ties
    best = _rank_in_group(advantages[split_edges].float(), src, descending=True) == 0  # [C]
    dropped = torch.zeros(E, dtype=torch.bool, device=advantages.device)
    dropped[split_edges] = ~best
    pairs = path_pairs(tree.edge_parent, tree.leaf_edge)
    dropped_above = torch.zeros(tree.num_leaves, dtype=torch.long, device=advantages.device)
    dropped_above.index_add_(0, pairs.leaf, dropped[pairs.edge].long())  # [L]
    return edges_above(tree, dropped_above == 0, pairs)


def extreme_mask(tree: RolloutTree, advantages: Tensor, n: int = 1) -> Tensor:
    """[E] bool: per prompt, the paths to the ``n`` best and ``n`` worst leaves."""
    leaf_value = advantages[tree.leaf_edge.clamp(min=0)].float()  # [L]
    rank_best = _rank_in_group(leaf_value, tree.leaf_prompt, descending=True)  # [L]
    rank_worst = _rank_in_group(leaf_value, tree.leaf_prompt, descending=False)  # [L]
    return edges_above(tree, (rank_best < n) | (rank_worst < n))


def ratio_mask(tree: RolloutTree, advantages: Tensor, ratio: float) -> Tensor:
    """[E] bool: per prompt, the ``ceil(ratio * edges)`` edges with the largest ``|advantage|``."""
    prompt = tree.edge_prompt  # [E]
    rank = _rank_in_group(advantages.abs().float(), prompt, descending=True)  # [E]
    per_prompt = torch.bincount(prompt, minlength=tree.num_prompts)  # [P]
    quota = torch.ceil(per_prompt.double() * ratio).long()  # [P]
    return rank < quota[prompt]


def depth_mask(edge_depth: Tensor, lo: int, hi: int) -> Tensor:
    """[E] bool: edges with ``lo <= depth < hi``."""
    return (edge_depth >= lo) & (edge_depth < hi)


def prune(tree: RolloutTree, advantages: Tensor, config: PruningConfig) -> Tensor:
    """[E] bool mask of the edges to train on this step."""
    if advantages.shape != (tree.num_edges,):
        raise ValueError(f"advantages have shape {tuple(advantages.shape)}, expected [{tree.num_edges}]")
    if config.width == "parent_top1":
        keep = parent_top1_mask(tree, advantages)
    elif config.width == "extreme":
        keep = extreme_mask(tree, advantages)
    elif config.width == "ratio":
        keep = ratio_mask(tree, advantages, config.ratio)
    else:
        keep = torch.ones(tree.num_edges, dtype=torch.bool, device=advantages.device)
    if config.depth_window is not None:
        in_window = depth_mask(tree.edge_depth, *config.depth_window)  # [E]
        keep = keep & (in_window if config.depth_mode == "keep" else ~in_window)
    if config.steps is not None:
        steps = torch.tensor(config.steps, dtype=torch.long, device=keep.device)
        keep = keep & torch.isin(tree.edge_step, steps)
    return keep


def _rank_in_group(values: Tensor, group: Tensor, *, descending: bool) -> Tensor:
    """[N] position of each value inside its group when sorted (ties by index), vectorised."""
    order = torch.argsort(values, descending=descending, stable=True)  # [N]
    order = order[torch.argsort(group[order], stable=True)]  # grouped, sorted within groups
    counts = torch.bincount(group)  # [G]
    starts = torch.cumsum(counts, 0) - counts  # [G]
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.shape[0], device=order.device) - starts[group[order]]
    return rank


__all__ = [
    "NO_PRUNING",
    "PruningConfig",
    "PruningPlan",
    "depth_mask",
    "edges_above",
    "extreme_mask",
    "parent_top1_mask",
    "prune",
    "ratio_mask",
]


Direction = Literal["deeper", "shallower"]


@dataclass(frozen=True)
class PruningPlan:
    """The :class:`PruningConfig` of every training iteration, a pure function of it, so that a resumed or distributed
    run prunes as the uninterrupted one."""

    width: WidthPruning = "none"
    """``none``, ``parent_top1``, ``extreme`` or ``ratio`` (see the module docstring)."""
    width_fraction: float = 1.0
    """Fraction of the run's iterations with width pruning on, in (0, 1]."""
    ratio: float = 0.5
    """Fraction of edges kept per prompt by ``ratio``, in (0, 1]."""
    depth_window: int | None = None
    """Size of the depth window; ``None`` trains every depth."""
    depth_every: int = 30
    """Training steps between two moves of the window."""
    depth_shift: int = 1
    """Depths the window moves each time (0 keeps it fixed)."""
    depth_start: int = 0
    """First depth of the window at iteration 0."""
    depth_stop: int | None = None
    """The window's first depth never moves past this depth (``None``: no limit for ``"deeper"``,
    0 for ``"shallower"``)."""
    depth_direction: Direction = "deeper"
    """``"deeper"`` (towards the leaves) or ``"shallower"`` (towards the root)."""
    depth_mode: DepthMode = "drop"
    """``"drop"`` (the window's depths do not train; BranchGRPO's code) or ``"keep"`` (only they do)."""
    step_fraction: float = 1.0
    """Fraction of each iteration's stochastic steps trained (DanceGRPO: 0.6); 1.0 trains all."""
    steps: tuple[int, ...] | None = None
    """Train only the edges recorded at these denoising steps, every iteration (fixed step
    pruning; ``None``: every step). Not combined with ``step_fraction < 1``, which draws them."""
    seed: int = 0
    """Seed of the ``step_fraction`` draws, added to the run's seed (:meth:`at`'s ``run_seed``,
    the module's ``--model.seed``): one seed varies a whole run."""

    def __post_init__(self) -> None:
        name = "PruningSchedule"
        check_choice(f"{name}.width", self.width, WidthPruning)
        for field, value in (
            ("width_fraction", self.width_fraction),
            ("ratio", self.ratio),
            ("step_fraction", self.step_fraction),
        ):
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name}.{field} must be in (0, 1], got {value}")
        if self.depth_window is not None and self.depth_window < 1:
            raise ValueError(f"{name}.depth_window must be >= 1 or None, got {self.depth_window}")
        if self.depth_every < 1:
            raise ValueError(f"{name}.depth_every must be >= 1 training step, got {self.depth_every}")
        for field, value in (("depth_shift", self.depth_shift), ("depth_start", self.depth_start)):
            if value < 0:
                raise ValueError(f"{name}.{field} must be >= 0, got {value}")
        check_choice(f"{name}.depth_direction", self.depth_direction, Direction)
        check_choice(f"{name}.depth_mode", self.depth_mode, DepthMode)
        stop, start = self.depth_stop, self.depth_start
        if stop is not None:
            if stop < 0:
                raise ValueError(f"{name}.depth_stop must be >= 0 or None, got {stop}")
            if self.depth_direction == "deeper" and stop < start:
                raise ValueError(
                    f"{name}.depth_stop={stop} is above depth_start={start}, but "
                    "depth_direction='deeper' moves the window down; use depth_stop >= depth_start"
                )
            if self.depth_direction == "shallower" and stop > start:
                raise ValueError(
                    f"{name}.depth_stop={stop} is below depth_start={start}, but "
                    "depth_direction='shallower' moves the window up; use depth_stop <= depth_start"
                )
        if self.steps is not None:
            object.__setattr__(self, "steps", tuple(int(t) for t in self.steps))  # lists from YAML
            if any(t < 0 for t in self.steps):
                raise ValueError(f"{name}.steps must be denoising step indices >= 0, got {self.steps}")
            if self.step_fraction < 1.0:
                raise ValueError(
                    f"{name}.steps={self.steps} and step_fraction={self.step_fraction} both choose the trained "
                    "steps; give steps (the same every iteration) or step_fraction (drawn each iteration)"
                )
        for field in ("width_fraction", "ratio", "step_fraction"):  # ints from YAML compare as floats
            object.__setattr__(self, field, float(getattr(self, field)))

    def width_steps(self, max_steps: int | None) -> int | None:
        """Number of first training steps with width pruning on (``None``: all of them)."""
        if self.width == "none":
            return 0
        if self.width_fraction >= 1.0:
            return None
        if max_steps is None or max_steps < 0:
            raise ValueError(
                f"PruningSchedule.width_fraction={self.width_fraction} needs the run length: set "
                "trainer.max_steps or --max_iterations (both unset / -1), or use width_fraction=1.0"
            )
        # the tolerance keeps 0.07 * 100 = 7.000000000000001 at 7 steps
        return math.ceil(self.width_fraction * max_steps - 1e-9)

    def depth_lo(self, iteration: int) -> int:
        """First depth of the window at ``iteration`` (only meaningful with a ``depth_window``)."""
        moved = self.depth_shift * (iteration // self.depth_every)
        if self.depth_direction == "deeper":
            lo = self.depth_start + moved
            return lo if self.depth_stop is None else min(lo, self.depth_stop)
        return max(self.depth_start - moved, self.depth_stop or 0)

    def steps_at(self, iteration: int, stochastic_steps: Sequence[int], run_seed: int = 0) -> tuple[int, ...] | None:
        """The denoising steps trained at ``iteration`` (``None``: all): ``steps``, or drawn from
        ``stochastic_steps``."""
        if self.steps is not None:
            return self.steps
        if self.step_fraction >= 1.0 or not stochastic_steps:
            return None
        n = math.ceil(self.step_fraction * len(stochastic_steps) - 1e-9)
        gen = generator(self.seed + run_seed, iteration)
        chosen = torch.randperm(len(stochastic_steps), generator=gen)[:n]
        return tuple(stochastic_steps[i] for i in chosen.sort().values.tolist())

    def at(
        self, iteration: int, max_steps: int | None, stochastic_steps: Sequence[int] = (), run_seed: int = 0
    ) -> PruningConfig:
        """The pruning of training step ``iteration`` (0-based) of a run of ``max_steps`` steps
        whose tree samples ``stochastic_steps`` at that iteration (needed by ``step_fraction``, whose
        draws are seeded by ``seed + run_seed``)."""
        if iteration < 0:
            raise ValueError(f"iteration must be >= 0, got {iteration}")
        width_steps = self.width_steps(max_steps)
        width_on = self.width != "none" and (width_steps is None or iteration < width_steps)
        window = None
        if self.depth_window is not None:
            lo = self.depth_lo(iteration)
            window = (lo, lo + self.depth_window)
        return PruningConfig(
            width=self.width if width_on else "none",
            ratio=self.ratio,
            depth_window=window,
            depth_mode=self.depth_mode,
            steps=self.steps_at(iteration, stochastic_steps, run_seed),
        )


NO_PRUNING = PruningConfig()
"""Every edge trains: the pruning of a fit without a ``PruningSchedule`` callback."""
