"""FLUX.1 (-dev and -schnell): ``FluxTransformer2DModel`` + rectified-flow SDE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..core.steps import SDEDynamics
from .base import Cond, load_component, parse_dtype, pipeline_from
from .flow import FlowMatchingAdapter
from .lora import FLUX_LORA_TARGETS, LoraSettings
from .text import check_tokenizer, quiet_truncation_logs


class FluxTransformerConfig:
    """The ``config.json`` of a ``transformer`` subfolder, read (through :func:`load_component`, for
    its one-line errors) before any weight loads, to refuse a folder of another family."""

    @staticmethod
    def from_pretrained(path: str, subfolder: str | None = None, **kwargs: Any) -> dict[str, Any]:
        from diffusers import FluxTransformer2DModel

        return FluxTransformer2DModel.load_config(path, subfolder=subfolder, **kwargs)


class FluxAdapter(FlowMatchingAdapter):
    """FLUX.1-dev / -schnell as a tree-rollout policy.

    Args:
        pretrained: a local folder (what ``FluxPipeline.save_pretrained`` writes) or hub id of a
            diffusers FLUX.1 checkpoint, or a ``FluxPipeline``.
        num_steps: denoising steps (BranchGRPO / DanceGRPO: 20; FluxPipeline's default 28).
        guidance_scale: the distilled guidance the transformer takes as input (FLUX.1-dev: 3.5, as
            BranchGRPO samples); ignored by a model without a guidance embedding (-schnell), as
            FluxPipeline ignores it.
        true_cfg_scale: classifier-free guidance with ``negative_prompt`` (two forwards, batched);
            <= 1 disables it (the default: FLUX.1 is guidance-distilled).
        negative_prompt: the unconditional prompt of true CFG.
        noise_level: ``a`` of the Flow-GRPO SDE (0.7) or ``eta`` of the DanceGRPO SDE (0.3, what
            BranchGRPO uses on FLUX).
        dynamics: ``flow_sde``, ``dance_sde`` or ``cps`` for the stochastic steps.
        resolution: image side in pixels, a multiple of 16 for FLUX's VAE; ``None``: 1024
            (FluxPipeline's 128 latent pixels times the VAE factor).
        shift: ``None`` uses the scheduler's own schedule (FLUX.1-dev: the resolution-dependent
            shift of FluxPipeline); a number > 0 uses that fixed shift instead (3.0: DanceGRPO /
            BranchGRPO's ``sd3_time_shift(3, t)``).
        max_sequence_length: T5 tokens (FluxPipeline's default 512; -schnell allows 256).
        lora: LoRA settings on the attention of the double- and single-stream blocks (``None``:
            fine-tune the whole transformer).
        torch_dtype: weights dtype, ``float32``, ``bfloat16`` or ``float16``.
        revision, variant: forwarded to ``from_pretrained``.
        gradient_checkpointing: trade compute for activation memory in the backward pass.
        decode_batch_size: images per VAE decode call.
        compile: ``torch.compile`` the denoiser in place (names, LoRA and checkpoints unchanged); not with FSDP2.
        master_weights: full fine-tuning in bfloat16 / float16 keeps float32 master weights (false: warned).
    """

    lora_layers_arg = "transformer"
    shard_blocks = ("transformer_blocks", "single_transformer_blocks")  # FLUX's double / single stream

    def __init__(
        self,
        pretrained: str | Path | object,
        *,
        num_steps: int = 20,
        guidance_scale: float = 3.5,
        true_cfg_scale: float = 1.0,
        negative_prompt: str = "",
        noise_level: float = 0.7,
        dynamics: SDEDynamics = "flow_sde",
        resolution: int | None = None,
        shift: float | None = None,
        max_sequence_length: int = 512,
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
        from diffusers import FluxPipeline

        self._init_flow(noise_level, dynamics)
        if true_cfg_scale < 0:
            raise ValueError(f"true_cfg_scale must be >= 0, got {true_cfg_scale}")
        if shift is not None and shift <= 0:
            raise ValueError(f"shift must be > 0 or null (the scheduler's own schedule), got {shift}")
        if not 1 <= max_sequence_length <= 512:
            raise ValueError(f"max_sequence_length must be in 1..512 (FLUX's T5 limit), got {max_sequence_length}")
        self.true_cfg_scale = true_cfg_scale
        self.max_sequence_length = max_sequence_length
        pipe = pipeline_from(
            pretrained,
            FluxPipeline,
            torch_dtype,
            lambda path: self._load(path, parse_dtype(torch_dtype), revision, variant),
        )
        self.pipeline = pipe  # not a module: keeps encode_prompt and save_lora_weights at hand
        self.denoiser = pipe.transformer
        self.vae = pipe.vae
        self.text_encoder = pipe.text_encoder
        self.text_encoder_2 = pipe.text_encoder_2
        self._setup_latents(pipe, resolution)
        self._setup_schedule(shift)
        self._setup_training(FLUX_LORA_TARGETS)

    def _setup_latents(self, pipe: Any, resolution: int | None) -> None:
        """The resolution, the packed latents' shape and the positions of their tokens."""
        from diffusers import FluxPipeline

        self.vae_scale_factor = pipe.vae_scale_factor
        self.resolution = resolution or pipe.default_sample_size * self.vae_scale_factor
        multiple = self.vae_scale_factor * 2  # the VAE's factor times the 2x2 packing
        if self.resolution % multiple:
            raise ValueError(f"resolution must be a multiple of {multiple}, got {self.resolution}")
        self.latent_channels = self.denoiser.config.in_channels // 4  # [C] before packing
        self.latent_side = self.resolution // self.vae_scale_factor  # h = w, even
        # [(h/2)(w/2), 3] positions of the packed tokens, the same for every sample
        self._img_ids = FluxPipeline._prepare_latent_image_ids(
            1, self.latent_side // 2, self.latent_side // 2, "cpu", torch.float32
        )

    @staticmethod
    def _load(path: str, dtype: torch.dtype, revision: str | None, variant: str | None):
        from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
        from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5TokenizerFast

        kw = dict(revision=revision)
        found = load_component(FluxTransformerConfig, path, "transformer", **kw).get("_class_name")
        if found != "FluxTransformer2DModel":
            raise ValueError(
                f"pretrained: {path} holds a {found} transformer, not FLUX.1's FluxTransformer2DModel; pass a "
                "folder that FluxPipeline.save_pretrained wrote or a FLUX.1 hub id (black-forest-labs/FLUX.1-dev)"
            )
        weights = dict(kw, torch_dtype=dtype, variant=variant)
        tokenizer = load_component(CLIPTokenizer, path, "tokenizer", **kw)
        tokenizer_2 = load_component(T5TokenizerFast, path, "tokenizer_2", **kw)
        check_tokenizer(tokenizer, f"{path}/tokenizer")
        check_tokenizer(tokenizer_2, f"{path}/tokenizer_2")
        return FluxPipeline(
            transformer=load_component(FluxTransformer2DModel, path, "transformer", **weights),
            scheduler=load_component(FlowMatchEulerDiscreteScheduler, path, "scheduler", **kw),
            vae=load_component(AutoencoderKL, path, "vae", **weights),
            text_encoder=load_component(CLIPTextModel, path, "text_encoder", **weights),
            text_encoder_2=load_component(T5EncoderModel, path, "text_encoder_2", **weights),
            tokenizer=tokenizer,
            tokenizer_2=tokenizer_2,
        )

    def _setup_schedule(self, shift: float | None) -> None:
        """FluxPipeline's schedule (:meth:`_set_token_schedule` over the packed tokens), or a fixed
        ``shift`` instead of the dynamic one."""
        from diffusers import FlowMatchEulerDiscreteScheduler

        scheduler = self.pipeline.scheduler
        if shift is not None:  # a private scheduler: the pipeline's own stays as it was loaded
            scheduler = FlowMatchEulerDiscreteScheduler.from_config(
                scheduler.config, shift=shift, use_dynamic_shifting=False
            )
        self._set_token_schedule(scheduler, (self.latent_side // 2) ** 2)

    # ------------------------------------------------------------------------ guidance
    @property
    def cfg_scale(self) -> float:
        """True CFG's weight: ``guidance_scale`` is the distilled model's input, not CFG."""
        return self.true_cfg_scale

    @property
    def guidance_embeds(self) -> bool:
        """Whether the transformer takes ``guidance_scale`` as an input (FLUX.1-dev; not -schnell)."""
        return bool(self.denoiser.config.guidance_embeds)

    # ------------------------------------------------------------------------ contract
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        pipe = self.pipeline
        self.truncation(pipe.tokenizer, prompts, pipe.tokenizer_max_length, "CLIP")
        self.truncation(pipe.tokenizer_2, prompts, self.max_sequence_length, "T5")
        with quiet_truncation_logs(pipe):
            embeds, pooled, _ = pipe.encode_prompt(
                prompt=prompts, prompt_2=None, device=self.device, max_sequence_length=self.max_sequence_length
            )
            cond = {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}  # [P, L, D], [P, D']
            if self.do_cfg:  # one negative, encoded once, one row per prompt
                negative, negative_pooled, _ = pipe.encode_prompt(
                    prompt=[self.negative_prompt], device=self.device, max_sequence_length=self.max_sequence_length
                )
                cond["negative_prompt_embeds"] = negative.expand(len(prompts), -1, -1).contiguous()
                cond["negative_pooled_prompt_embeds"] = negative_pooled.expand(len(prompts), -1).contiguous()
        return cond

    def _denoise(self, x: Tensor, t: Tensor, cond: Cond, *, negative: bool) -> Tensor:
        text, pooled = cond["prompt_embeds"], cond["pooled_prompt_embeds"]
        if negative:  # [uncond; cond], as _guided batches them
            text = torch.cat([cond["negative_prompt_embeds"], text])  # [2B, L, D]
            pooled = torch.cat([cond["negative_pooled_prompt_embeds"], pooled])  # [2B, D']
        dtype, batch = self.dtype, x.shape[0]
        guidance = None
        if self.guidance_embeds:  # float32, as FluxPipeline passes it; the model casts it
            guidance = torch.full((batch,), self.guidance_scale, device=x.device, dtype=torch.float32)
        return self.denoiser(
            hidden_states=x.to(dtype),  # [B, N, 4C] packed latents
            timestep=t.to(dtype) / 1000,  # FluxPipeline: timesteps in the latents' dtype, over 1000
            guidance=guidance,
            pooled_projections=pooled.to(dtype),
            encoder_hidden_states=text.to(dtype),
            txt_ids=torch.zeros(text.shape[1], 3, device=x.device, dtype=dtype),  # [L, 3], FLUX's text ids
            img_ids=self._img_ids.to(device=x.device, dtype=dtype),  # [N, 3]
            return_dict=False,
        )[0]

    def initial_noise(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """Root latents packed as FluxPipeline packs its noise: [n, (h/2)(w/2), 4C]."""
        from diffusers import FluxPipeline

        side, channels = self.latent_side, self.latent_channels
        noise = self._draw_noise((n, channels, side, side), generator)  # [n, C, h, w]
        return FluxPipeline._pack_latents(noise, n, channels, side, side)

    def decode(self, latents: Tensor) -> Tensor:
        from diffusers import FluxPipeline

        unpacked = FluxPipeline._unpack_latents(
            latents, self.resolution, self.resolution, self.vae_scale_factor
        )  # [B, C, h, w]
        config = self.vae.config
        return self._decode_with(self.vae, unpacked / config.scaling_factor + config.shift_factor)
