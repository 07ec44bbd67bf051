"""Is the run healthy: the on-policy check, and what GRPO learns from (:func:`tree_health`)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

#: the tolerance of the on-policy check by the denoiser's dtype. Measured on this project's CPU: 0 (tiny SD3,
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


def off_policy(deviation: float, dtype: torch.dtype, iteration: int) -> str | None:
    """The warning for a first micro-batch whose ratios deviate from 1 by ``deviation`` beyond the
    tolerance of the denoiser's compute ``dtype``, or ``None``."""
    tolerance = DEFAULT_RATIO_TOLERANCE.get(dtype, DEFAULT_RATIO_TOLERANCE[torch.bfloat16])
    if deviation <= tolerance:
        return None
    return (
        f"iteration {iteration}: before any update the importance ratios already differ from 1 by up to "
        f"{deviation:.3g} (tolerance {tolerance:g} for {str(dtype).removeprefix('torch.')}), so training does not "
        "recompute the log-probs sampling computed. Likely causes: another batch composition (a layer that mixes "
        "the batch), another dtype or autocast, another guidance scale (CFG) or scheduler between sampling and "
        "the training pass (warned once)"
    )


def tree_health(
    rewards: Tensor, leaf_prompt: Tensor, num_prompts: int, advantages: Tensor, edge_depth: Tensor
) -> dict[str, Tensor]:
    """What GRPO learns from, per step (``health/*``):"""
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
