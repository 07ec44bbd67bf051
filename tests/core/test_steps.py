"""Tests for ``lit_treegrpo.core.steps``: Gaussian denoising transitions and their log-probs.

Three kinds of checks:
- the log-prob is the mean over non-batch elements of ``Normal(mean, std).log_prob``;
- means and stds against numbers derived by hand from the formulas in the module docstring;
- deterministic steps against diffusers' own schedulers (diffusers is imported only here).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Normal

from lit_treegrpo.core.steps import StepOutput, ddim_step, flow_sde_step, gaussian_log_prob

SHAPE = (3, 2, 4, 4)  # [B, C, H, W], tiny on purpose
LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _pair(seed: int, dtype: torch.dtype = torch.float32, shape: tuple[int, ...] = SHAPE):
    """(model_output, sample) drawn from a fixed seed."""
    g = torch.Generator().manual_seed(seed)
    model_output = torch.randn(shape, generator=g).to(dtype)  # [B, *S]
    sample = torch.randn(shape, generator=g).to(dtype)  # [B, *S]
    return model_output, sample


def _normal_log_prob(out: StepOutput) -> torch.Tensor:
    """Reference log-prob: torch's Normal, averaged over non-batch elements -> [B]."""
    return Normal(out.mean, out.std).log_prob(out.prev_sample.float()).flatten(1).mean(1)


# Each entry: a step with all schedule arguments bound, called as fn(model_output, sample, **kw).
STEPS = {
    "flow_sde": lambda m, x, **kw: flow_sde_step(m, x, 0.6, 0.45, dynamics="flow_sde", **kw),
    "dance_sde": lambda m, x, **kw: flow_sde_step(m, x, 0.6, 0.45, dynamics="dance_sde", noise_level=0.3, **kw),
    "ode": lambda m, x, **kw: flow_sde_step(m, x, 0.6, 0.45, dynamics="ode", **kw),
    "ddim_eta1": lambda m, x, **kw: ddim_step(m, x, 0.4, 0.6, eta=1.0, **kw),
    "ddim_eta0.5": lambda m, x, **kw: ddim_step(m, x, 0.4, 0.6, eta=0.5, **kw),
    "ddim_eta0": lambda m, x, **kw: ddim_step(m, x, 0.4, 0.6, eta=0.0, **kw),
}
STOCHASTIC = ["flow_sde", "dance_sde", "ddim_eta1", "ddim_eta0.5"]
DETERMINISTIC = ["ode", "ddim_eta0"]


# --------------------------------------------------------------------------------------------------
# Log-prob equals torch's Normal log-density, averaged over non-batch elements
# --------------------------------------------------------------------------------------------------

FLOW_SIGMAS = [
    (1.0, 0.9),  # sigma == 1: Flow-GRPO's (1 - sigma_next) substitution
    (0.5, 0.25),
    (0.1, 0.0),  # last step, sigma_next == 0
    (torch.tensor([1.0, 0.6, 0.2]), torch.tensor([0.9, 0.4, 0.05])),  # one timestep per sample
]


@pytest.mark.parametrize("dynamics", ["flow_sde", "dance_sde"])
@pytest.mark.parametrize("sigma,sigma_next", FLOW_SIGMAS)
def test_flow_log_prob_matches_normal(dynamics, sigma, sigma_next):
    v, x = _pair(0)
    out = flow_sde_step(v, x, sigma, sigma_next, dynamics=dynamics, generator=torch.Generator().manual_seed(1))
    assert out.log_prob.shape == (SHAPE[0],)
    assert out.std.shape == (SHAPE[0], 1, 1, 1)
    assert torch.all(out.std > 0)
    torch.testing.assert_close(out.log_prob, _normal_log_prob(out), atol=1e-5, rtol=0)


DDIM_ALPHAS = [
    (0.3, 0.5),
    (0.05, 0.99),
    (torch.tensor([0.1, 0.5, 0.9]), torch.tensor([0.2, 0.7, 0.95])),  # one timestep per sample
]


@pytest.mark.parametrize("eta", [1.0, 0.5])
@pytest.mark.parametrize("a_t,a_prev", DDIM_ALPHAS)
def test_ddim_log_prob_matches_normal(eta, a_t, a_prev):
    eps, x = _pair(2)
    out = ddim_step(eps, x, a_t, a_prev, eta=eta, generator=torch.Generator().manual_seed(3))
    assert out.log_prob.shape == (SHAPE[0],)
    assert out.std.shape == (SHAPE[0], 1, 1, 1)
    assert torch.all(out.std > 0)
    torch.testing.assert_close(out.log_prob, _normal_log_prob(out), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dynamics", ["flow_sde", "dance_sde", "ode"])
def test_flow_batched_sigma_equals_per_sample_calls(dynamics):
    """A [B] sigma gives sample i exactly what a float sigma = sigma[i] gives it alone."""
    v, x = _pair(4)
    sigma = torch.tensor([1.0, 0.6, 0.2])  # [B]
    sigma_next = torch.tensor([0.9, 0.4, 0.05])  # [B]
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(5))  # [B, *S]
    out = flow_sde_step(v, x, sigma, sigma_next, dynamics=dynamics, noise=noise)
    for i in range(SHAPE[0]):
        one = flow_sde_step(
            v[i : i + 1], x[i : i + 1], float(sigma[i]), float(sigma_next[i]), dynamics=dynamics, noise=noise[i : i + 1]
        )
        torch.testing.assert_close(out.mean[i : i + 1], one.mean, atol=1e-6, rtol=0)
        torch.testing.assert_close(out.std[i : i + 1], one.std, atol=1e-6, rtol=0)
        torch.testing.assert_close(out.log_prob[i : i + 1], one.log_prob, atol=1e-6, rtol=0)


@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_ddim_batched_alphas_equal_per_sample_calls(eta):
    eps, x = _pair(6)
    a_t = torch.tensor([0.1, 0.5, 0.9])  # [B]
    a_prev = torch.tensor([0.2, 0.7, 0.95])  # [B]
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(7))  # [B, *S]
    out = ddim_step(eps, x, a_t, a_prev, eta=eta, noise=noise)
    for i in range(SHAPE[0]):
        one = ddim_step(eps[i : i + 1], x[i : i + 1], float(a_t[i]), float(a_prev[i]), eta=eta, noise=noise[i : i + 1])
        torch.testing.assert_close(out.mean[i : i + 1], one.mean, atol=1e-6, rtol=0)
        torch.testing.assert_close(out.std[i : i + 1], one.std, atol=1e-6, rtol=0)
        torch.testing.assert_close(out.log_prob[i : i + 1], one.log_prob, atol=1e-6, rtol=0)


# --------------------------------------------------------------------------------------------------
# Hand-derived numbers
# --------------------------------------------------------------------------------------------------

# Two elements per sample, B = 1: x = [1, -2], v = [0.5, 1].
X = torch.tensor([[1.0, -2.0]])  # [1, 2]
V = torch.tensor([[0.5, 1.0]])  # [1, 2]


def test_flow_sde_hand_derived_mid_schedule():
    # sigma = 0.5, sigma_next = 0.25, a = 0.7:
    #   g = 0.7 * sqrt(0.5 / (1 - 0.5)) = 0.7, g^2 / (2 sigma) = 0.49 / 1 = 0.49, dt = -0.25
    #   x + (1 - sigma) v = [1 + 0.25, -2 + 0.5] = [1.25, -1.5]
    #   v + 0.49 * [1.25, -1.5] = [0.5 + 0.6125, 1 - 0.735] = [1.1125, 0.265]
    #   mean = x - 0.25 * [1.1125, 0.265] = [0.721875, -2.06625]
    #   std = g * sqrt(-dt) = 0.7 * 0.5 = 0.35
    noise = torch.tensor([[1.0, -2.0]])  # [1, 2]
    out = flow_sde_step(V, X, 0.5, 0.25, noise_level=0.7, dynamics="flow_sde", noise=noise)
    torch.testing.assert_close(out.mean, torch.tensor([[0.721875, -2.06625]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.std, torch.tensor([[0.35]]), atol=1e-7, rtol=0)
    # prev = mean + 0.35 * noise = [0.721875 + 0.35, -2.06625 - 0.7]
    torch.testing.assert_close(out.prev_sample, torch.tensor([[1.071875, -2.76625]]), atol=1e-6, rtol=0)
    # z = noise, so log_prob = mean_i(-z_i^2 / 2) - log 0.35 - log sqrt(2 pi) = -(1 + 4) / 4 - log 0.35 - ...
    expected = -1.25 - math.log(0.35) - LOG_SQRT_2PI
    torch.testing.assert_close(out.log_prob, torch.tensor([expected]), atol=1e-6, rtol=0)


def test_flow_sde_hand_derived_sigma_one():
    # sigma = 1, sigma_next = 0.8, a = 0.7: (1 - sigma) in g becomes (1 - sigma_next) = 0.2
    #   g = 0.7 * sqrt(1 / 0.2) = 0.7 sqrt(5), g^2 = 2.45, g^2 / (2 sigma) = 1.225, dt = -0.2
    #   (1 - sigma) v = 0 in the mean, so mean = x - 0.2 (v + 1.225 x) = 0.755 x - 0.2 v
    #     = [0.755 - 0.1, -1.51 - 0.2] = [0.655, -1.71]
    #   std = 0.7 sqrt(5) * sqrt(0.2) = 0.7
    out = flow_sde_step(V, X, 1.0, 0.8, noise_level=0.7, dynamics="flow_sde", noise=torch.zeros_like(X))
    torch.testing.assert_close(out.mean, torch.tensor([[0.655, -1.71]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.std, torch.tensor([[0.7]]), atol=1e-6, rtol=0)
    # zero noise: prev == mean, z = 0, log_prob = -log 0.7 - log sqrt(2 pi)
    torch.testing.assert_close(out.prev_sample, out.mean, atol=0, rtol=0)
    torch.testing.assert_close(out.log_prob, torch.tensor([-math.log(0.7) - LOG_SQRT_2PI]), atol=1e-6, rtol=0)


def test_flow_sde_sigma_one_batched_uses_each_sigma_next():
    # Batch: sample 0 at sigma = 1 -> 0.8 (g = 0.7 sqrt(1 / 0.2), std = 0.7 as above);
    #        sample 1 at sigma = 1 -> 0.5 (g = 0.7 sqrt(1 / 0.5) = 0.7 sqrt 2, std = 0.7 sqrt 2 sqrt 0.5 = 0.7);
    #        sample 2 at sigma = 0.5 -> 0.25 (std = 0.35 as in the mid-schedule case).
    x = X.repeat(3, 1)  # [3, 2]
    v = V.repeat(3, 1)  # [3, 2]
    out = flow_sde_step(v, x, torch.tensor([1.0, 1.0, 0.5]), torch.tensor([0.8, 0.5, 0.25]), noise=torch.zeros_like(x))
    torch.testing.assert_close(out.std, torch.tensor([[0.7], [0.7], [0.35]]), atol=1e-6, rtol=0)
    # sample 1: g^2 / (2 sigma) = 0.98 / 2 = 0.49, dt = -0.5: mean = x - 0.5 (v + 0.49 x) = 0.755 x - 0.5 v
    #   = [0.755 - 0.25, -1.51 - 0.5] = [0.505, -2.01]
    expected_mean = torch.tensor([[0.655, -1.71], [0.505, -2.01], [0.721875, -2.06625]])
    torch.testing.assert_close(out.mean, expected_mean, atol=1e-6, rtol=0)


def test_dance_sde_hand_derived():
    # sigma = 0.5, sigma_next = 0.25, eta = 0.3: g = 0.3 whatever sigma, g^2 / (2 sigma) = 0.09
    #   mean = x - 0.25 (v + 0.09 (x + 0.5 v)) = 0.9775 x - 0.26125 v
    #     = [0.9775 - 0.130625, -1.955 - 0.26125] = [0.846875, -2.21625]
    #   std = 0.3 * sqrt(0.25) = 0.15
    out = flow_sde_step(V, X, 0.5, 0.25, noise_level=0.3, dynamics="dance_sde", noise=torch.zeros_like(X))
    torch.testing.assert_close(out.mean, torch.tensor([[0.846875, -2.21625]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.std, torch.tensor([[0.15]]), atol=1e-7, rtol=0)
    # At sigma = 1 dance's g stays 0.3 (no sigma / (1 - sigma) factor): std = 0.3 sqrt(0.2)
    out1 = flow_sde_step(V, X, 1.0, 0.8, noise_level=0.3, dynamics="dance_sde", noise=torch.zeros_like(X))
    torch.testing.assert_close(out1.std, torch.tensor([[0.3 * math.sqrt(0.2)]]), atol=1e-7, rtol=0)


def test_cps_hand_derived():
    # sigma = 0.6, sigma_next = 0.4, noise level 0.5 (coefficients-preserving sampling):
    #   x0 = x - 0.6 v = [0.7, -2.6],  x1 = x + 0.4 v = [1.2, -1.6]
    #   std = 0.4 sin(pi / 4) = 0.28284271,  sqrt(0.4^2 - std^2) = sqrt(0.08) = 0.28284271
    #   mean = 0.6 x0 + 0.28284271 x1 = [0.42 + 0.33941125, -1.56 - 0.45254834]
    #   noise [1, -1]: each element at one std, log N = -0.5 - log(0.28284271) - log(2 pi) / 2 = -0.15607421
    noise = torch.tensor([[1.0, -1.0]])
    out = flow_sde_step(V, X, 0.6, 0.4, noise_level=0.5, dynamics="cps", noise=noise)
    torch.testing.assert_close(out.mean, torch.tensor([[0.75941125, -2.01254834]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.std, torch.tensor([[0.28284271]]), atol=1e-7, rtol=0)
    torch.testing.assert_close(out.prev_sample, out.mean + 0.28284271 * noise, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.log_prob, torch.tensor([-0.15607421]), atol=1e-6, rtol=0)
    # a recorded next state is scored, not resampled, with the same density
    again = flow_sde_step(V, X, 0.6, 0.4, noise_level=0.5, dynamics="cps", prev_sample=out.prev_sample)
    torch.testing.assert_close(again.log_prob, out.log_prob, atol=1e-7, rtol=0)


def test_cps_preserves_the_marginal_coefficients():
    # with the exact velocity of x = (1 - s) x0 + s eps (v = eps - x0), a CPS step lands on
    # (1 - s') x0 + [sqrt(s'^2 - std^2) eps + std n]: noise of std s', the marginal at s'
    g = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(4096, 8, generator=g), torch.randn(4096, 8, generator=g)
    s, s_next = 0.7, 0.45
    x = (1 - s) * x0 + s * eps
    for level in (0.3, 0.8, 1.0):
        out = flow_sde_step(eps - x0, x, s, s_next, noise_level=level, dynamics="cps", generator=g)
        residual = out.prev_sample - (1 - s_next) * x0  # [N, 8] the noise part
        assert abs(residual.std().item() - s_next) < 0.01 * s_next, (level, residual.std().item())


def test_ode_hand_derived():
    # mean = x + dt v = [1, -2] - 0.25 [0.5, 1] = [0.875, -2.25]; std 0; prev = mean
    out = flow_sde_step(V, X, 0.5, 0.25, dynamics="ode")
    torch.testing.assert_close(out.mean, torch.tensor([[0.875, -2.25]]), atol=1e-7, rtol=0)
    torch.testing.assert_close(out.prev_sample, torch.tensor([[0.875, -2.25]]), atol=1e-7, rtol=0)
    assert torch.equal(out.std, torch.zeros(1, 1))


def test_flow_sde_with_zero_noise_level_is_the_ode():
    v, x = _pair(8)
    sde = flow_sde_step(v, x, 0.7, 0.5, noise_level=0.0, dynamics="flow_sde", noise=torch.zeros(SHAPE))
    ode = flow_sde_step(v, x, 0.7, 0.5, dynamics="ode")
    torch.testing.assert_close(sde.mean, ode.mean, atol=1e-7, rtol=0)


# DDIM: a_t = 0.36, a_prev = 0.64, so sqrt(a_t) = 0.6, sqrt(1 - a_t) = 0.8, sqrt(a_prev) = 0.8.
# x = [1, -0.2], eps = [0.5, 1]: x0 = (x - 0.8 eps) / 0.6 = [0.6, -1.0] / 0.6 = [1, -5/3]
# var = (1 - 0.64) / (1 - 0.36) * (1 - 0.36 / 0.64) = 0.5625 * 0.4375 = 0.24609375
DDIM_X = torch.tensor([[1.0, -0.2]])  # [1, 2]
DDIM_EPS = torch.tensor([[0.5, 1.0]])  # [1, 2]
DDIM_X0 = (1.0, -5.0 / 3.0)
DDIM_VAR = 0.24609375


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_ddim_hand_derived(eta):
    # std = eta sqrt(var); direction coefficient sqrt(1 - a_prev - std^2) = sqrt(0.36 - eta^2 var):
    #   eta = 0: sqrt(0.36) = 0.6;  eta = 1: sqrt(0.36 - 0.24609375) = sqrt(0.11390625) = 0.3375
    #   mean = 0.8 x0 + coef eps
    std = eta * math.sqrt(DDIM_VAR)
    coef = math.sqrt(0.36 - eta**2 * DDIM_VAR)
    if eta == 0.0:
        assert coef == pytest.approx(0.6, abs=1e-12)
    if eta == 1.0:
        assert coef == pytest.approx(0.3375, abs=1e-12)
    expected_mean = torch.tensor([[0.8 * DDIM_X0[0] + coef * 0.5, 0.8 * DDIM_X0[1] + coef * 1.0]])
    noise = torch.tensor([[2.0, -1.0]])  # [1, 2]
    out = ddim_step(DDIM_EPS, DDIM_X, 0.36, 0.64, eta=eta, noise=noise)
    torch.testing.assert_close(out.mean, expected_mean, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.std, torch.tensor([[std]]), atol=1e-7, rtol=0)
    if eta == 0.0:
        # deterministic: the noise has nothing to scale
        torch.testing.assert_close(out.prev_sample, expected_mean, atol=1e-6, rtol=0)
        assert torch.equal(out.log_prob, torch.zeros(1))
    else:
        torch.testing.assert_close(out.prev_sample, expected_mean + std * noise, atol=1e-6, rtol=0)
        # z = noise: log_prob = -(4 + 1) / 4 - log std - log sqrt(2 pi)
        expected_lp = -1.25 - math.log(std) - LOG_SQRT_2PI
        torch.testing.assert_close(out.log_prob, torch.tensor([expected_lp]), atol=1e-6, rtol=0)


# --------------------------------------------------------------------------------------------------
# Parity with diffusers' schedulers
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_ode_matches_flow_match_euler_scheduler(shift):
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    num_steps = 8
    scheduler.set_timesteps(num_steps)
    sigmas = scheduler.sigmas  # [num_steps + 1], float32, ends at 0
    assert sigmas.dtype == torch.float32
    assert sigmas[0].item() == pytest.approx(1.0, abs=1e-6)
    assert sigmas[-1].item() == 0.0
    for i, t in enumerate(scheduler.timesteps):
        v, x = _pair(100 + i)
        expected = scheduler.step(v, t, x).prev_sample  # advances scheduler.step_index
        ours = flow_sde_step(v, x, sigmas[i], sigmas[i + 1], dynamics="ode")
        assert expected.dtype == ours.prev_sample.dtype == torch.float32
        torch.testing.assert_close(ours.prev_sample, expected, atol=1e-5, rtol=0)
    assert scheduler.step_index == num_steps


def test_flow_sde_matches_flow_grpo_expanded_form_on_sd3_schedule():
    """Flow-GRPO's ``sde_step_with_logprob`` writes the same mean in expanded form, with
    ``sigma_max = sigmas[1]`` standing in for sigma at sigma == 1 (only step 0 has sigma == 1)::

        std_dev_t = sqrt(sigma / (1 - where(sigma == 1, sigma_max, sigma))) * a
        mean = x (1 + std_dev_t^2 / (2 sigma) dt) + v (1 + std_dev_t^2 (1 - sigma) / (2 sigma)) dt
        std  = std_dev_t sqrt(-dt)
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    scheduler.set_timesteps(10)
    sigmas = scheduler.sigmas  # [11]
    sigma_max = sigmas[1]
    a = 0.7
    for i in range(len(sigmas) - 1):
        v, x = _pair(400 + i)
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        dt = sigma_next - sigma
        std_dev_t = torch.sqrt(sigma / (1 - torch.where(sigma == 1, sigma_max, sigma))) * a
        mean = x * (1 + std_dev_t**2 / (2 * sigma) * dt) + v * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
        out = flow_sde_step(v, x, sigma, sigma_next, noise_level=a, noise=torch.zeros(SHAPE))
        torch.testing.assert_close(out.mean, mean, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            out.std, (std_dev_t * torch.sqrt(-dt)).expand(SHAPE[0], 1, 1, 1), atol=1e-6, rtol=1e-6
        )


def test_dance_sde_matches_dancegrpo_score_form():
    """DanceGRPO writes the step through the score of x_sigma = (1 - sigma) x0 + sigma eps::

    x0 = x - sigma v,  score = -(x - (1 - sigma) x0) / sigma^2
    mean = x + dt v + dt (-eta^2 / 2) score,  std = eta sqrt(-dt)
    """
    v, x = _pair(500)
    eta = 0.3
    for sigma, sigma_next in [(1.0, 0.9), (0.6, 0.45), (0.1, 0.0)]:
        dt = sigma_next - sigma
        x0 = x - sigma * v
        score = -(x - (1 - sigma) * x0) / sigma**2
        mean = x + dt * v + dt * (-0.5 * eta**2 * score)
        out = flow_sde_step(v, x, sigma, sigma_next, dynamics="dance_sde", noise_level=eta, noise=torch.zeros(SHAPE))
        torch.testing.assert_close(out.mean, mean, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.std, torch.full((SHAPE[0], 1, 1, 1), eta * math.sqrt(-dt)), atol=1e-6, rtol=0)


def _ddim_scheduler(num_steps: int):
    from diffusers import DDIMScheduler

    scheduler = DDIMScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    scheduler.set_timesteps(num_steps)
    return scheduler


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_ddim_matches_diffusers_ddim_scheduler(eta):
    num_steps = 10
    scheduler = _ddim_scheduler(num_steps)
    stride = scheduler.config.num_train_timesteps // num_steps
    used_final_alpha = False
    for i, t in enumerate(scheduler.timesteps):
        eps, x = _pair(200 + i)
        t_int = int(t)
        prev_t = t_int - stride
        a_t = scheduler.alphas_cumprod[t_int]
        if prev_t >= 0:
            a_prev = scheduler.alphas_cumprod[prev_t]
        else:
            a_prev = scheduler.final_alpha_cumprod
            used_final_alpha = True
        if eta == 0.0:
            expected = scheduler.step(eps, t, x, eta=0.0).prev_sample
            ours = ddim_step(eps, x, a_t, a_prev, eta=0.0)
        else:
            noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(300 + i))  # [B, *S]
            expected = scheduler.step(eps, t, x, eta=eta, variance_noise=noise).prev_sample
            ours = ddim_step(eps, x, a_t, a_prev, eta=eta, noise=noise)
        assert expected.dtype == ours.prev_sample.dtype == torch.float32
        torch.testing.assert_close(ours.prev_sample, expected, atol=1e-5, rtol=0)
    assert used_final_alpha  # the last step (t = 1) goes to final_alpha_cumprod


# --------------------------------------------------------------------------------------------------
# Sampling vs scoring a recorded sample; RNG behaviour
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(STEPS))
def test_rescoring_prev_sample_reproduces_log_prob(name):
    step = STEPS[name]
    m, x = _pair(10)
    sampled = step(m, x, generator=torch.Generator().manual_seed(11))
    scored = step(m, x, prev_sample=sampled.prev_sample)
    assert torch.equal(scored.prev_sample, sampled.prev_sample)
    assert torch.equal(scored.mean, sampled.mean)
    assert torch.equal(scored.std, sampled.std)
    assert torch.equal(scored.log_prob, sampled.log_prob)
    if name in STOCHASTIC:
        # a different recorded sample must score differently, or the check above is vacuous
        other = step(m, x, prev_sample=sampled.prev_sample + 0.1)
        assert not torch.allclose(other.log_prob, sampled.log_prob, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", list(STEPS))
def test_noise_and_prev_sample_together_raise(name):
    m, x = _pair(12)
    with pytest.raises(ValueError, match="at most one"):
        STEPS[name](m, x, noise=torch.zeros(SHAPE), prev_sample=x)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_generator_determinism(name):
    step = STEPS[name]
    m, x = _pair(13)
    a = step(m, x, generator=torch.Generator().manual_seed(14))
    b = step(m, x, generator=torch.Generator().manual_seed(14))
    c = step(m, x, generator=torch.Generator().manual_seed(15))
    assert torch.equal(a.prev_sample, b.prev_sample)
    assert torch.equal(a.log_prob, b.log_prob)
    assert not torch.allclose(a.prev_sample, c.prev_sample, atol=1e-3, rtol=0)
    # The draw is standard normal noise from the generator, scaled by the returned std.
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(14))  # [B, *S]
    torch.testing.assert_close(a.prev_sample, a.mean + a.std * noise, atol=1e-6, rtol=0)
    torch.testing.assert_close(step(m, x, noise=noise).prev_sample, a.prev_sample, atol=0, rtol=0)


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_deterministic_steps_have_zero_std_and_log_prob(name):
    step = STEPS[name]
    m, x = _pair(16)
    out = step(m, x)
    assert torch.equal(out.std, torch.zeros(SHAPE[0], 1, 1, 1))
    assert out.log_prob.dtype == torch.float32
    assert torch.equal(out.log_prob, torch.zeros(SHAPE[0]))
    assert torch.equal(out.prev_sample, out.mean)
    # Scoring any recorded sample is also exactly 0 (no nan from the zero std).
    assert torch.equal(step(m, x, prev_sample=x).log_prob, torch.zeros(SHAPE[0]))


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_deterministic_steps_do_not_consume_rng(name):
    step = STEPS[name]
    m, x = _pair(17)
    g = torch.Generator().manual_seed(18)
    state = g.get_state()
    step(m, x, generator=g)
    assert torch.equal(g.get_state(), state)

    torch.manual_seed(19)
    step(m, x)
    after_call = torch.randn(8)
    torch.manual_seed(19)
    untouched = torch.randn(8)
    assert torch.equal(after_call, untouched)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_stochastic_steps_consume_the_global_rng_without_generator(name):
    """Counterpart of the test above: without a generator, the draw comes from the global RNG."""
    step = STEPS[name]
    m, x = _pair(20)
    torch.manual_seed(21)
    a = step(m, x)
    torch.manual_seed(21)
    b = step(m, x)
    assert torch.equal(a.prev_sample, b.prev_sample)
    torch.manual_seed(21)
    torch.testing.assert_close(a.prev_sample, a.mean + a.std * torch.randn(SHAPE), atol=1e-6, rtol=0)


# --------------------------------------------------------------------------------------------------
# bf16 inputs
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(STEPS))
def test_bf16_inputs(name):
    step = STEPS[name]
    m, x = _pair(22, dtype=torch.bfloat16)
    out = step(m, x, generator=torch.Generator().manual_seed(23))
    assert out.prev_sample.dtype == torch.bfloat16
    assert out.log_prob.dtype == out.mean.dtype == out.std.dtype == torch.float32
    assert torch.isfinite(out.log_prob).all()
    # The recorded log-prob is that of the bf16 sample actually stored, so training's first
    # recomputation gives ratio exactly 1.
    rescored = step(m, x, prev_sample=out.prev_sample)
    assert torch.equal(rescored.log_prob, out.log_prob)
    assert torch.equal(torch.exp(rescored.log_prob - out.log_prob), torch.ones(SHAPE[0]))
    if name in STOCHASTIC:
        torch.testing.assert_close(out.log_prob, _normal_log_prob(out), atol=1e-5, rtol=0)


def test_bf16_mean_is_computed_in_float32():
    # The mean from bf16 inputs equals the float32 computation on the same (bf16-representable) values.
    v, x = _pair(24, dtype=torch.bfloat16)
    out = flow_sde_step(v, x, 0.3, 0.2, noise=torch.zeros(SHAPE))
    ref = flow_sde_step(v.float(), x.float(), 0.3, 0.2, noise=torch.zeros(SHAPE))
    torch.testing.assert_close(out.mean, ref.mean, atol=0, rtol=0)
    torch.testing.assert_close(out.std, ref.std, atol=0, rtol=0)


# --------------------------------------------------------------------------------------------------
# gaussian_log_prob
# --------------------------------------------------------------------------------------------------


def test_gaussian_log_prob_matches_normal_and_zero_std_gives_zero():
    g = torch.Generator().manual_seed(25)
    x = torch.randn(SHAPE, generator=g)  # [B, *S]
    mean = torch.randn(SHAPE, generator=g)  # [B, *S]
    std = torch.tensor([0.5, 0.0, 2.0]).reshape(3, 1, 1, 1)  # [B, 1, 1, 1], sample 1 deterministic
    lp = gaussian_log_prob(x, mean, std)
    assert lp.shape == (3,)
    assert lp.dtype == torch.float32
    assert lp[1].item() == 0.0
    assert torch.isfinite(lp).all()
    for i in (0, 2):
        ref = Normal(mean[i], std[i]).log_prob(x[i]).mean()
        torch.testing.assert_close(lp[i], ref, atol=1e-5, rtol=0)


def test_gaussian_log_prob_zero_std_has_finite_gradient():
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(26))  # [2, 3]
    mean = torch.zeros(2, 3, requires_grad=True)  # [2, 3]
    std = torch.tensor([[0.0], [1.0]])  # [2, 1]
    gaussian_log_prob(x, mean, std).sum().backward()
    assert torch.isfinite(mean.grad).all()
    assert torch.equal(mean.grad[0], torch.zeros(3))
    # d/dmean of mean_j(-(x_j - mean_j)^2 / 2) at mean = 0 is x_j / 3
    torch.testing.assert_close(mean.grad[1], x[1] / 3, atol=1e-6, rtol=0)


def test_gaussian_log_prob_bf16_inputs_return_float32():
    x = torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16)  # [1, 2]
    mean = torch.zeros(1, 2, dtype=torch.bfloat16)  # [1, 2]
    std = torch.ones(1, 1, dtype=torch.bfloat16)  # [1, 1]
    lp = gaussian_log_prob(x, mean, std)
    assert lp.dtype == torch.float32
    # mean of -z^2 / 2 over [1, 2] = -(1 + 4) / 4; log 1 = 0
    torch.testing.assert_close(lp, torch.tensor([-1.25 - LOG_SQRT_2PI]), atol=1e-6, rtol=0)


# --------------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", STOCHASTIC)
def test_gradient_flows_to_model_output(name):
    step = STEPS[name]
    m, x = _pair(27)
    with torch.no_grad():
        recorded = step(m, x, generator=torch.Generator().manual_seed(28)).prev_sample
    m = m.clone().requires_grad_(True)
    out = step(m, x, prev_sample=recorded)
    out.log_prob.sum().backward()
    assert m.grad is not None
    assert torch.isfinite(m.grad).all()
    assert m.grad.abs().sum() > 0


def test_flow_sde_gradient_matches_hand_derivative():
    # log_prob = mean_j(-(y_j - mean_j)^2 / (2 std^2)) + const, with mean = x + dt (v + c (x + (1 - s) v)),
    # c = g^2 / (2 s). d mean_j / d v_j = dt (1 + c (1 - s)), so
    # d log_prob / d v_j = (y_j - mean_j) / std^2 * dt (1 + c (1 - s)) / N.
    # sigma = 0.5, sigma_next = 0.25, a = 0.7: dt = -0.25, c = 0.49, std = 0.35, N = 2.
    v = V.clone().requires_grad_(True)
    y = torch.tensor([[2.0, -1.0]])  # [1, 2]
    out = flow_sde_step(v, X, 0.5, 0.25, noise_level=0.7, prev_sample=y)
    out.log_prob.sum().backward()
    mean = torch.tensor([[0.721875, -2.06625]])  # from test_flow_sde_hand_derived_mid_schedule
    expected = (y - mean) / 0.35**2 * (-0.25) * (1 + 0.49 * 0.5) / 2
    torch.testing.assert_close(v.grad, expected, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------------------------
# Bad inputs
# --------------------------------------------------------------------------------------------------


def test_unknown_dynamics_raises():
    v, x = _pair(29)
    with pytest.raises(ValueError, match="dynamics"):
        flow_sde_step(v, x, 0.5, 0.25, dynamics="sde")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "sigma,sigma_next",
    [
        (torch.tensor([0.5, 0.4]), 0.25),  # B = 2 for a batch of 3
        (0.5, torch.tensor([0.25, 0.2, 0.1, 0.0])),  # B = 4
        (torch.full((3, 1), 0.5), 0.25),  # not 1-D
    ],
)
def test_flow_sigma_with_wrong_shape_raises(sigma, sigma_next):
    v, x = _pair(30)
    with pytest.raises(ValueError, match="B=3"):
        flow_sde_step(v, x, sigma, sigma_next)


def test_ddim_alpha_with_wrong_shape_raises():
    eps, x = _pair(31)
    with pytest.raises(ValueError, match="B=3"):
        ddim_step(eps, x, torch.tensor([0.5, 0.6]), 0.7)
    with pytest.raises(ValueError, match="B=3"):
        ddim_step(eps, x, 0.5, torch.tensor([0.6, 0.7, 0.8, 0.9]))


def test_noise_and_prev_sample_shapes_must_match_the_batch() -> None:
    v, x = torch.randn(3, 4), torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"noise has shape \(1, 4\), expected \(3, 4\)"):
        flow_sde_step(v, x, 0.5, 0.25, noise=torch.randn(1, 4))
    with pytest.raises(ValueError, match=r"prev_sample has shape \(1, 4\)"):
        ddim_step(v, x, 0.36, 0.64, prev_sample=torch.randn(1, 4))


def test_negative_eta_is_refused() -> None:
    with pytest.raises(ValueError, match="eta must be >= 0"):
        ddim_step(torch.randn(2, 3), torch.randn(2, 3), 0.36, 0.64, eta=-1.0)
