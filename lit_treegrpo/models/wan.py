"""Wan text-to-video: ``WanTransformer3DModel`` + rectified-flow SDE on video latents."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..core.choices import check_choice
from ..core.steps import SDEDynamics
from .base import Cond, load_component, load_pipeline_index, parse_dtype, pipeline_from
from .flow import FlowMatchingAdapter
from .lora import LoraSettings, lora_metadata, lora_state_dict
from .text import check_tokenizer, quiet_truncation_logs

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
    """The ``FlowMatchEulerDiscreteScheduler`` whose sigmas the adapter steps on."""
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


#: which of Wan2.2 A14B's experts train: both, or one while the other stays the base model
Experts = Literal["both", "high_noise", "low_noise"]
#: the file each expert's LoRA is written to (the high-noise one: what ``load_lora_weights(DIR)`` reads)
LORA_FILES = {
    "transformer": "pytorch_lora_weights.safetensors",
    "transformer_2": "transformer_2_lora_weights.safetensors",
}


def _checked_lengths(max_sequence_length: int, flow_shift: float | None) -> int:
    """``max_sequence_length``, refused below 1; a ``flow_shift`` must be > 0 or null."""
    if max_sequence_length < 1:
        raise ValueError(f"max_sequence_length must be >= 1, got {max_sequence_length}")
    if flow_shift is not None and flow_shift <= 0:
        raise ValueError(f"flow_shift must be > 0, got {flow_shift}")
    return max_sequence_length


class WanAdapter(FlowMatchingAdapter):
    """Wan text-to-video as a tree-rollout policy over video latents ``[B, C, F', h, w]``.

    Args:
        pretrained: a local folder or hub id of a diffusers Wan checkpoint (e.g. ``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``,
            ``Wan-AI/Wan2.2-TI2V-5B-Diffusers``, ``Wan-AI/Wan2.2-T2V-A14B-Diffusers``), or a ``WanPipeline``.
        num_steps: denoising steps.
        guidance_scale: CFG weight (Wan's default 5.0; of the high-noise expert for A14B); <= 1 disables CFG.
        guidance_scale_2: the low-noise expert's CFG weight (A14B); ``None``: ``guidance_scale``, as
            the pipeline does. Used only when ``guidance_scale`` > 1 turns CFG on (as the pipeline).
        train_experts: A14B only: ``both`` experts train (LoRA on each), or only ``high_noise`` or
            ``low_noise`` while the other stays the base model (its steps still sample and score).
        noise_level: ``a`` of the Flow-GRPO SDE (0.7) or ``eta`` of the DanceGRPO SDE (0.3).
        dynamics: ``flow_sde``, ``dance_sde`` or ``cps`` for the stochastic steps.
        negative_prompt: unconditional prompt of CFG (Wan recommends a long list of defects).
        height, width: video size in pixels, multiples of 16 (the VAE's 8 times the patch's 2).
        num_frames: frames per video, ``4k + 1`` (the VAE compresses 4 frames into one after the first).
        flow_shift: the sigma shift; ``None`` takes the pipeline scheduler's (``shift`` or ``flow_shift``).
        max_sequence_length: UMT5 tokens (Wan: 512).
        lora: LoRA settings (``None``: fine-tune the whole transformer).
        torch_dtype: weights dtype, ``float32``, ``bfloat16`` or ``float16``.
        revision, variant: forwarded to ``from_pretrained``.
        gradient_checkpointing: trade compute for activation memory in the backward pass.
        decode_batch_size: videos per VAE decode call.
        compile: ``torch.compile`` the denoiser in place (names, LoRA and checkpoints unchanged); not with FSDP2.
        master_weights: full fine-tuning in bfloat16 / float16 keeps float32 master weights (false: warned).
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
        guidance_scale_2: float | None = None,
        train_experts: Experts = "both",
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
        from diffusers import WanPipeline

        self._init_flow(noise_level, dynamics)
        self.max_sequence_length = _checked_lengths(max_sequence_length, flow_shift)
        pipe = pipeline_from(
            pretrained,
            WanPipeline,
            torch_dtype,
            lambda path: self._load(path, parse_dtype(torch_dtype), revision, variant),
            keep_float32=("vae",),
        )
        self._init_experts(pipe, train_experts, guidance_scale, guidance_scale_2)
        self.vae = pipe.vae
        self.text_encoder = pipe.text_encoder
        self.temporal_factor = pipe.vae_scale_factor_temporal
        self.spatial_factor = pipe.vae_scale_factor_spatial
        self._check_size(height, width, num_frames)
        self.height, self.width, self.num_frames = height, width, num_frames
        self.schedule_scheduler = flow_schedule_scheduler(pipe.scheduler, flow_shift)
        self.flow_shift = float(self.schedule_scheduler.config.shift)
        self._set_schedule(self.schedule_scheduler)
        self._set_step_experts(pipe.config.get("boundary_ratio"))
        self._setup_training(WAN_LORA_TARGETS)

    def _init_experts(
        self, pipe: Any, train_experts: Experts, guidance_scale: float, guidance_scale_2: float | None
    ) -> None:
        """The transformer(s) of ``pipe``: Wan2.1's one, or Wan2.2 A14B's high- and low-noise experts."""
        if pipe.transformer is None:
            raise ValueError(
                "the WanPipeline has no high-noise transformer (only transformer_2); both experts are needed"
            )
        check_choice("train_experts", train_experts, Experts)
        if guidance_scale_2 is not None and guidance_scale_2 < 0:
            raise ValueError(f"guidance_scale_2 must be >= 0, got {guidance_scale_2}")
        self.pipeline = pipe  # not a module: keeps encode_prompt and save_lora_weights at hand
        self.denoiser = pipe.transformer
        self.denoiser_2 = getattr(pipe, "transformer_2", None)  # A14B's low-noise expert, else None
        if self.denoiser_2 is None and (train_experts != "both" or guidance_scale_2 is not None):
            raise ValueError(
                "train_experts and guidance_scale_2 apply to two-expert Wan2.2 models (A14B); this one has one transformer"
            )
        self.train_experts = train_experts
        self.guidance_scale_2 = guidance_scale if guidance_scale_2 is None else guidance_scale_2
        self.expand_timesteps = bool(pipe.config.get("expand_timesteps", False))  # TI2V-5B: a timestep per token

    def _set_step_experts(self, ratio: float | None) -> None:
        """Per step, the expert that denoises it (0: transformer, 1: transformer_2), as WanPipeline picks."""
        if (self.denoiser_2 is None) != (ratio is None):
            raise ValueError(
                "a two-expert Wan2.2 pipeline needs both transformer_2 and boundary_ratio; this one has "
                f"transformer_2 {'set' if self.denoiser_2 is not None else 'missing'} and boundary_ratio {ratio}"
            )
        boundary = None if ratio is None else ratio * self.schedule_scheduler.config.num_train_timesteps
        self.step_expert = [int(boundary is not None and t < boundary) for t in self._schedule.host["t"].tolist()]

    def denoisers(self) -> dict[str, nn.Module]:
        experts = {"transformer": self.denoiser}
        if self.denoiser_2 is not None:
            experts["transformer_2"] = self.denoiser_2
        return experts

    def trained_denoisers(self) -> dict[str, nn.Module]:
        keep = {
            "both": ("transformer", "transformer_2"),
            "high_noise": ("transformer",),
            "low_noise": ("transformer_2",),
        }
        return {name: m for name, m in self.denoisers().items() if name in keep[self.train_experts]}

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

        kw = dict(revision=revision)
        weights = dict(kw, torch_dtype=dtype, variant=variant)
        # which Wan: Wan2.2 adds a second expert and the switch (A14B), or per-token timesteps (TI2V)
        hint = "pass a Wan2.1 T2V, Wan2.2 TI2V-5B or T2V-A14B diffusers folder"
        index = load_pipeline_index(path, "WanPipeline", hint, **kw)
        if (index.get("transformer") or [None])[0] is None:
            raise ValueError(f"{path} has no high-noise transformer (only transformer_2); both experts are needed")
        tokenizer = load_component(AutoTokenizer, path, "tokenizer", **kw)
        check_tokenizer(tokenizer, f"{path}/tokenizer")
        two_experts = (index.get("transformer_2") or [None])[0] is not None
        return WanPipeline(
            tokenizer=tokenizer,
            text_encoder=load_component(UMT5EncoderModel, path, "text_encoder", **weights),
            vae=load_component(AutoencoderKLWan, path, "vae", **dict(weights, torch_dtype=torch.float32)),
            scheduler=load_component(_SchedulerFromConfig, path, "scheduler", **kw),
            transformer=load_component(WanTransformer3DModel, path, "transformer", **weights),
            transformer_2=load_component(WanTransformer3DModel, path, "transformer_2", **weights)
            if two_experts
            else None,
            boundary_ratio=index.get("boundary_ratio"),
            expand_timesteps=bool(index.get("expand_timesteps", False)),
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

    def _denoise(self, x: Tensor, t: Tensor, cond: Cond, *, negative: bool, expert: int = 0) -> Tensor:
        text = cond["prompt_embeds"]
        if negative:  # the batch is [uncond; cond]
            text = torch.cat([cond["negative_prompt_embeds"], text])  # [2B, L, D]
        if self.expand_timesteps:  # TI2V-5B: one timestep per latent token (all equal: no image to condition on)
            _, frames, h, w = self.latent_shape()
            t = t[:, None].expand(-1, frames * (h // 2) * (w // 2))  # [B, F'(h/2)(w/2)], as WanPipeline
        model = self.denoiser if expert == 0 else self.denoiser_2
        return model(
            hidden_states=x.to(self.dtype), timestep=t, encoder_hidden_states=text.to(self.dtype), return_dict=False
        )[0]

    def _expert_guided(self, expert: int, x: Tensor, t: Tensor, cond: Cond) -> Tensor:
        """One expert's guided prediction, with that expert's CFG weight."""
        return self._guided(x, t, cond, scale=(self.guidance_scale, self.guidance_scale_2)[expert], expert=expert)

    def predict(self, x: Tensor, step_index: int | Tensor, cond: Cond) -> Tensor:
        """Guided model output; with two experts, each row by the expert of its step."""
        idx = self._step_indices(step_index, x.shape[0], self.device)  # [B]
        t = self.timesteps(idx)  # [B]
        if self.denoiser_2 is None:
            return self._expert_guided(0, x, t, cond)
        steps = [step_index] * x.shape[0] if isinstance(step_index, int) else idx.tolist()
        experts = [self.step_expert[s] for s in steps]
        if len(set(experts)) == 1:
            return self._expert_guided(experts[0], x, t, cond)
        parts, order = [], []
        for expert in (0, 1):
            rows = [i for i, e in enumerate(experts) if e == expert]
            pick = torch.tensor(rows, device=x.device)
            parts.append(self._expert_guided(expert, x[pick], t[pick], {k: v[pick] for k, v in cond.items()}))
            order += rows
        back = torch.argsort(torch.tensor(order, device=x.device))  # rows back in the batch's order
        return torch.cat(parts)[back]

    def save_lora(self, folder: str | Path) -> Path:
        """One expert: what ``WanPipeline.load_lora_weights(folder)`` reads."""
        if self.denoiser_2 is None:
            return super().save_lora(folder)
        if self.lora is None:
            raise ValueError("save_lora needs LoRA training; save the full experts with save_pretrained")
        for name, model in self.trained_denoisers().items():
            self.pipeline.save_lora_weights(
                str(folder),
                transformer_lora_layers=lora_state_dict(model),
                transformer_lora_adapter_metadata=lora_metadata(model),
                weight_name=LORA_FILES[name],
            )
        return Path(folder)

    def lora_load_code(self) -> str:
        if self.denoiser_2 is None:
            return super().lora_load_code()
        lines = []
        for name in self.trained_denoisers():
            into = ", load_into_transformer_2=True" if name == "transformer_2" else ""
            lines.append(f'pipe.load_lora_weights(DIR, weight_name="{LORA_FILES[name]}"{into})')
        return "\n".join(lines)

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
