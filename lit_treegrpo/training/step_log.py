"""What one training step records: phase timings (:class:`PhaseTimer`), what the policy-gradient
update did (:class:`Update`), the metrics the module logs (:func:`step_metrics`) and the samples the
callbacks receive (:func:`step_outputs`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.compute import Compute, ComputeCost
from ..core.loss import LossOutput
from ..core.rollout import RolloutTree
from ..core.samples import ScoredSamples
from .faults import Scored, Screened
from .health import tree_health


class PhaseTimer:
    """Wall-clock laps that wait for queued GPU work, so each phase is charged its own time."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.last = self._now()
        self.laps: dict[str, float] = {}
        """phase -> seconds, in the order the phases ran"""

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self, phase: str) -> None:
        """Charge the time since the previous lap (or the start) to ``phase``."""
        now = self._now()
        self.laps[phase], self.last = now - self.last, now


class Update(NamedTuple):
    """What the policy-gradient updates of one training step did."""

    stats: LossOutput | None  # the loss statistics averaged over the micro-batches; None: no update ran
    compute: Compute  # forwards of the log-prob recomputation (trained) and of the KL reference
    steps: int  # optimizer steps taken
    fault: str | None  # why the last refused optimizer step was refused (skip policy), else None
    ratio_dev_at_start: Tensor | None = None  # [] max |ratio - 1| of the first micro-batch, before any update
    grad_norm: Tensor | None = None  # [] mean over the optimizer steps of the gradient norm before clipping
    stopped: Any = None  # a StoppedUpdate when a stop request ended it early (said by the module)


NO_UPDATE = Update(None, Compute(), 0, None)  # a step that trained nothing

#: The two curves to watch, repeated under a capitalised group so that TensorBoard (which sorts
#: groups by name, capitals before lower case) shows them first: the training reward (the mean
#: leaf reward, ``reward``) and the held-out reward (``val/reward``). The other groups follow.
HEADLINE_TRAIN = "Reward/train"
HEADLINE_HELD_OUT = "Reward/held_out"

#: Lightning's logger connector pops a metric of this name and logs the others at its value: every
#: scalar, image and text of a run is placed at the training iteration (what papers plot), never at
#: Lightning's optimizer-step count (several per iteration with ``minibatches`` > 1)
X_AXIS = "step"


class StepMetrics(NamedTuple):
    """A training step's metrics, as the module logs them."""

    shown: dict[str, Any]  # also on the progress bar: ``reward`` and ``loss``
    logged: dict[str, Any]  # the others


def step_metrics(
    rewards: Tensor,
    tree: RolloutTree,
    keep: Tensor,
    advantages: Tensor,
    update: Update,
    fault_counts: Mapping[str, int],
    laps: Mapping[str, float],
    iteration: int,
    compute: Compute,
    compute_total: Compute,
    cost: ComputeCost,
) -> StepMetrics:
    """The step's metrics: the mean of the finite leaf ``rewards`` [L], edges kept, advantage statistics, NFE, phase
    times (``time/<phase>_s``), the iteration (``iteration``: completed ones, this step included), the fault
    counters (``faults/*``) and, when an update ran, its loss statistics; the mean reward also as
    :data:`HEADLINE_TRAIN`."""
    shown: dict[str, Any] = {}
    finite = rewards[torch.isfinite(rewards)]  # [<= L]
    logged: dict[str, Any] = {}
    if finite.numel():
        shown["reward"] = logged[HEADLINE_TRAIN] = finite.mean()
    logged |= {
        "train/edges_kept": keep.float().sum(),
        "train/edges": float(tree.num_edges),
        "adv/mean": advantages.mean() if advantages.numel() else 0.0,
        "adv/std": advantages.std(unbiased=False) if advantages.numel() else 0.0,
        "adv/abs_max": advantages.abs().max() if advantages.numel() else 0.0,
        "nfe/rollout": float(tree.nfe),
        **{f"compute/{kind}": float(value) for kind, value in compute.as_dict().items()},
        "compute/units": compute.units(cost),
        "compute/units_total": compute_total.units(cost),
        **{f"time/{phase}_s": seconds for phase, seconds in laps.items()},
        "iteration": float(iteration),
        X_AXIS: float(iteration - 1),
    }
    logged.update({f"faults/{name}": float(value) for name, value in fault_counts.items()})
    logged.update(tree_health(rewards, tree.leaf_prompt, tree.num_prompts, advantages, tree.edge_depth))
    seconds = sum(laps.values())  # the step's phases: rollout, reward, advantages, train
    if seconds > 0:
        logged["health/samples_per_s"] = tree.num_leaves / seconds
        logged["health/units_per_s"] = compute.units(cost) / seconds
    if update.stats is not None:
        shown["loss"] = update.stats.loss
    logged.update(update_metrics(update))
    return StepMetrics(shown, logged)


def update_metrics(update: Update) -> dict[str, Any]:
    """The loss, ratio and clip statistics of the step's update (none when no update ran)."""
    logged: dict[str, Any] = {}
    if update.stats is not None:
        stats = update.stats
        logged.update(
            {
                "train/clip_frac": stats.clip_frac,
                "train/clip_frac_low": stats.clip_frac_low,
                "train/clip_frac_high": stats.clip_frac_high,
                "train/ratio_std": stats.ratio_std,
                "train/approx_kl": stats.approx_kl,
                "train/ratio_mean": stats.ratio_mean,
                "train/kl": stats.kl,
                "train/policy_loss": stats.policy_loss,
                "train/forwards": float(update.compute.trained + update.compute.reference),
                "nfe/train": float(update.compute.trained + update.compute.reference),
            }
        )
    if update.ratio_dev_at_start is not None:
        logged["health/ratio_dev_at_start"] = update.ratio_dev_at_start
    if update.grad_norm is not None:
        logged["train/grad_norm"] = update.grad_norm
    return logged


def step_outputs(
    scored: Scored, screened: Screened, leaf_prompt: Tensor, leaf_prompts: list[str], images: Tensor
) -> ScoredSamples:
    """What the callbacks receive from a training step: the rewards [L'], their components, the prompts and images [L',
    3, H, W] of the leaves of the prompts that trained (all ``L`` leaves, without a copy of the images, when no
    prompt was dropped)."""
    if not screened.dropped.any():
        return ScoredSamples(scored.rewards.detach(), scored.components, leaf_prompts, images)
    kept = screened.kept_leaves(leaf_prompt)  # [L]
    return ScoredSamples(
        scored.rewards.detach()[kept],
        {k: v[kept] for k, v in scored.components.items()},
        [p for p, k in zip(leaf_prompts, kept.tolist()) if k],
        images[kept],
    )
