"""Stable Diffusion 1.x / 2.x: ``UNet2DConditionModel`` + DDIM with stochasticity ``eta`` (DDPO)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from ..core.steps import StepOutput, ddim_step
from .base import (
    Cond,
    DiffusionAdapter,
    ScheduleTables,
    load_component,
    parse_dtype,
    pipeline_from,
)
from .lora import SD15_LORA_TARGETS, LoraSettings
from .text import check_tokenizer, quiet_truncation_logs


class SD15Adapter(DiffusionAdapter):
    """SD 1.x / 2.x as a tree-rollout policy.

    Args:
        pretrained: a local folder or hub id of a diffusers SD 1.x/2.x checkpoint, or a
            ``StableDiffusionPipeline`` (its scheduler config is reused as DDIM).
        num_steps: DDIM steps (DDPO: 50).
        guidance_scale: CFG weight (DDPO: 5.0); <= 1 disables CFG.
        eta: DDIM stochasticity of SDE steps (1.0 as DDPO).
        negative_prompt: unconditional prompt of CFG.
        resolution: image side in pixels; ``None`` uses the UNet's native size.
        lora: LoRA settings (``None``: fine-tune the whole UNet).
        torch_dtype: weights dtype, ``float32``, ``bfloat16`` or ``float16``.
        revision, variant: forwarded to ``from_pretrained``.
        gradient_checkpointing: trade compute for activation memory in the backward pass.
        decode_batch_size: images per VAE decode call.
        compile: ``torch.compile`` the denoiser in place (names, LoRA and checkpoints unchanged); not with FSDP2.
        master_weights: full fine-tuning in bfloat16 / float16 keeps float32 master weights (false: warned).
        channels_last: keep the UNet's convolutions in channels-last memory format (faster
            convolutions on recent GPUs; the same numbers up to float rounding).
    """

    lora_layers_arg = "unet"

    def __init__(
        self,
        pretrained: str | Path | object,
        *,
        num_steps: int = 50,
        guidance_scale: float = 5.0,
        eta: float = 1.0,
        negative_prompt: str = "",
        resolution: int | None = None,
        lora: LoraSettings | None = LoraSettings(rank=4, alpha=4.0),
        torch_dtype: str = "float32",
        revision: str | None = None,
        variant: str | None = None,
        gradient_checkpointing: bool = False,
        decode_batch_size: int = 8,
        compile: bool = False,
        master_weights: bool = True,
        channels_last: bool = False,
    ) -> None:
        super().__init__(
            num_steps=num_steps,
            guidance_scale=guidance_scale,
            negative_prompt=negative_prompt,
            lora=lora,
            gradient_checkpointing=gradient_checkpointing,
            decode_batch_size=decode_batch_size,
            compile=compile,
            master_weights=master_weights,
        )
        from diffusers import DDIMScheduler, StableDiffusionPipeline

        if eta <= 0:
            raise ValueError(f"eta must be > 0 for a stochastic policy (DDPO uses 1.0), got {eta}")
        self.eta = eta
        pipe = pipeline_from(
            pretrained,
            StableDiffusionPipeline,
            torch_dtype,
            lambda path: self._load(path, parse_dtype(torch_dtype), revision, variant),
        )
        # The policy is DDIM whatever scheduler the checkpoint ships (SD 1.5 ships PNDM).
        pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
        self.pipeline = pipe  # not a module: keeps encode_prompt and save_lora_weights at hand
        self.denoiser = pipe.unet
        self.vae = pipe.vae
        self.text_encoder = pipe.text_encoder
        prediction = pipe.scheduler.config.prediction_type
        if prediction not in ("epsilon", "v_prediction"):
            raise ValueError(f"scheduler prediction_type {prediction!r} is not supported (epsilon, v_prediction)")
        self.prediction_type = prediction
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        self.resolution = resolution or self.denoiser.config.sample_size * self.vae_scale_factor
        if self.resolution % self.vae_scale_factor:
            raise ValueError(f"resolution must be a multiple of {self.vae_scale_factor}, got {self.resolution}")
        self._setup_schedule()
        self.channels_last = channels_last
        if channels_last:
            self.denoiser.to(memory_format=torch.channels_last)
        self._setup_training(SD15_LORA_TARGETS)

    @staticmethod
    def _load(path: str, dtype: torch.dtype, revision: str | None, variant: str | None):
        from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
        from transformers import CLIPTextModel, CLIPTokenizer

        kw = dict(revision=revision)
        weights = dict(kw, torch_dtype=dtype, variant=variant)
        tokenizer = load_component(CLIPTokenizer, path, "tokenizer", **kw)
        check_tokenizer(tokenizer, f"{path}/tokenizer")
        return StableDiffusionPipeline(
            vae=load_component(AutoencoderKL, path, "vae", **weights),
            text_encoder=load_component(CLIPTextModel, path, "text_encoder", **weights),
            tokenizer=tokenizer,
            unet=load_component(UNet2DConditionModel, path, "unet", **weights),
            scheduler=load_component(DDIMScheduler, path, "scheduler", **kw),
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )

    def _setup_schedule(self) -> None:
        """DDIM timesteps and cumulative alphas per step index (float32 tables, not buffers, so
        that a half-precision cast of the module leaves them exact)."""
        scheduler = self.pipeline.scheduler
        scheduler.set_timesteps(self.num_steps)
        t = scheduler.timesteps.long()  # [T] model timesteps, descending
        prev = t - scheduler.config.num_train_timesteps // self.num_steps  # [T]
        alphas = scheduler.alphas_cumprod.float()  # [1000]
        final = torch.as_tensor(scheduler.final_alpha_cumprod, dtype=torch.float32)
        self._schedule = ScheduleTables(
            t=t,
            alpha_t=alphas[t],  # [T]
            alpha_prev=torch.where(prev >= 0, alphas[prev.clamp(min=0)], final),  # [T]
        )

    # ------------------------------------------------------------------------ contract
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        tokenizer = self.pipeline.tokenizer
        self.truncation(tokenizer, prompts, tokenizer.model_max_length, "CLIP")
        with quiet_truncation_logs(self.pipeline):
            embeds, negative = self.pipeline.encode_prompt(
                prompts,
                device=self.device,
                num_images_per_prompt=1,
                do_classifier_free_guidance=self.do_cfg,
                negative_prompt=[self.negative_prompt] * len(prompts) if self.do_cfg else None,
            )
        cond = {"prompt_embeds": embeds}  # [P, L, D]
        if self.do_cfg:
            cond["negative_prompt_embeds"] = negative  # [P, L, D]
        return cond

    def timesteps(self, step_index: Tensor) -> Tensor:
        return self._schedule.on(step_index.device)["t"][step_index]  # [B]

    def _denoise(self, x: Tensor, t: Tensor, cond: Cond, *, negative: bool) -> Tensor:
        text = cond["prompt_embeds"]
        if negative:
            text = torch.cat([cond["negative_prompt_embeds"], text])  # [2B, L, D]
        return self.denoiser(x.to(self.dtype), t, encoder_hidden_states=text.to(self.dtype), return_dict=False)[0]

    def initial_noise(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        side = self.resolution // self.vae_scale_factor
        noise = self._draw_noise((n, self.denoiser.config.in_channels, side, side), generator)
        return noise * self.pipeline.scheduler.init_noise_sigma

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
        tables = self._schedule.on(x.device)
        alpha_t = tables["alpha_t"][idx]  # [B]
        alpha_prev = tables["alpha_prev"][idx]  # [B]
        eps = model_output.float()  # [B, C, h, w]
        if self.prediction_type == "v_prediction":
            a = alpha_t.reshape(-1, 1, 1, 1)
            eps = a.sqrt() * eps + (1 - a).sqrt() * x.float()  # DDIMScheduler's v -> epsilon
        return ddim_step(
            eps,
            x,
            alpha_t,
            alpha_prev,
            eta=self.eta if stochastic else 0.0,
            noise=noise,
            prev_sample=prev_sample,
        )

    def decode(self, latents: Tensor) -> Tensor:
        return self._decode_with(self.vae, latents / self.vae.config.scaling_factor)
