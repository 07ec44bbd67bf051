"""Which denoising steps branch, which are stochastic (SDE) and which are deterministic (ODE)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch

from .choices import check_choice
from .seeding import generator

WindowKind = Literal["fixed", "shifting", "geometric", "progressive"]
WindowTarget = Literal["branch", "sde"]


@dataclass(frozen=True)
class WindowSchedule:
    """Moves the branch steps (or the extra SDE steps) of a :class:`TreeSpec` per training step."""

    kind: WindowKind = "fixed"
    """``fixed``: offset ``start`` always. ``shifting`` (TreeGRPO code): ``start + shift *
    (step // every)``, wrapping around past ``max_offset``. ``geometric`` (TreeGRPO paper): offset
    drawn from a geometric law truncated to ``0 .. max_offset``, ``P(i) ∝ ratio**i``.
    ``progressive`` (MixGRPO): like ``shifting`` but stops at ``max_offset`` instead of wrapping
    (with ``roll_back``: returns to ``start`` once the next move would pass ``max_offset``)."""
    target: WindowTarget = "branch"
    """Which steps move: ``branch`` (TreeGRPO's SDE window) or ``sde`` (MixGRPO / BranchGRPO-Mix)."""
    start: int = 0
    """Offset at training step 0 (``fixed``, ``shifting``, ``progressive``)."""
    shift: int = 1
    """How far the window moves each time it moves (TreeGRPO's ``s``)."""
    every: int = 50
    """Training steps between moves (TreeGRPO's ``tou``; MixGRPO's interval)."""
    ratio: float = 0.5
    """Ratio ``r`` of the truncated geometric law (``geometric``); 1.0 is uniform."""
    seed: int = 0
    """Seed of the ``geometric`` draws, added to the run's seed (``TreeSpec.at``'s ``run_seed``,
    the module's ``--model.seed``): one seed varies a whole run."""
    roll_back: bool = False
    """``progressive`` only: once the window would move past ``max_offset``, start again at
    ``start`` (MixGRPO's ``roll_back``, ``fastvideo/utils/grpo_states.py``) instead of staying at
    the end."""

    def __post_init__(self) -> None:
        check_choice("window.kind", self.kind, WindowKind)
        check_choice("window.target", self.target, WindowTarget)
        if self.start < 0:
            raise ValueError(f"window.start must be >= 0, got {self.start}")
        if self.shift < 0:
            raise ValueError(f"window.shift must be >= 0, got {self.shift}")
        if self.every < 1:
            raise ValueError(f"window.every must be >= 1 training step, got {self.every}")
        if not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"window.ratio must be in (0, 1], got {self.ratio}")
        if self.roll_back and self.kind != "progressive":
            raise ValueError(
                f"window.roll_back applies to kind 'progressive' only (kind is {self.kind!r}; "
                "'shifting' already wraps around)"
            )

    def offset(self, step: int, max_offset: int, run_seed: int = 0) -> int:
        """Window offset at training ``step``, in ``0 .. max_offset`` (``geometric`` draws are
        seeded by ``seed + run_seed``)."""
        if step < 0:
            raise ValueError(f"training step must be >= 0, got {step}")
        if max_offset < 0:
            raise ValueError(f"max_offset must be >= 0, got {max_offset}")
        if self.start > max_offset:
            raise ValueError(
                f"window.start={self.start} moves the window into the deterministic tail (ode_tail); "
                f"the largest offset for this tree is {max_offset}"
            )
        moved = self.start + self.shift * (step // self.every)
        if self.kind == "fixed":
            return self.start
        if self.kind == "shifting":
            return moved % (max_offset + 1)
        if self.kind == "progressive":
            if self.roll_back and self.shift > 0:
                # positions start, start + shift, ... <= max_offset, visited in a cycle
                positions = (max_offset - self.start) // self.shift + 1
                return self.start + self.shift * ((step // self.every) % positions)
            return min(moved, max_offset)
        # geometric: a generator seeded from (seed, step) alone, independent of any global RNG.
        gen = generator(self.seed + run_seed, step)
        probs = torch.tensor([self.ratio**i for i in range(max_offset + 1)], dtype=torch.float64)
        return int(torch.multinomial(probs, 1, generator=gen))


@dataclass(frozen=True)
class RolloutLimits:
    """How a rollout runs within memory, as opposed to which tree it grows (:class:`TreeSpec`): a
    resumed run may change it, since the samples stay the same (up to float rounding of chunked calls)."""

    max_batch: int = 64
    """Most nodes per model call; a larger frontier is chunked. Bounds activation memory."""

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"rollout.max_batch must be >= 1, got {self.max_batch}")


@dataclass(frozen=True)
class TreeSpec:
    """Shape of the rollout tree grown from each prompt. Validated on construction."""

    num_steps: int | None = None
    """Denoising steps T of every trajectory (NFE of one plain sample, without CFG). The adapter
    owns it: ``None`` (the default; no shipped config states it) takes the adapter's ``num_steps``
    when the module is built (:meth:`with_num_steps`), and a value other than the adapter's is
    refused. A tree used without a module (``core.rollout`` directly) gives it here."""
    branch_steps: tuple[int, ...] = ()
    """Steps (0-based, ascending) at which every node splits into ``branching`` children."""
    branching: int | tuple[int, ...] = 2
    """Children per node at each branch step: one int for all, or one per entry of branch_steps."""
    sde_steps: tuple[int, ...] = ()
    """Extra stochastic steps that do not split (BranchGRPO-Mix, flat GRPO). Recorded and trained."""
    num_trees: int = 1
    """Independent roots per prompt (each from its own noise). Flat GRPO uses its group size G."""
    shared_noise: bool = False
    """All ``num_trees`` roots of a prompt start from the same initial noise (DanceGRPO's groups),
    instead of one noise each. Part of how a method samples, so it lives with the tree."""
    ode_tail: int = 1
    """The last ``ode_tail`` denoising steps are always deterministic: no branch or SDE step there,
    and a window schedule never moves onto them. 1 (the default) keeps only the nearly degenerate
    last step deterministic; MixGRPO keeps 2."""
    window: WindowSchedule | None = None
    """Optional schedule that moves the branch or SDE steps per training step (:meth:`at`)."""
    split_noise_scale: float = 1.0
    """Multiplies the noise of the children drawn at a branch step while their log-probs keep the
    step's own std, as BranchGRPO's code does (``--tree_split_noise_scale 4``). Anything but 1 makes
    the split edges off-policy: sampled from N(mean, (scale std)^2), scored under N(mean, std^2).
    The first ratio is still 1 (both log-probs use the unscaled std). 1 everywhere but
    ``configs/methods/branchgrpo_official.yaml``."""

    def __post_init__(self) -> None:
        # Lists (Python callers, YAML) become tuples so that the spec stays hashable.
        for name in ("branch_steps", "sde_steps"):
            object.__setattr__(self, name, tuple(int(s) for s in getattr(self, name)))
        if not isinstance(self.branching, int):
            object.__setattr__(self, "branching", tuple(int(k) for k in self.branching))
        if not (math.isfinite(self.split_noise_scale) and self.split_noise_scale > 0):
            raise ValueError(
                f"split_noise_scale must be a finite number > 0 (1: no scaling), got {self.split_noise_scale}"
            )
        T = self.num_steps
        if T is None:
            return  # checked once the adapter's number of steps is filled in (with_num_steps)
        if T < 1:
            raise ValueError(f"num_steps must be >= 1, got {T}")
        if not 1 <= self.ode_tail <= T:
            raise ValueError(
                f"ode_tail must be in 1 .. num_steps={T} (the last step is always deterministic), got {self.ode_tail}"
            )
        first_tail = T - self.ode_tail  # first step of the deterministic tail
        for name in ("branch_steps", "sde_steps"):
            steps = getattr(self, name)
            if len(set(steps)) != len(steps):
                raise ValueError(f"{name} has duplicates: {steps}; list each step once")
            if list(steps) != sorted(steps):
                raise ValueError(f"{name} must be ascending, got {steps}; sort them")
            bad = [s for s in steps if not 0 <= s < T]
            if bad:
                raise ValueError(f"{name} {bad} out of range: steps are 0 .. num_steps-1 = {T - 1}")
            if T - 1 in steps:
                raise ValueError(
                    f"{name} contains the last denoising step {T - 1}: its Gaussian is nearly "
                    f"degenerate, so it is always a deterministic step; use steps 0 .. {T - 2}"
                )
            tail = [s for s in steps if s >= first_tail]
            if tail:
                raise ValueError(
                    f"{name} {tail} lie in the deterministic tail (ode_tail={self.ode_tail}: steps "
                    f"{first_tail} .. {T - 1}); use steps 0 .. {first_tail - 1} or lower ode_tail"
                )
        both = sorted(set(self.branch_steps) & set(self.sde_steps))
        if both:
            raise ValueError(
                f"steps {both} are in both branch_steps and sde_steps; a branch step is already "
                f"stochastic, remove them from sde_steps"
            )
        if isinstance(self.branching, tuple) and len(self.branching) != len(self.branch_steps):
            raise ValueError(
                f"branching has {len(self.branching)} entries but branch_steps has "
                f"{len(self.branch_steps)}; give one int, or one entry per branch step"
            )
        if any(k < 1 for k in self.per_split_branching):
            raise ValueError(f"branching must be >= 1 children per split, got {self.branching}")
        if self.num_trees < 1:
            raise ValueError(f"num_trees must be >= 1, got {self.num_trees}")
        if self.window is not None:
            self.window.offset(0, self._window_max_offset())  # raises if it cannot be placed

    def with_num_steps(self, num_steps: int, prefix: str = "") -> TreeSpec:
        """This tree for an adapter that samples ``num_steps`` steps, the owner of that number: filled in (and the tree
        validated) when the tree leaves it out, ``self`` when it states the same, and a one-line ``ValueError`` when
        it states another (``prefix``, e.g. ``"--model."``, makes the names command-line options)."""
        if self.num_steps is None:
            return dataclasses.replace(self, num_steps=num_steps)
        if self.num_steps != num_steps:
            raise ValueError(
                f"{prefix}tree.num_steps={self.num_steps} but the adapter samples with num_steps={num_steps}; "
                f"leave {prefix}tree.num_steps out (the tree takes the adapter's) or give the same value"
            )
        return self

    def check_trains(self, prefix: str = "") -> None:
        """Refuse a tree that nothing would train on: no stochastic step, or one leaf per prompt (rewards are
        normalised among a prompt's leaves, so every advantage would be 0)."""
        if self.num_steps is not None and self.num_edges() == 0:
            raise ValueError(
                f"{prefix}tree has no stochastic step, so nothing would train; give branch_steps or sde_steps"
            )
        if self.num_leaves == 1:
            raise ValueError(
                f"{prefix}tree has one leaf per prompt (num_trees 1, branching 1), so every advantage "
                "would be 0 and nothing would train; give branching >= 2 or num_trees >= 2"
            )

    @classmethod
    def from_dict(cls, fields: dict) -> TreeSpec:
        """Build from plain fields (a parsed YAML preset), ``window`` as a nested mapping."""
        fields = dict(fields)
        if isinstance(fields.get("window"), dict):
            fields["window"] = WindowSchedule(**fields["window"])
        return cls(**fields)

    # ----------------------------------------------------------------------------- structure
    @property
    def per_split_branching(self) -> tuple[int, ...]:
        """Children per node at each branch step, one entry per ``branch_steps`` entry."""
        if isinstance(self.branching, int):
            return (self.branching,) * len(self.branch_steps)
        return self.branching

    @property
    def num_leaves(self) -> int:
        """Leaves (final images) per prompt."""
        return math.prod(self.per_split_branching) * self.num_trees

    def children_at(self, step: int) -> int:
        """Children per node at denoising ``step`` (1 at SDE and ODE steps)."""
        if step in self.branch_steps:
            return self.per_split_branching[self.branch_steps.index(step)]
        return 1

    def is_stochastic(self, step: int) -> bool:
        """Whether ``step`` samples from the SDE (and records edges)."""
        return step in self.branch_steps or step in self.sde_steps

    def nodes_at(self, step: int) -> int:
        """Nodes alive per prompt when denoising ``step`` begins."""
        n = self.num_trees
        for s, k in zip(self.branch_steps, self.per_split_branching):
            if s < step:
                n *= k
        return n

    def nfe(self) -> int:
        """Model evaluations per prompt for one rollout (batch elements, CFG doubling excluded)."""
        return sum(self.nodes_at(t) for t in range(self.num_steps))

    def num_edges(self) -> int:
        """Recorded stochastic transitions (trainable edges) per prompt."""
        return sum(self.nodes_at(t) * self.children_at(t) for t in range(self.num_steps) if self.is_stochastic(t))

    def train_nfe(self) -> int:
        """Model evaluations per prompt to recompute every edge's log-prob once."""
        return sum(self.nodes_at(t) for t in range(self.num_steps) if self.is_stochastic(t))

    # ----------------------------------------------------------------------------- schedule
    def _window_max_offset(self) -> int:
        assert self.window is not None
        steps = self.branch_steps if self.window.target == "branch" else self.sde_steps
        field = "branch_steps" if self.window.target == "branch" else "sde_steps"
        if not steps:
            raise ValueError(
                f"window.target={self.window.target!r} moves {field}, but {field} is empty; "
                f"give the window's steps at offset 0 in {field}"
            )
        return self.num_steps - 1 - self.ode_tail - steps[-1]  # >= 0: the tail stays deterministic

    def at(self, step: int, run_seed: int = 0) -> TreeSpec:
        """The spec in force at training ``step`` of the run seeded ``run_seed`` (``self`` when there
        is no window schedule)."""
        if self.window is None:
            return self
        offset = self.window.offset(step, self._window_max_offset(), run_seed)
        if self.window.target == "branch":
            branch = tuple(s + offset for s in self.branch_steps)
            sde = tuple(s for s in self.sde_steps if s not in branch)
        else:
            branch = self.branch_steps
            sde = tuple(s + offset for s in self.sde_steps if s + offset not in branch)
        return dataclasses.replace(self, branch_steps=branch, sde_steps=sde, window=None)
