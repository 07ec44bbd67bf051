"""Qwen-Image (text-to-image, 20B MMDiT): ``QwenImageTransformer2DModel`` + rectified-flow SDE."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.steps import SDEDynamics
from .base import Cond, load_component, load_pipeline_index, parse_dtype, pipeline_from
from .flow import FlowMatchingAdapter
from .lora import SD3_LORA_TARGETS, LoraSettings
from .text import check_tokenizer, quiet_truncation_logs

#: the joint attention of every double-stream block: image (to_*) and text (add_*) projections
QWEN_IMAGE_LORA_TARGETS: tuple[str, ...] = SD3_LORA_TARGETS
#: conditioning whose length is the longest prompt's, with its mask: padded together by ``join_conds``
_SEQUENCES = (("prompt_embeds", "prompt_embeds_mask"), ("negative_prompt_embeds", "negative_prompt_embeds_mask"))


def pad_sequence(x: Tensor, length: int) -> Tensor:
    """[P, L, ...] -> [P, length, ...] with zeros after the last token (zeros: masked out)."""
    missing = length - x.shape[1]
    if missing == 0:
        return x
    return F.pad(x, (0, 0) * (x.ndim - 2) + (0, missing))


def unused_text_outputs(transformer: Any) -> tuple[str, ...]:
    """The last block's text-stream layers whose output goes nowhere: the model's output is read from the image stream
    only, so the text tokens' attention output (``attn.add_q_proj`` and its QK-norm ``attn.norm_added_q``,
    ``attn.to_add_out``) and the text MLP (``txt_mlp``) after the last joint attention never get a gradient."""
    last = len(transformer.transformer_blocks) - 1
    present = dict(transformer.transformer_blocks[last].named_modules())
    names = ("attn.add_q_proj", "attn.norm_added_q", "attn.to_add_out", "txt_mlp")
    return tuple(f"transformer_blocks.{last}.{name}" for name in names if name in present)


class QwenImageAdapter(FlowMatchingAdapter):
    """Qwen-Image as a tree-rollout policy over packed latents ``[B, (h/2)(w/2), 4C]``.

    Args:
        pretrained: a local folder (what ``QwenImagePipeline.save_pretrained`` writes) or the hub id
            ``Qwen/Qwen-Image``, or a ``QwenImagePipeline``.
        num_steps: denoising steps (the pipeline's default is 50; GRPO recipes sample with 10-20).
        true_cfg_scale: classifier-free guidance with ``negative_prompt`` (two forwards, batched);
            <= 1 disables it (one forward). The pipeline's examples and verl's recipe use 4.0.
        negative_prompt: the unconditional prompt (the pipeline's examples: ``" "``).
        noise_level: ``a`` of the Flow-GRPO SDE (verl's Qwen-Image recipe: 1.2), ``eta`` of the
            DanceGRPO SDE, or CPS's (0, 1] level.
        dynamics: ``flow_sde``, ``dance_sde`` or ``cps`` for the stochastic steps.
        height, width: image size in pixels, multiples of 16 (the VAE's 8 times the 2 x 2 packing).
        max_sequence_length: the most text tokens kept per prompt after the template (the pipeline allows 1024).
        lora: LoRA settings on the joint attention (``None``: fine-tune the whole transformer).
        torch_dtype: weights dtype, ``float32``, ``bfloat16`` or ``float16``.
        revision, variant: forwarded to ``from_pretrained``.
        gradient_checkpointing: trade compute for activation memory in the backward pass.
        decode_batch_size: images per VAE decode call.
        compile: ``torch.compile`` the denoiser in place (names, LoRA and checkpoints unchanged); not with FSDP2.
        master_weights: full fine-tuning in bfloat16 / float16 keeps float32 master weights (false: warned).
    """

    lora_layers_arg = "transformer"
    shard_blocks = ("transformer_blocks",)  # QwenImageTransformer2DModel's double-stream blocks

    def __init__(
        self,
        pretrained: str | Path | object,
        *,
        num_steps: int = 20,
        true_cfg_scale: float = 4.0,
        negative_prompt: str = " ",
        noise_level: float = 0.7,
        dynamics: SDEDynamics = "flow_sde",
        height: int = 1024,
        width: int = 1024,
        max_sequence_length: int = 512,
        lora: LoraSettings | None = LoraSettings(rank=64, alpha=128.0),
        torch_dtype: str = "float32",
        revision: str | None = None,
        variant: str | None = None,
        gradient_checkpointing: bool = False,
        decode_batch_size: int = 4,
        compile: bool = False,
        master_weights: bool = True,
    ) -> None:
        if true_cfg_scale < 0:  # checked here: the base class would name guidance_scale
            raise ValueError(f"true_cfg_scale must be >= 0, got {true_cfg_scale}")
        super().__init__(
            num_steps=num_steps,
            guidance_scale=true_cfg_scale,  # kept as guidance_scale: the weight of CFG (cfg_scale)
            negative_prompt=negative_prompt,
            lora=lora,
            gradient_checkpointing=gradient_checkpointing,
            decode_batch_size=decode_batch_size,
            compile=compile,
            master_weights=master_weights,
        )
        from diffusers import QwenImagePipeline

        self._init_flow(noise_level, dynamics)
        if not 1 <= max_sequence_length <= 1024:
            raise ValueError(
                f"max_sequence_length must be in 1..1024 (QwenImagePipeline's limit), got {max_sequence_length}"
            )
        self.max_sequence_length = max_sequence_length
        pipe = pipeline_from(
            pretrained,
            QwenImagePipeline,
            torch_dtype,
            lambda path: self._load(path, parse_dtype(torch_dtype), revision, variant),
        )
        self.pipeline = pipe  # not a module: keeps encode_prompt and save_lora_weights at hand
        self.denoiser = pipe.transformer
        self.vae = pipe.vae
        self.text_encoder = pipe.text_encoder
        self._setup_latents(pipe.vae_scale_factor, height, width)
        self._set_token_schedule(pipe.scheduler, self._grid[1] * self._grid[2])
        self._setup_training(QWEN_IMAGE_LORA_TARGETS)

    def _setup_latents(self, vae_scale_factor: int, height: int, width: int) -> None:
        """The image size and the packed latents' shape and token grid."""
        self.vae_scale_factor = vae_scale_factor
        multiple = self.vae_scale_factor * 2  # the VAE's factor times the 2 x 2 packing
        for name, value in (("height", height), ("width", width)):
            if value < multiple or value % multiple:
                raise ValueError(f"{name} must be a positive multiple of {multiple}, got {value}")
        self.height, self.width = height, width
        self.latent_channels = self.denoiser.config.in_channels // 4  # [C] before packing
        self._grid = (1, height // multiple, width // multiple)  # (frames, h/2, w/2) of the packed tokens

    @staticmethod
    def _load(path: str, dtype: torch.dtype, revision: str | None, variant: str | None):
        from diffusers import (
            AutoencoderKLQwenImage,
            FlowMatchEulerDiscreteScheduler,
            QwenImagePipeline,
            QwenImageTransformer2DModel,
        )
        from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

        kw = dict(revision=revision)
        weights = dict(kw, torch_dtype=dtype, variant=variant)
        load_pipeline_index(path, "QwenImagePipeline", "pass a folder that QwenImagePipeline.save_pretrained wrote or the hub id Qwen/Qwen-Image", **kw)  # fmt: skip
        tokenizer = load_component(AutoTokenizer, path, "tokenizer", **kw)
        check_tokenizer(tokenizer, f"{path}/tokenizer")
        return QwenImagePipeline(
            scheduler=load_component(FlowMatchEulerDiscreteScheduler, path, "scheduler", **kw),
            vae=load_component(AutoencoderKLQwenImage, path, "vae", **weights),
            text_encoder=load_component(Qwen2_5_VLForConditionalGeneration, path, "text_encoder", **weights),
            tokenizer=tokenizer,
            transformer=load_component(QwenImageTransformer2DModel, path, "transformer", **weights),
        )

    def unused_modules(self, model: torch.nn.Module) -> tuple[str, ...]:
        return unused_text_outputs(model)

    # ------------------------------------------------------------------------ guidance
    def _combine_guidance(self, uncond: Tensor, text: Tensor, scale: float) -> Tensor:
        """QwenImagePipeline's true CFG: ``uncond + s (cond - uncond)``, rescaled per token to the
        conditional prediction's norm."""
        combined = super()._combine_guidance(uncond, text, scale)  # [B, N, 4C]
        return combined * (text.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True))

    # ------------------------------------------------------------------------ contract
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        pipe = self.pipeline
        # what reaches the encoder: the template around each prompt, then the 34 template tokens dropped
        templated = [pipe.prompt_template_encode.format(p) for p in prompts]
        limit = self.max_sequence_length + pipe.prompt_template_encode_start_idx
        self.truncation(pipe.tokenizer, templated, limit, "Qwen2.5-VL")
        with quiet_truncation_logs(pipe):
            parts = [self._encode_one(prompts)]
            if self.do_cfg:  # one negative, encoded once, one row per prompt
                negative = self._encode_one([self.negative_prompt])
                parts.append({k: v.expand(len(prompts), *v.shape[1:]).contiguous() for k, v in negative.items()})
        length = max(part["prompt_embeds"].shape[1] for part in parts)
        cond: Cond = {}
        for part, (embeds, mask) in zip(parts, _SEQUENCES):
            cond[embeds] = pad_sequence(part["prompt_embeds"], length)  # [P, L, D]
            cond[mask] = pad_sequence(part["prompt_embeds_mask"], length)  # [P, L] 1: token, 0: padding
        return cond

    def _encode_one(self, prompts: list[str]) -> Cond:
        embeds, mask = self.pipeline.encode_prompt(
            prompt=prompts, device=self.device, max_sequence_length=self.max_sequence_length
        )
        if mask is None:  # the pipeline drops an all-ones mask
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask}

    def join_conds(self, parts: Sequence[Cond]) -> Cond:
        """Rows from separate encodings, each padded to the longest of them (masked zeros)."""
        length = max(part["prompt_embeds"].shape[1] for part in parts)
        names = {n for pair in _SEQUENCES for n in pair}
        return {
            name: torch.cat([pad_sequence(p[name], length) if name in names else p[name] for p in parts])
            for name in parts[0]
        }

    def _denoise(self, x: Tensor, t: Tensor, cond: Cond, *, negative: bool) -> Tensor:
        text, mask = cond["prompt_embeds"], cond["prompt_embeds_mask"]
        if negative:  # [uncond; cond], as _guided batches them
            text = torch.cat([cond["negative_prompt_embeds"], text])  # [2B, L, D]
            mask = torch.cat([cond["negative_prompt_embeds_mask"], mask])  # [2B, L]
        dtype = self.dtype
        return self.denoiser(
            hidden_states=x.to(dtype),  # [B, N, 4C] packed latents
            timestep=t.to(dtype) / 1000,  # the pipeline: timesteps in the latents' dtype, over 1000
            encoder_hidden_states=text.to(dtype),
            encoder_hidden_states_mask=mask,
            img_shapes=[[self._grid]] * x.shape[0],
            return_dict=False,
        )[0]

    def initial_noise(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """Root latents drawn and packed as QwenImagePipeline draws them: [n, (h/2)(w/2), 4C]."""
        from diffusers import QwenImagePipeline

        h, w = 2 * self._grid[1], 2 * self._grid[2]
        noise = self._draw_noise((n, 1, self.latent_channels, h, w), generator)  # [n, 1, C, h, w]
        return QwenImagePipeline._pack_latents(noise, n, self.latent_channels, h, w)

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Packed latents -> images [B, 3, H, W] in [0, 1], float32."""
        from diffusers import QwenImagePipeline

        config = self.vae.config
        mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1)
        inv_std = 1.0 / torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1)  # as the pipeline writes it
        images = []
        for chunk in latents.split(self.decode_batch_size):
            z = QwenImagePipeline._unpack_latents(chunk, self.height, self.width, self.vae_scale_factor)
            z = z.to(self.vae.dtype)  # [b, C, 1, h, w]
            z = z / inv_std.to(z.device, z.dtype) + mean.to(z.device, z.dtype)
            out = self.vae.decode(z, return_dict=False)[0][:, :, 0]  # [b, 3, H, W] in [-1, 1]
            images.append((out.float() / 2 + 0.5).clamp(0, 1))
        return torch.cat(images)
