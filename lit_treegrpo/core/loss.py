"""PPO-style clipped policy-gradient loss over recorded tree edges (GRPO without a critic)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from .choices import check_choice
from .compute import Compute
from .rollout import Parents, PredictFn, RolloutTree, StepFn, dense_ids, recompute_log_probs

Aggregation = Literal["sum", "mean", "edge"]
KLForm = Literal["exact", "flow_grpo"]


def check_kl_reference(kl_beta: float, has_lora: bool, prefix: str = "") -> None:
    """The one statement of "``kl_beta`` needs LoRA": the KL reference is the model with its LoRA disabled, so
    ``kl_beta > 0`` needs an adapter with ``lora``."""
    if kl_beta > 0 and not has_lora:
        raise ValueError(
            f"{prefix}loss.kl_beta > 0 needs the adapter's lora (the KL reference is the model with LoRA "
            f"disabled); set {prefix}adapter.init_args.lora or {prefix}loss.kl_beta 0"
        )


class LossOutput(NamedTuple):
    """The loss to backpropagate and its statistics (detached scalars)."""

    loss: Tensor  # [] with grad
    policy_loss: Tensor  # [] policy part of ``loss``
    kl: Tensor  # [] KL part before ``kl_beta`` (0 when kl_beta == 0)
    ratio_mean: Tensor  # [] mean importance ratio
    clip_frac: Tensor  # [] fraction of edges whose ratio lies outside the clip range
    approx_kl: Tensor  # [] 0.5 * mean((log_prob - old_log_prob)^2), the policy drift
    ratio_dev_max: Tensor  # [] largest |ratio - 1| over the edges (0 before any update when on-policy)
    ratio_std: Tensor  # [] population std of the importance ratios
    clip_frac_low: Tensor  # [] fraction of edges with ratio < 1 - clip_range
    clip_frac_high: Tensor  # [] fraction of edges with ratio > 1 + clip_range_high


class ClippedPolicyLoss(nn.Module):
    """Clipped surrogate loss with advantage clipping and optional KL to a reference policy.

    Args:
        clip_range: lower clip ``epsilon`` of the ratio (1e-4 as TreeGRPO / Flow-GRPO; log-probs
            are per-element means, so ratios move very little).
        adv_clip: clamp advantages to ``[-adv_clip, adv_clip]`` (5 in every peer).
        kl_beta: weight of the KL to the reference mean; 0 disables it (TreeGRPO, DanceGRPO).
        clip_range_high: upper clip; ``None`` means ``clip_range`` (symmetric).
        aggregation: ``"sum"`` or ``"mean"`` over the children of a parent, or ``"edge"`` (every
            edge alike), see the module doc.
        kl_form: ``"exact"`` (the Gaussians' KL) or ``"flow_grpo"`` (Flow-GRPO's, the exact KL
            times the step size ``|dt|``; needs ``step_size`` in :meth:`forward`).
    """

    def __init__(
        self,
        clip_range: float = 1e-4,
        adv_clip: float = 5.0,
        kl_beta: float = 0.0,
        clip_range_high: float | None = None,
        aggregation: Aggregation = "sum",
        kl_form: KLForm = "exact",
    ) -> None:
        super().__init__()
        if clip_range <= 0:
            raise ValueError(f"loss.clip_range must be > 0, got {clip_range}")
        if clip_range_high is not None and clip_range_high <= 0:
            raise ValueError(f"loss.clip_range_high must be > 0, got {clip_range_high}")
        if adv_clip <= 0:
            raise ValueError(f"loss.adv_clip must be > 0, got {adv_clip}")
        if kl_beta < 0:
            raise ValueError(f"loss.kl_beta must be >= 0, got {kl_beta}")
        check_choice("loss.aggregation", aggregation, Aggregation)
        check_choice("loss.kl_form", kl_form, KLForm)
        self.kl_form = kl_form
        self.clip_low = clip_range
        self.clip_high = clip_range if clip_range_high is None else clip_range_high
        self.adv_clip = adv_clip
        self.kl_beta = kl_beta
        self.aggregation = aggregation

    def forward(
        self,
        log_prob: Tensor,
        old_log_prob: Tensor,
        advantages: Tensor,
        *,
        group: Tensor | None = None,
        mean: Tensor | None = None,
        ref_mean: Tensor | None = None,
        std: Tensor | None = None,
        step_size: Tensor | None = None,
    ) -> LossOutput:
        """Loss over B edges."""
        B = log_prob.shape[0]
        for name, t in (("old_log_prob", old_log_prob), ("advantages", advantages)):
            if t.shape != (B,):
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected [{B}] like log_prob")
        log_ratio = log_prob.float() - old_log_prob.float()  # [B]
        ratio = torch.exp(log_ratio)  # [B]
        adv = advantages.float().clamp(-self.adv_clip, self.adv_clip)  # [B]
        unclipped = -adv * ratio  # [B]
        clipped = -adv * ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)  # [B]
        policy = torch.maximum(unclipped, clipped)  # [B]

        if self.kl_beta > 0:
            if mean is None or ref_mean is None or std is None:
                raise ValueError("kl_beta > 0 needs mean, ref_mean and std")
            sq = (mean.float() - ref_mean.float()).square()  # [B, *S]
            kl = (sq / (2 * std.float().square())).flatten(1).mean(dim=1)  # [B] exact
            if self.kl_form == "flow_grpo":
                if step_size is None or step_size.shape != (B,):
                    raise ValueError(f"kl_form='flow_grpo' needs step_size of shape [{B}] (|dt| per edge)")
                kl = kl * step_size.float()  # [B] / g^2 instead of / (g^2 |dt|)
        else:
            kl = torch.zeros_like(policy)  # [B]

        policy_loss = self._aggregate(policy, group)  # []
        kl_loss = self._aggregate(kl, group)  # []
        loss = policy_loss + self.kl_beta * kl_loss
        with torch.no_grad():
            low, high = ratio < 1.0 - self.clip_low, ratio > 1.0 + self.clip_high  # [B]
            clip_frac = (low | high).float().mean()
            approx_kl = 0.5 * log_ratio.square().mean()
            ratio_dev_max = (ratio - 1.0).abs().max()
        return LossOutput(
            loss,
            policy_loss.detach(),
            kl_loss.detach(),
            ratio.detach().mean(),
            clip_frac,
            approx_kl.detach(),
            ratio_dev_max.detach(),
            ratio.detach().std(unbiased=False),
            low.float().mean(),
            high.float().mean(),
        )

    def _aggregate(self, per_edge: Tensor, group: Tensor | None) -> Tensor:
        """Sum or mean over each group's edges, then mean over groups; ``"edge"``: mean over edges. [B] -> []."""
        if group is None or self.aggregation == "edge":
            return per_edge.mean()
        if group.shape != per_edge.shape:
            raise ValueError(f"group has shape {tuple(group.shape)}, expected {tuple(per_edge.shape)}")
        # contiguous group ids without a host sync; B slots hold at most B groups, the unused ones
        # stay 0 and the mean divides by the groups present
        B = per_edge.shape[0]
        g, _, starts = dense_ids(group)  # [B] ids 0..G-1, [B] first edge of each group (sorted)
        per_group = per_edge.new_zeros(B).index_add(0, g, per_edge)  # [B], G slots used
        if self.aggregation == "mean":
            counts = per_edge.new_zeros(B).index_add(0, g, torch.ones_like(per_edge))  # [B]
            per_group = per_group / counts.clamp(min=1)
        return per_group.sum() / starts.sum()


def edge_loss(
    loss_fn: ClippedPolicyLoss,
    predict: PredictFn,
    step: StepFn,
    tree: RolloutTree,
    edges: Tensor,
    cond: Any,
    advantages: Tensor,
    *,
    reference: Callable[[], AbstractContextManager[Any]] | None = None,
    step_size: Tensor | None = None,
    parents: Parents | None = None,
) -> tuple[LossOutput, Compute]:
    """The loss of the recorded edges ``edges`` [B] (non-empty) under the current policy, and the
    model forwards it took (``Compute.trained``: with grad, ``Compute.reference``: the KL's)."""
    new = recompute_log_probs(predict, step, tree, edges, cond, parents)
    ref_mean = None
    reference_forwards = 0
    if loss_fn.kl_beta > 0:
        if reference is None:
            raise ValueError("kl_beta > 0 needs the reference model: pass reference=")
        with torch.no_grad(), reference():
            ref = recompute_log_probs(predict, step, tree, edges, cond, parents)
        ref_mean = ref.step.mean  # [B, *S]
        reference_forwards = ref.num_forwards  # the reference's forwards are model evaluations too
    out = loss_fn(
        new.step.log_prob,
        tree.edge_old_log_prob[edges],
        advantages[edges],
        group=new.group,
        mean=new.step.mean,
        ref_mean=ref_mean,
        std=new.step.std,
        step_size=step_size,
    )
    return out, Compute(trained=new.num_forwards, reference=reference_forwards)
