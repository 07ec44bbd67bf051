"""Cheap stand-ins for a model so that the engine can be tested without diffusers."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_treegrpo.core.steps import StepOutput, flow_sde_step


class ToyFlow:
    """A deterministic 'model' ``v = a * x + cond`` on a linear sigma schedule, counting calls."""

    def __init__(self, num_steps: int, a: float = 0.1, noise_level: float = 0.7) -> None:
        self.sigmas = torch.linspace(1.0, 0.0, num_steps + 1)
        self.a = a
        self.noise_level = noise_level
        self.calls: list[int] = []  # batch size of every predict() call

    def predict(self, x: Tensor, step_index: int | Tensor, cond: Tensor) -> Tensor:
        self.calls.append(x.shape[0])
        return self.a * x + cond.reshape((-1,) + (1,) * (x.ndim - 1))

    def step(
        self,
        model_output: Tensor,
        x: Tensor,
        step_index: int | Tensor,
        *,
        stochastic: bool,
        noise: Tensor | None = None,
        prev_sample: Tensor | None = None,
    ) -> StepOutput:
        t = torch.as_tensor(step_index)
        return flow_sde_step(
            model_output,
            x,
            self.sigmas[t],
            self.sigmas[t + 1],
            noise_level=self.noise_level,
            dynamics="flow_sde" if stochastic else "ode",
            noise=noise,
            prev_sample=prev_sample,
        )
