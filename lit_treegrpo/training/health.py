"""Is the run healthy: the on-policy check, and what GRPO learns from (:func:`tree_health`).

Before the first optimizer step of an iteration the policy is the one that sampled the tree, so
every importance ratio ``exp(log_prob - old_log_prob)`` of the first micro-batch should be 1 up to
float rounding. A larger deviation means the training pass does not recompute what sampling
computed (flow_grpo's FAQ and DanceGRPO's debugging guide check this first): then the clip range
(1e-4 in TreeGRPO) clips edges before anything was learnt, and the gradient is not the policy
gradient. The step logs the largest ``|ratio - 1|`` of that micro-batch as
``health/ratio_dev_at_start``; above the tolerance a warning names the likely causes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

#: the default tolerance by the denoiser's dtype. Measured on this project's CPU: 0 (tiny SD3,
#: float32 and bfloat16) and 2.4e-7 (tiny SD 1.5, float32; two float32 ulps of 1.0); a ratio is
#: computed in float32, so 1e-5 leaves 40x room and stays 10x under TreeGRPO's clip range 1e-4.
#: Half precision gets 1e-3: its kernels may round differently at another batch size on an
#: accelerator (not measured here: no GPU).
DEFAULT_RATIO_TOLERANCE = {
    torch.float64: 1e-5,
    torch.float32: 1e-5,
    torch.bfloat16: 1e-3,
    torch.float16: 1e-3,
}


@dataclass(frozen=True)
class HealthChecks:
    """Checks that a run learns from what it sampled."""

    ratio_tolerance: float | None = None
    """Largest ``|ratio - 1|`` allowed on the first micro-batch of an iteration, before any update
    (``health/ratio_dev_at_start``); above it a warning (once per fit). ``null``: by the dtype
    the denoiser computes in (its weights', or the autocast's under ``--trainer.precision
    bf16-mixed`` / ``16-mixed``), 1e-5 for float32 / float64 and 1e-3 for bfloat16 / float16."""

    def __post_init__(self) -> None:
        if self.ratio_tolerance is not None and not self.ratio_tolerance > 0:
            raise ValueError(f"health.ratio_tolerance must be > 0 or null (by dtype), got {self.ratio_tolerance}")

    def tolerance(self, dtype: torch.dtype) -> float:
        """The ratio tolerance for a denoiser of ``dtype``."""
        if self.ratio_tolerance is not None:
            return self.ratio_tolerance
        return DEFAULT_RATIO_TOLERANCE.get(dtype, DEFAULT_RATIO_TOLERANCE[torch.bfloat16])

    def off_policy(self, deviation: float, dtype: torch.dtype, iteration: int) -> str | None:
        """The warning for a first micro-batch whose ratios deviate from 1 by ``deviation``, or
        ``None`` when it is within the tolerance."""
        tolerance = self.tolerance(dtype)
        if deviation <= tolerance:
            return None
        return (
            f"iteration {iteration}: before any update the importance ratios already differ from 1 by up to "
            f"{deviation:.3g} (tolerance {tolerance:g} for {str(dtype).removeprefix('torch.')}), so training does not "
            "recompute the log-probs sampling computed. Likely causes: another batch composition (a layer that mixes "
            "the batch), another dtype or autocast, another guidance scale (CFG) or scheduler between sampling and "
            "the training pass. Set --model.health.ratio_tolerance to move the threshold (warned once)"
        )


def tree_health(
    rewards: Tensor, leaf_prompt: Tensor, num_prompts: int, advantages: Tensor, edge_depth: Tensor
) -> dict[str, Tensor]:
    """What GRPO learns from, per step (``health/*``):

    - ``reward_spread``: the mean over prompts of the population std of each prompt's finite leaf
      ``rewards`` [L] (``leaf_prompt`` [L]); falling towards 0 means the trees stop telling their
      leaves apart, and the advantages (rewards over that std) stop carrying signal.
    - ``zero_spread_frac``: the fraction of prompts (with finite rewards) whose leaves all scored
      the same (std <= 1e-6): those prompts train on zero advantages.
    - ``adv_abs_depth<d>``: the mean ``|advantage|`` of the edges at depth ``d`` (``advantages`` and
      ``edge_depth`` [E]): which depths of the tree receive credit.
    """
    finite = torch.isfinite(rewards)  # [L]
    r = torch.where(finite, rewards.float(), 0.0)  # [L]
    count = torch.zeros(num_prompts, device=r.device).index_add_(0, leaf_prompt, finite.float())  # [P]
    total = torch.zeros(num_prompts, device=r.device).index_add_(0, leaf_prompt, r)  # [P]
    mean = total / count.clamp(min=1)  # [P]
    sq = torch.where(finite, (r - mean[leaf_prompt]).square(), 0.0)  # [L]
    std = (torch.zeros(num_prompts, device=r.device).index_add_(0, leaf_prompt, sq) / count.clamp(min=1)).sqrt()
    scored = count > 0  # [P] prompts with a finite reward
    n = scored.float().sum().clamp(min=1)
    metrics = {
        "health/reward_spread": (std * scored).sum() / n,
        "health/zero_spread_frac": ((std <= 1e-6) & scored).float().sum() / n,
    }
    depth_count = torch.bincount(edge_depth)  # [D]
    depth_total = torch.zeros(depth_count.shape[0], device=advantages.device).index_add_(
        0, edge_depth, advantages.float().abs()
    )  # [D]
    for d in range(depth_count.shape[0]):  # the tree's depths: a few, known on the host from its spec
        metrics[f"health/adv_abs_depth{d}"] = depth_total[d] / depth_count[d].clamp(min=1)
    return metrics


def grad_norm(parameters: Iterable[torch.nn.Parameter]) -> Tensor:
    """[] the L2 norm of all the gradients of ``parameters``, as clipping measures it (before it
    clips): over the whole model, FSDP2's sharded gradients included (their norm is gathered)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm(grads)
    full_tensor = getattr(norm, "full_tensor", None)  # a DTensor's norm is partial on each rank
    return full_tensor() if full_tensor is not None else norm
