"""One denoising transition as a Gaussian policy: flow-matching SDE/ODE steps and DDIM.

Every step returns the sampled next state together with the log-density of that state under the
step's Gaussian, so that the same function serves sampling (draw ``noise``) and training
(re-evaluate a recorded ``prev_sample`` with gradients).

Provenance:
- ``flow_sde_step(dynamics="flow_sde")``: Flow-GRPO (Liu et al. 2025, arXiv 2505.05470, eq. 9 and
  ``sde_step_with_logprob`` in its code), the sampler TreeGRPO trains with.
- ``flow_sde_step(dynamics="dance_sde")``: DanceGRPO (Xue et al. 2025, arXiv 2505.07818), constant
  diffusion coefficient ``g = eta``; BranchGRPO uses it with ``eta = 0.3``.
- ``flow_sde_step(dynamics="cps")``: coefficients-preserving sampling (Wang and Yu 2025, arXiv
  2509.05952; ``sde_type == "cps"`` of Flow-GRPO's ``sde_step_with_logprob``), which Flow-GRPO
  recommends at a noise level of about 0.8. Its code scores a step with ``-(x' - mean)^2``, the
  constants *and* the ``1 / (2 std^2)`` left out; here the step is scored with its true Gaussian
  density like every other, so ratios mean the same across dynamics (a clip range tuned on its
  code's unscaled score does not carry over).
- ``ddim_step``: DDPO (Black et al. 2023, ``ddim_step_with_logprob``), i.e. DDIM (Song et al. 2021,
  eq. 12 and 16) with the variance scaled by ``eta``. No ``x0`` clipping or thresholding: SD 1.x
  scheduler configs disable both, and clipping would make the mean non-differentiable.

Log-probabilities are the Gaussian log-density *averaged* over all non-batch elements (constants
included), as every peer implementation does, so that PPO clip ranges of ~1e-4 carry over.
"""

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
    """Per-sample log-density of ``x`` under ``N(mean, std^2)``, averaged over non-batch elements.

    ``std`` broadcasts against ``mean``. Where ``std == 0`` the transition is deterministic and the
    log-probability is defined as 0 (it carries no policy gradient), instead of ``-inf``/``nan``.

    Shapes: x, mean [B, *S]; std [B, 1, ..., 1] (or anything broadcastable) -> [B] float32.
    """
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
    """Draw ``mean + std * noise`` (or take ``prev_sample``) and score it under N(mean, std^2).

    A deterministic step (``stochastic=False``) draws nothing, so it leaves the RNG stream alone,
    and ignores ``noise`` (its std is 0).
    """
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
    """One rectified-flow step from noise level ``sigma`` to ``sigma_next`` (< sigma).

    Convention: ``x_sigma = (1 - sigma) x0 + sigma eps`` and the model predicts ``v = eps - x0``, so
    the probability-flow ODE is ``dx = v dsigma`` and ``dt = sigma_next - sigma < 0``.

    The SDE with the same marginals adds the score correction (Flow-GRPO eq. 9)::

        mean = x + dt * (v + g^2 / (2 sigma) * (x + (1 - sigma) v)),   std = g * sqrt(-dt)

    - ``"flow_sde"``: ``g = noise_level * sqrt(sigma / (1 - sigma))``; at ``sigma == 1`` the
      ``(1 - sigma)`` is replaced by ``(1 - sigma_next)`` as Flow-GRPO does (else g = inf).
    - ``"dance_sde"``: ``g = noise_level`` (DanceGRPO's eta).
    - ``"cps"``: coefficients-preserving sampling, which keeps the coefficients of ``x0`` and of
      the noise those of the marginal at ``sigma_next`` (``1 - sigma_next`` and ``sigma_next``)
      instead of adding a score correction::

          x0 = x - sigma v,   x1 = x + (1 - sigma) v         (the predicted data and noise)
          std = sigma_next * sin(noise_level * pi / 2)
          mean = (1 - sigma_next) x0 + sqrt(sigma_next^2 - std^2) x1

      so ``mean + std * eps`` has noise coefficient ``sqrt((sigma_next^2 - std^2) + std^2) =
      sigma_next`` when ``x1`` and ``eps`` are independent unit noises. ``noise_level`` 1 makes
      the step all fresh noise; 0 the DDIM-like deterministic step.
    - ``"ode"``: Euler step ``mean = x + dt * v``, std 0, log_prob 0 (identical to diffusers'
      ``FlowMatchEulerDiscreteScheduler.step``).

    Math runs in float32 whatever the input dtype (bf16 ``g^2 / sigma`` overflows near sigma = 0 and
    loses the tiny per-element log-prob differences PPO ratios are made of); ``prev_sample`` is
    returned in ``sample.dtype``.

    Args:
        velocity: model output ``v``, [B, *S].
        sample: current state ``x``, [B, *S].
        sigma, sigma_next: float, or [B] tensors for a batch mixing timesteps.
        noise_level: ``a`` of Flow-GRPO (0.7), ``eta`` of DanceGRPO (0.3), or CPS's (0.8).
        dynamics: ``"flow_sde"``, ``"dance_sde"``, ``"cps"`` or ``"ode"``.
        noise: standard normal noise [B, *S] to sample with; drawn from ``generator`` if omitted.
        prev_sample: a recorded next state to score instead of sampling (training).
        generator: RNG for the noise when neither ``noise`` nor ``prev_sample`` is given.
    """
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
    """One DDIM step with variance ``eta^2 * sigma_t^2`` (DDPO's ``ddim_step_with_logprob``)::

        x0   = (x - sqrt(1 - a_t) eps) / sqrt(a_t)
        var  = (1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)
        std  = eta * sqrt(var)
        mean = sqrt(a_prev) x0 + sqrt(1 - a_prev - std^2) eps

    ``eta = 0`` is deterministic DDIM (std 0, log_prob 0) and equals ``DDIMScheduler.step`` with
    ``clip_sample=False``. Math in float32; ``prev_sample`` returned in ``sample.dtype``.

    Args:
        eps: predicted noise [B, *S] (adapters convert v-prediction to epsilon first).
        sample: current latents [B, *S].
        alpha_prod_t, alpha_prod_t_prev: cumulative alphas, floats or [B] tensors.
        eta: DDIM stochasticity; 1.0 as DDPO.
        noise, prev_sample, generator: as in :func:`flow_sde_step`.
    """
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
