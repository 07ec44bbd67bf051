"""One denoising transition as a Gaussian policy: flow-matching SDE/ODE steps and DDIM."""

# Provenance. flow_sde: Flow-GRPO (arXiv 2505.05470, eq. 9; ``sde_step_with_logprob``), the sampler
# TreeGRPO trains with. dance_sde: DanceGRPO (arXiv 2505.07818), constant g = eta (BranchGRPO: 0.3).
# cps: coefficients-preserving sampling (arXiv 2509.05952; Flow-GRPO's ``sde_type == "cps"``), scored
# here with its true Gaussian density (its code drops 1 / (2 std^2), so clip ranges do not carry
# over). ddim: DDPO's ``ddim_step_with_logprob`` (DDIM eq. 12, 16, variance scaled by eta), no x0
# clipping (SD 1.x disables it, and it would make the mean non-differentiable). Log-probs are the
# Gaussian log-density averaged over non-batch elements, constants included, as every peer does,
# so that PPO clip ranges of ~1e-4 carry over.

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from .choices import check_choice

SDEDynamics = Literal["flow_sde", "dance_sde", "cps"]
"""The stochastic dynamics a flow-matching adapter samples its branching steps with."""
Dynamics = Literal[SDEDynamics, "ode"]
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


class StepOutput(NamedTuple):
    """Result of one denoising transition ``x_t -> x_{t-1}``."""

    prev_sample: Tensor  # [B, *S] next state, in the dtype of the input sample
    log_prob: Tensor  # [B] float32, mean over S of log N(prev_sample; mean, std^2); 0 where std == 0
    mean: Tensor  # [B, *S] float32
    std: Tensor  # [B, 1, ..., 1] float32, broadcastable against mean


def gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Per-sample log-density of ``x`` under ``N(mean, std^2)``, averaged over non-batch elements."""
    x, mean, std = x.float(), mean.float(), std.float()
    deterministic = std == 0
    safe_std = torch.where(deterministic, torch.ones_like(std), std)
    z = (x - mean) / safe_std  # [B, *S]
    elementwise = -0.5 * z.square() - torch.log(safe_std) - _LOG_SQRT_2PI  # [B, *S]
    elementwise = torch.where(deterministic, torch.zeros_like(elementwise), elementwise)
    return elementwise.flatten(1).mean(dim=1)  # [B]


def _per_sample(value: float | Tensor, like: Tensor) -> Tensor:
    """A float or a [B] tensor as float32 [B, 1, ..., 1] broadcastable against ``like`` [B, *S]."""
    t = torch.as_tensor(value, dtype=torch.float32, device=like.device)
    if t.ndim == 0:
        return t.reshape((1,) * like.ndim)
    if t.ndim != 1 or t.shape[0] != like.shape[0]:
        raise ValueError(
            f"per-sample schedule values must be a float or a [B] tensor with B={like.shape[0]}, "
            f"got shape {tuple(t.shape)}"
        )
    return t.reshape((-1,) + (1,) * (like.ndim - 1))


def _sample_or_score(
    mean: Tensor,
    std: Tensor,
    out_dtype: torch.dtype,
    noise: Tensor | None,
    prev_sample: Tensor | None,
    generator: torch.Generator | None,
    *,
    stochastic: bool,
) -> StepOutput:
    """Draw ``mean + std * noise`` (or take ``prev_sample``) and score it under N(mean, std^2)."""
    if noise is not None and prev_sample is not None:
        raise ValueError("pass at most one of `noise` (to sample) and `prev_sample` (to score)")
    for name, given in (("noise", noise), ("prev_sample", prev_sample)):
        if given is not None and given.shape != mean.shape:
            # broadcasting would silently share one noise (or one sample) across the batch
            raise ValueError(f"{name} has shape {tuple(given.shape)}, expected {tuple(mean.shape)}")
    if prev_sample is None and not stochastic:
        prev_sample = mean.to(out_dtype)  # [B, *S]
    elif prev_sample is None:
        if noise is None:
            noise = torch.randn(mean.shape, generator=generator, device=mean.device)
        # Cast to the state dtype *before* scoring, so that the log-prob recorded at sampling time
        # is the one training recomputes from the stored sample: ratio == 1 on the first pass.
        # Detached: a draw is scored as a given sample (Flow-GRPO's ``prev_sample.detach()``), so
        # a log-prob sampled with grad has the score's gradient through the mean, not 0.
        prev_sample = (mean + std * noise.float()).to(out_dtype).detach()  # [B, *S]
    log_prob = gaussian_log_prob(prev_sample, mean, std)  # [B]
    return StepOutput(prev_sample, log_prob, mean, std.expand((mean.shape[0],) + std.shape[1:]))


def flow_sde_step(
    velocity: Tensor,
    sample: Tensor,
    sigma: float | Tensor,
    sigma_next: float | Tensor,
    *,
    noise_level: float = 0.7,
    dynamics: Dynamics = "flow_sde",
    noise: Tensor | None = None,
    prev_sample: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> StepOutput:
    """One rectified-flow step from ``sigma`` to ``sigma_next`` (< sigma) of ``dynamics`` ``flow_sde``,
    ``dance_sde``, ``cps`` or ``ode``, in float32 whatever the input dtype (bf16 ``g^2 / sigma``
    overflows near 0 and loses the tiny log-prob differences ratios are made of)."""
    # x_sigma = (1 - sigma) x0 + sigma eps, v = eps - x0, dt = sigma_next - sigma < 0. The SDE with
    # the ODE's marginals (Flow-GRPO eq. 9): mean = x + dt (v + g^2 / (2 sigma) (x + (1 - sigma) v)),
    # std = g sqrt(-dt); flow_sde: g = a sqrt(sigma / (1 - sigma)) (at sigma = 1, 1 - sigma_next);
    # dance_sde: g = a. cps keeps the marginal's coefficients: mean = (1 - s') x0 + sqrt(s'^2 - std^2) x1,
    # std = s' sin(a pi / 2). ode: the Euler step (diffusers' FlowMatchEulerDiscreteScheduler.step).
    check_choice("dynamics", dynamics, Dynamics)
    x = sample.float()  # [B, *S]
    v = velocity.float()  # [B, *S]
    s = _per_sample(sigma, x)  # [B, 1..]
    s_next = _per_sample(sigma_next, x)  # [B, 1..]
    dt = s_next - s  # [B, 1..] negative
    if dynamics == "ode":
        mean = x + dt * v  # [B, *S]
        std = torch.zeros_like(dt)  # [B, 1..]
        return _sample_or_score(mean, std, sample.dtype, noise, prev_sample, generator, stochastic=False)
    if dynamics == "cps":
        x0 = x - s * v  # [B, *S] predicted data
        x1 = x + (1 - s) * v  # [B, *S] predicted noise
        std = s_next * math.sin(noise_level * math.pi / 2)  # [B, 1..]
        mean = (1 - s_next) * x0 + torch.sqrt((s_next.square() - std.square()).clamp(min=0)) * x1  # [B, *S]
        return _sample_or_score(mean, std, sample.dtype, noise, prev_sample, generator, stochastic=True)
    if dynamics == "flow_sde":
        one_minus = torch.where(s == 1, 1 - s_next, 1 - s)  # [B, 1..]
        g = noise_level * torch.sqrt(s / one_minus)  # [B, 1..]
    else:
        g = torch.full_like(s, float(noise_level))  # [B, 1..]
    mean = x + dt * (v + g.square() / (2 * s) * (x + (1 - s) * v))  # [B, *S]
    std = g * torch.sqrt(-dt)  # [B, 1..]
    return _sample_or_score(mean, std, sample.dtype, noise, prev_sample, generator, stochastic=True)


def ddim_step(
    eps: Tensor,
    sample: Tensor,
    alpha_prod_t: float | Tensor,
    alpha_prod_t_prev: float | Tensor,
    *,
    eta: float = 1.0,
    noise: Tensor | None = None,
    prev_sample: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> StepOutput:
    """One DDIM step with variance ``eta^2 * sigma_t^2`` (DDPO's ``ddim_step_with_logprob``); ``eta = 0``
    is deterministic DDIM, ``DDIMScheduler.step`` with ``clip_sample=False``. Math in float32."""
    # x0 = (x - sqrt(1 - a_t) eps) / sqrt(a_t); var = (1 - a_prev) / (1 - a_t) (1 - a_t / a_prev);
    # std = eta sqrt(var); mean = sqrt(a_prev) x0 + sqrt(1 - a_prev - std^2) eps
    if eta < 0:
        raise ValueError(f"eta must be >= 0 (0 is deterministic DDIM, 1 is DDPO), got {eta}")
    x = sample.float()  # [B, *S]
    e = eps.float()  # [B, *S]
    a_t = _per_sample(alpha_prod_t, x)  # [B, 1..]
    a_prev = _per_sample(alpha_prod_t_prev, x)  # [B, 1..]
    x0 = (x - torch.sqrt(1 - a_t) * e) / torch.sqrt(a_t)  # [B, *S]
    variance = (1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)  # [B, 1..]
    std = eta * torch.sqrt(variance.clamp(min=0))  # [B, 1..]
    direction = torch.sqrt((1 - a_prev - std.square()).clamp(min=0)) * e  # [B, *S]
    mean = torch.sqrt(a_prev) * x0 + direction  # [B, *S]
    stochastic = eta != 0
    return _sample_or_score(mean, std, sample.dtype, noise, prev_sample, generator, stochastic=stochastic)
