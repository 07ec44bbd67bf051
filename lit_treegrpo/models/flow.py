"""What every rectified-flow family shares: a ``FlowMatchEulerDiscreteScheduler`` sigma table and the flow SDE / ODE
step (:func:`lit_treegrpo.core.steps.flow_sde_step`)."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor

from ..core.choices import check_choice
from ..core.steps import SDEDynamics, StepOutput, flow_sde_step
from .base import DiffusionAdapter, ScheduleTables


class FlowMatchingAdapter(DiffusionAdapter):
    """A :class:`DiffusionAdapter` whose model predicts the flow velocity ``v = eps - x0``."""

    noise_level: float
    dynamics: SDEDynamics

    def _init_flow(self, noise_level: float, dynamics: SDEDynamics) -> None:
        check_choice("dynamics", dynamics, SDEDynamics)
        if noise_level <= 0:
            raise ValueError(f"noise_level must be > 0, got {noise_level}")
        if dynamics == "cps" and noise_level > 1:
            raise ValueError(
                f"noise_level must be in (0, 1] with dynamics cps (the step's std is sigma_next * sin(noise_level * pi / 2)), "
                f"got {noise_level}; Flow-GRPO uses about 0.8"
            )
        self.noise_level = noise_level
        self.dynamics = dynamics

    def _set_schedule(self, scheduler: Any, **kwargs: Any) -> None:
        """Sigmas and model timesteps per step index, exactly as the pipelines set them
        (``kwargs`` go to ``scheduler.set_timesteps``, e.g. SD3's resolution-dependent ``mu``)."""
        scheduler.set_timesteps(self.num_steps, **kwargs)
        self._schedule = ScheduleTables(
            t=scheduler.timesteps.float().cpu(),  # [T] model timesteps (sigma * 1000)
            sigmas=scheduler.sigmas.float().cpu(),  # [T + 1], ends at 0
        )
        self._schedule_kwargs = kwargs  # what the parity tests pass to the pipeline

    def _set_token_schedule(self, scheduler: Any, tokens: int) -> None:
        """FluxPipeline's and QwenImagePipeline's sigmas: ``linspace(1, 1/T, T)`` through the
        scheduler (unless it makes its own flow sigmas), with ``mu = calculate_shift(tokens)`` for a
        scheduler that shifts dynamically, so the schedule depends on the packed latent's length."""
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift  # QwenImagePipeline's is a copy

        config = scheduler.config
        kwargs: dict[str, Any] = {}
        if not config.get("use_flow_sigmas", False):
            kwargs["sigmas"] = np.linspace(1.0, 1 / self.num_steps, self.num_steps)
        kwargs["mu"] = calculate_shift(
            tokens,
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        self._set_schedule(scheduler, **kwargs)

    def timesteps(self, step_index: Tensor) -> Tensor:
        return self._schedule.on(step_index.device)["t"][step_index]  # [B]

    def sigmas(self) -> Tensor:
        """[T + 1] the noise level before each step and after the last (ends at 0)."""
        return self._schedule.host["sigmas"].clone()

    def step_size(self, step_index: Tensor) -> Tensor:
        """[B] ``|dt| = sigma - sigma_next`` of each step (Flow-GRPO's KL form needs it)."""
        sigmas = self._schedule.on(step_index.device)["sigmas"]  # [T + 1]
        return sigmas[step_index] - sigmas[step_index + 1]  # [B]

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
        idx = self._step_indices(step_index, x.shape[0], x.device)  # [B]
        sigmas = self._schedule.on(x.device)["sigmas"]  # [T + 1]
        return flow_sde_step(
            model_output,
            x,
            sigmas[idx],  # [B]
            sigmas[idx + 1],  # [B]
            noise_level=self.noise_level,
            dynamics=self.dynamics if stochastic else "ode",
            noise=noise,
            prev_sample=prev_sample,
        )
