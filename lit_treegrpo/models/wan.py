"""Wan2.1 text-to-video (T2V 1.3B / 14B): ``WanTransformer3DModel`` + rectified-flow SDE on video latents.

A sample is a video latent ``[C, F', h, w]`` (``F' = (num_frames - 1) / 4 + 1`` latent frames, ``h, w``
the pixel size over 8); the engine sees it as any other latent shape. Text is encoded by UMT5 (one
encoder, ``max_sequence_length`` tokens); CFG runs the negative prompt in the same batched forward.

Schedule: Wan's diffusers folders ship ``UniPCMultistepScheduler(use_flow_sigmas=True,
flow_shift=...)`` (3.0 for 480p, 5.0 for 720p), a multistep solver whose steps depend on earlier
model outputs and so have no per-step Gaussian log-prob. The adapter keeps Wan's shift but steps
with ``FlowMatchEulerDiscreteScheduler(shift=flow_shift)``'s sigma table (the first-order Euler step
the flow SDE of :func:`lit_treegrpo.core.steps.flow_sde_step` reduces to when deterministic), as
Flow-GRPO and DanceGRPO do for Wan. A folder whose scheduler already is ``FlowMatchEulerDiscreteScheduler``
is used as it is, so the adapter reproduces ``WanPipeline`` with that scheduler exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..core.steps import SDEDynamics
from .base import Cond, cast_components, load_component, parse_dtype, quiet_truncation_logs
from .flow import FlowMatchingAdapter
from .lora import LoraSettings

#: self- and cross-attention projections of every ``WanTransformerBlock`` (attn1, attn2)
WAN_LORA_TARGETS: tuple[str, ...] = ("to_q", "to_k", "to_v", "to_out.0")


class _SchedulerFromConfig:
    """Loads whichever diffusers scheduler class a folder's ``scheduler_config.json`` names."""

    __name__ = "scheduler"

    @staticmethod
    def from_pretrained(path: str, subfolder: str | None = None, **kwargs: Any) -> Any:
        import diffusers

        config = diffusers.FlowMatchEulerDiscreteScheduler.load_config(path, subfolder=subfolder, **kwargs)
        cls = getattr(diffusers, config.get("_class_name", ""), None)
        if cls is None:
            raise ValueError(f"unknown scheduler class {config.get('_class_name')!r}")
        return cls.from_config(config)


def flow_schedule_scheduler(scheduler: Any, flow_shift: float | None) -> Any:
    """The ``FlowMatchEulerDiscreteScheduler`` whose sigmas the adapter steps on.

    ``scheduler``: the pipeline's (FlowMatchEuler: used as is unless ``flow_shift`` overrides its
    shift; UniPC / DPM++ with flow sigmas: its ``flow_shift`` and ``num_train_timesteps`` carried over).
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    config = scheduler.config
    if isinstance(scheduler, FlowMatchEulerDiscreteScheduler):
        if flow_shift is None or flow_shift == config.get("shift"):
            return scheduler
        return FlowMatchEulerDiscreteScheduler.from_config(config, shift=flow_shift)
    if flow_shift is None:
        if not config.get("use_flow_sigmas", False) or "flow_shift" not in config:
            raise ValueError(
                f"the pipeline's scheduler {type(scheduler).__name__} has no flow-matching shift; "
                "set the adapter's flow_shift (Wan2.1: 3.0 at 480p, 5.0 at 720p)"
            )
        flow_shift = float(config["flow_shift"])
    return FlowMatchEulerDiscreteScheduler(
        shift=flow_shift, num_train_timesteps=config.get("num_train_timesteps", 1000)
    )


def check_wan_folder(path: str) -> None:
    """Refuse, in one line naming ``path``, a local folder that is not a Wan2.1 T2V pipeline."""
    index = Path(path).expanduser() / "model_index.json"
    if not index.is_file():
        return  # no folder, or not a pipeline folder: load_component names what is missing
    config = json.loads(index.read_text())
    kind = config.get("_class_name")
    if kind != "WanPipeline":
        raise ValueError(f"{path} holds a {kind}, not a WanPipeline; pass a Wan2.1 T2V diffusers folder")
    if config.get("boundary_ratio") is not None or (config.get("transformer_2") or [None])[0] is not None:
        raise ValueError(f"{path} is a two-expert Wan2.2 pipeline (transformer_2); only Wan2.1 T2V is supported")
    if config.get("expand_timesteps"):
        raise ValueError(f"{path} is a Wan2.2 TI2V pipeline (expand_timesteps); only Wan2.1 T2V is supported")


class WanAdapter(FlowMatchingAdapter):
    """Wan2.1 T2V as a tree-rollout policy over video latents ``[B, C, F', h, w]``.

    Args:
        pretrained: a local folder or hub id of a diffusers Wan2.1 T2V checkpoint (e.g.
            ``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``), or a ``WanPipeline``.
        num_steps: denoising steps.
        guidance_scale: CFG weight (Wan's default 5.0); <= 1 disables CFG.
        noise_level: ``a`` of the Flow-GRPO SDE (0.7) or ``eta`` of the DanceGRPO SDE (0.3).
        dynamics: ``flow_sde``, ``dance_sde`` or ``cps`` for the stochastic steps.
        negative_prompt: unconditional prompt of CFG (Wan recommends a long list of defects).
        height, width: video size in pixels, multiples of 16 (the VAE's 8 times the patch's 2).
        num_frames: frames per video, ``4k + 1`` (the VAE compresses 4 frames into one after the first).
        flow_shift: the sigma shift; ``None`` takes the pipeline scheduler's (``shift`` or ``flow_shift``).
        max_sequence_length: UMT5 tokens (Wan: 512).
        lora: LoRA settings (``None``: fine-tune the whole transformer).
        torch_dtype: weights dtype of the transformer and UMT5; the VAE loads in float32 (as
            diffusers' Wan examples do: its decoder degrades in bfloat16).
        revision, variant: forwarded to ``from_pretrained``.
        gradient_checkpointing: trade compute for activation memory in the backward pass.
        decode_batch_size: videos per VAE decode call.
        compile: ``torch.compile`` the denoiser (in place: its weights, LoRA and checkpoints keep
            their names); the first iteration pays the compilation. Not with FSDP2.
    """

    lora_layers_arg = "transformer"
    shard_blocks = ("blocks",)  # WanTransformer3DModel's block list
    makes_video = True  # decode gives videos [B, F, 3, H, W]: the module needs a video reward (rewards.video)

    def __init__(
        self,
        pretrained: str | Path | object,
        *,
        num_steps: int = 20,
        guidance_scale: float = 5.0,
        noise_level: float = 0.7,
        dynamics: SDEDynamics = "flow_sde",
        negative_prompt: str = "",
        height: int = 480,
        width: int = 832,
        num_frames: int = 81,
        flow_shift: float | None = None,
        max_sequence_length: int = 512,
        lora: LoraSettings | None = LoraSettings(rank=32, alpha=64.0),
        torch_dtype: str = "float32",
        revision: str | None = None,
        variant: str | None = None,
        gradient_checkpointing: bool = False,
        decode_batch_size: int = 1,
        compile: bool = False,
    ) -> None:
        super().__init__(
            num_steps=num_steps,
            guidance_scale=guidance_scale,
            negative_prompt=negative_prompt,
            lora=lora,
            gradient_checkpointing=gradient_checkpointing,
            decode_batch_size=decode_batch_size,
            compile=compile,
        )
        from diffusers import WanPipeline

        self._init_flow(noise_level, dynamics)
        if max_sequence_length < 1:
            raise ValueError(f"max_sequence_length must be >= 1, got {max_sequence_length}")
        if flow_shift is not None and flow_shift <= 0:
            raise ValueError(f"flow_shift must be > 0, got {flow_shift}")
        self.max_sequence_length = max_sequence_length
        if isinstance(pretrained, (str, Path)):
            check_wan_folder(str(pretrained))
            pipe = self._load(str(pretrained), parse_dtype(torch_dtype), revision, variant)
        elif isinstance(pretrained, WanPipeline):
            pipe = pretrained
            cast_components(pipe.components, torch_dtype, keep_float32=("vae",))
        else:
            raise TypeError(f"pretrained must be a path, hub id or WanPipeline, got {type(pretrained)}")
        if getattr(pipe, "transformer_2", None) is not None or pipe.config.get("expand_timesteps", False):
            raise ValueError("WanAdapter supports Wan2.1 T2V (one transformer); this pipeline is a Wan2.2 one")
        self.pipeline = pipe  # not a module: keeps encode_prompt and save_lora_weights at hand
        self.denoiser = pipe.transformer
        self.vae = pipe.vae
        self.text_encoder = pipe.text_encoder
        self.temporal_factor = pipe.vae_scale_factor_temporal
        self.spatial_factor = pipe.vae_scale_factor_spatial
        self._check_size(height, width, num_frames)
        self.height, self.width, self.num_frames = height, width, num_frames
        self.schedule_scheduler = flow_schedule_scheduler(pipe.scheduler, flow_shift)
        self.flow_shift = float(self.schedule_scheduler.config.shift)
        self._set_schedule(self.schedule_scheduler)
        self._setup_training(WAN_LORA_TARGETS)

    def _check_size(self, height: int, width: int, num_frames: int) -> None:
        _, ph, pw = self.denoiser.config.patch_size
        for name, value, multiple in (
            ("height", height, self.spatial_factor * ph),
            ("width", width, self.spatial_factor * pw),
        ):
            if value < multiple or value % multiple:
                raise ValueError(f"{name} must be a positive multiple of {multiple}, got {value}")
        if num_frames < 1 or (num_frames - 1) % self.temporal_factor:
            raise ValueError(
                f"num_frames must be {self.temporal_factor}k + 1 (1, {self.temporal_factor + 1}, "
                f"{2 * self.temporal_factor + 1}, ...; Wan: 81), got {num_frames}"
            )

    @staticmethod
    def _load(path: str, dtype: torch.dtype, revision: str | None, variant: str | None):
        from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel
        from transformers import AutoTokenizer, UMT5EncoderModel

        from .base import check_tokenizer

        kw = dict(revision=revision)
        weights = dict(kw, torch_dtype=dtype, variant=variant)
        tokenizer = load_component(AutoTokenizer, path, "tokenizer", **kw)
        check_tokenizer(tokenizer, f"{path}/tokenizer")
        return WanPipeline(
            tokenizer=tokenizer,
            text_encoder=load_component(UMT5EncoderModel, path, "text_encoder", **weights),
            vae=load_component(AutoencoderKLWan, path, "vae", **dict(weights, torch_dtype=torch.float32)),
            scheduler=load_component(_SchedulerFromConfig, path, "scheduler", **kw),
            transformer=load_component(WanTransformer3DModel, path, "transformer", **weights),
        )

    # ------------------------------------------------------------------------ contract
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        pipe = self.pipeline
        self.truncation(pipe.tokenizer, prompts, self.max_sequence_length, "UMT5")
        with quiet_truncation_logs(pipe):
            embeds, negative = pipe.encode_prompt(
                prompt=prompts,
                negative_prompt=[self.negative_prompt] * len(prompts) if self.do_cfg else None,
                do_classifier_free_guidance=self.do_cfg,
                max_sequence_length=self.max_sequence_length,
                device=self.device,
            )
        cond = {"prompt_embeds": embeds}  # [P, L, D], padded with zeros after each prompt's tokens
        if self.do_cfg:
            cond["negative_prompt_embeds"] = negative  # [P, L, D]
        return cond

    def _denoise(self, x: Tensor, t: Tensor, cond: Cond, *, negative: bool) -> Tensor:
        text = cond["prompt_embeds"]
        if negative:  # the batch is [uncond; cond]
            text = torch.cat([cond["negative_prompt_embeds"], text])  # [2B, L, D]
        return self.denoiser(
            hidden_states=x.to(self.dtype), timestep=t, encoder_hidden_states=text.to(self.dtype), return_dict=False
        )[0]

    def latent_shape(self) -> tuple[int, int, int, int]:
        """``(C, F', h, w)`` of one video latent."""
        frames = (self.num_frames - 1) // self.temporal_factor + 1
        h, w = self.height // self.spatial_factor, self.width // self.spatial_factor
        return (self.denoiser.config.in_channels, frames, h, w)

    def initial_noise(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        return self._draw_noise((n, *self.latent_shape()), generator)  # [n, C, F', h, w]

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        """Latents [B, C, F', h, w] -> videos [B, F, 3, H, W] in [0, 1], float32 (frames before
        channels: what video rewards and ``WanPipeline(output_type="pt")`` use)."""
        config = self.vae.config
        mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1)
        inv_std = 1.0 / torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1)  # as WanPipeline writes it
        videos = []
        for chunk in latents.split(self.decode_batch_size):
            z = chunk.to(self.vae.dtype)
            z = z / inv_std.to(z.device, z.dtype) + mean.to(z.device, z.dtype)
            out = self.vae.decode(z, return_dict=False)[0]  # [b, 3, F, H, W] in [-1, 1]
            videos.append((out.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4))  # [b, F, 3, H, W]
        return torch.cat(videos)
