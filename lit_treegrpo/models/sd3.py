"""Stable Diffusion 3 / 3.5: ``SD3Transformer2DModel`` + rectified-flow SDE (Flow-GRPO)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from ..core.steps import SDEDynamics
from .base import Cond, load_component, parse_dtype, pipeline_from
from .flow import FlowMatchingAdapter
from .lora import SD3_LORA_TARGETS, LoraSettings
from .text import check_tokenizer, quiet_truncation_logs


class SD3Adapter(FlowMatchingAdapter):
    """SD3 / SD3.5 as a tree-rollout policy.

    Args:
        pretrained: a local folder or hub id of a diffusers SD3 checkpoint, or a ``StableDiffusion3Pipeline``.
        num_steps: denoising steps (the papers: 10).
        guidance_scale: CFG weight (the papers: 4.5); <= 1 disables CFG.
        noise_level: ``a`` of the Flow-GRPO SDE (0.7) or ``eta`` of the DanceGRPO SDE (0.3).
        dynamics: ``flow_sde``, ``dance_sde`` or ``cps`` for the stochastic steps.
        negative_prompt: unconditional prompt of CFG.
        resolution: image side in pixels; ``None`` uses the transformer's native size.
        use_t5: load and run the T5 encoder; ``False`` feeds zeros in its place.
        max_sequence_length: T5 tokens (Flow-GRPO uses 128; diffusers' default 256).
        lora: LoRA settings (``None``: fine-tune the whole transformer).
        torch_dtype: weights dtype, ``float32``, ``bfloat16`` or ``float16``.
        revision, variant: forwarded to ``from_pretrained``.
        gradient_checkpointing: trade compute for activation memory in the backward pass.
        decode_batch_size: images per VAE decode call.
        compile: ``torch.compile`` the denoiser in place (names, LoRA and checkpoints unchanged); not with FSDP2.
        master_weights: full fine-tuning in bfloat16 / float16 keeps float32 master weights (false: warned).
    """

    lora_layers_arg = "transformer"

    def __init__(
        self,
        pretrained: str | Path | object,
        *,
        num_steps: int = 10,
        guidance_scale: float = 4.5,
        noise_level: float = 0.7,
        dynamics: SDEDynamics = "flow_sde",
        negative_prompt: str = "",
        resolution: int | None = None,
        use_t5: bool = True,
        max_sequence_length: int = 128,
        lora: LoraSettings | None = LoraSettings(rank=32, alpha=64.0),
        torch_dtype: str = "float32",
        revision: str | None = None,
        variant: str | None = None,
        gradient_checkpointing: bool = False,
        decode_batch_size: int = 8,
        compile: bool = False,
        master_weights: bool = True,
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
        from diffusers import StableDiffusion3Pipeline

        self._init_flow(noise_level, dynamics)
        if max_sequence_length < 1:
            raise ValueError(f"max_sequence_length must be >= 1, got {max_sequence_length}")
        self.max_sequence_length = max_sequence_length
        pipe = pipeline_from(
            pretrained,
            StableDiffusion3Pipeline,
            torch_dtype,
            lambda path: self._load(path, parse_dtype(torch_dtype), revision, variant, use_t5),
        )
        if not use_t5:
            pipe.text_encoder_3, pipe.tokenizer_3 = None, None
        self.pipeline = pipe  # not a module: keeps encode_prompt and save_lora_weights at hand
        self.denoiser = pipe.transformer
        self.vae = pipe.vae
        self.text_encoder = pipe.text_encoder
        self.text_encoder_2 = pipe.text_encoder_2
        self.text_encoder_3 = pipe.text_encoder_3
        self.vae_scale_factor = pipe.vae_scale_factor
        self.resolution = resolution or self.denoiser.config.sample_size * self.vae_scale_factor
        multiple = self.vae_scale_factor * self.denoiser.config.patch_size
        if self.resolution % multiple:
            raise ValueError(f"resolution must be a multiple of {multiple}, got {self.resolution}")
        self._setup_schedule()
        self._setup_training(SD3_LORA_TARGETS)

    def unused_modules(self, model: torch.nn.Module) -> tuple[str, ...]:
        return sd3_unused_modules(model)

    @staticmethod
    def _load(path: str, dtype: torch.dtype, revision: str | None, variant: str | None, use_t5: bool):
        from diffusers import (
            AutoencoderKL,
            FlowMatchEulerDiscreteScheduler,
            SD3Transformer2DModel,
            StableDiffusion3Pipeline,
        )
        from transformers import CLIPTextModelWithProjection, CLIPTokenizer, T5EncoderModel, T5TokenizerFast

        kw = dict(revision=revision)
        weights = dict(kw, torch_dtype=dtype, variant=variant)
        tokenizers = {}
        for name, cls in [("tokenizer", CLIPTokenizer), ("tokenizer_2", CLIPTokenizer)] + (
            [("tokenizer_3", T5TokenizerFast)] if use_t5 else []
        ):
            tokenizers[name] = load_component(cls, path, name, **kw)
            check_tokenizer(tokenizers[name], f"{path}/{name}")
        return StableDiffusion3Pipeline(
            transformer=load_component(SD3Transformer2DModel, path, "transformer", **weights),
            scheduler=load_component(FlowMatchEulerDiscreteScheduler, path, "scheduler", **kw),
            vae=load_component(AutoencoderKL, path, "vae", **weights),
            text_encoder=load_component(CLIPTextModelWithProjection, path, "text_encoder", **weights),
            text_encoder_2=load_component(CLIPTextModelWithProjection, path, "text_encoder_2", **weights),
            text_encoder_3=load_component(T5EncoderModel, path, "text_encoder_3", **weights) if use_t5 else None,
            tokenizer=tokenizers["tokenizer"],
            tokenizer_2=tokenizers["tokenizer_2"],
            tokenizer_3=tokenizers.get("tokenizer_3"),
        )

    def _setup_schedule(self) -> None:
        """The scheduler's sigmas, with the resolution-dependent shift when its config asks for it."""
        from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift

        scheduler = self.pipeline.scheduler
        kwargs = {}
        if scheduler.config.get("use_dynamic_shifting", False):
            side = self.resolution // self.vae_scale_factor // self.denoiser.config.patch_size
            kwargs["mu"] = calculate_shift(
                side * side,
                scheduler.config.get("base_image_seq_len", 256),
                scheduler.config.get("max_image_seq_len", 4096),
                scheduler.config.get("base_shift", 0.5),
                scheduler.config.get("max_shift", 1.16),
            )
        self._set_schedule(scheduler, **kwargs)

    # ------------------------------------------------------------------------ contract
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        pipe = self.pipeline
        # both CLIPs share the vocabulary and the limit, so one count covers them
        self.truncation(pipe.tokenizer, prompts, pipe.tokenizer_max_length, "CLIP")
        if pipe.tokenizer_3 is not None:
            self.truncation(pipe.tokenizer_3, prompts, self.max_sequence_length, "T5")
        with quiet_truncation_logs(pipe):
            embeds, negative, pooled, negative_pooled = pipe.encode_prompt(
                prompt=prompts,
                prompt_2=None,
                prompt_3=None,
                device=self.device,
                do_classifier_free_guidance=self.do_cfg,
                negative_prompt=[self.negative_prompt] * len(prompts) if self.do_cfg else None,
                max_sequence_length=self.max_sequence_length,
            )
        cond = {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}  # [P, L, D], [P, D']
        if self.do_cfg:
            cond["negative_prompt_embeds"] = negative
            cond["negative_pooled_prompt_embeds"] = negative_pooled
        return cond

    def _denoise(self, x: Tensor, t: Tensor, cond: Cond, *, negative: bool) -> Tensor:
        return sd3_transformer_forward(self.denoiser, x, t, cond, negative=negative, dtype=self.dtype)

    def initial_noise(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        side = self.resolution // self.vae_scale_factor
        return self._draw_noise((n, self.denoiser.config.in_channels, side, side), generator)

    def decode(self, latents: Tensor) -> Tensor:
        config = self.vae.config
        return self._decode_with(self.vae, latents / config.scaling_factor + config.shift_factor)


def sd3_unused_modules(transformer: torch.nn.Module) -> tuple[str, ...]:
    """The last block's text-query projection and its QK-norm: that block keeps the image stream only
    (``context_pre_only``), so the text tokens' attention output is dropped and these never get a gradient."""
    last = len(transformer.transformer_blocks) - 1
    attn = transformer.transformer_blocks[last].attn
    return tuple(
        f"transformer_blocks.{last}.attn.{name}"
        for name in ("add_q_proj", "norm_added_q")
        if getattr(attn, name, None) is not None
    )


def sd3_transformer_forward(
    transformer: torch.nn.Module, x: Tensor, t: Tensor, cond: Cond, *, negative: bool, dtype: torch.dtype
) -> Tensor:
    """``SD3Transformer2DModel`` output for latents ``x`` at timesteps ``t``; with ``negative`` the
    batch is [uncond; cond] and the negative embeddings go first (how the SD3 pipeline batches CFG)."""
    text, pooled = cond["prompt_embeds"], cond["pooled_prompt_embeds"]
    if negative:
        text = torch.cat([cond["negative_prompt_embeds"], text])  # [2B, L, D]
        pooled = torch.cat([cond["negative_pooled_prompt_embeds"], pooled])  # [2B, D']
    return transformer(
        hidden_states=x.to(dtype),
        timestep=t,
        encoder_hidden_states=text.to(dtype),
        pooled_projections=pooled.to(dtype),
        return_dict=False,
    )[0]
