"""The real targets' published architectures, written down as config dicts (each checkpoint's
``config.json`` on the hub), so that they can be built without their weights: on the meta device
for parameter counts and LoRA targets (``tests/models/test_real_configs.py``), or at real width and
reduced depth with random weights (``benchmarks/real_width.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .lora import FLUX_LORA_TARGETS, SD3_LORA_TARGETS, SD15_LORA_TARGETS, LoraSettings, attach_lora, unused_submodules

# ---------------------------------------------------------------------------------- denoisers
#: stable-diffusion-v1-5/stable-diffusion-v1-5, unet/config.json
SD15_UNET = dict(
    sample_size=64,
    in_channels=4,
    out_channels=4,
    layers_per_block=2,
    block_out_channels=(320, 640, 1280, 1280),
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=768,
    attention_head_dim=8,
    norm_num_groups=32,
)
#: stabilityai/stable-diffusion-3.5-medium, transformer/config.json: dual attention in blocks 0-12
SD35_MEDIUM = dict(
    sample_size=128,
    patch_size=2,
    in_channels=16,
    out_channels=16,
    num_layers=24,
    attention_head_dim=64,
    num_attention_heads=24,
    joint_attention_dim=4096,
    caption_projection_dim=1536,
    pooled_projection_dim=2048,
    pos_embed_max_size=384,
    qk_norm="rms_norm",
    dual_attention_layers=tuple(range(13)),
)
#: stabilityai/stable-diffusion-3.5-large, transformer/config.json
SD35_LARGE = dict(
    sample_size=128,
    patch_size=2,
    in_channels=16,
    out_channels=16,
    num_layers=38,
    attention_head_dim=64,
    num_attention_heads=38,
    joint_attention_dim=4096,
    caption_projection_dim=2432,
    pooled_projection_dim=2048,
    pos_embed_max_size=192,
    qk_norm="rms_norm",
)
#: black-forest-labs/FLUX.1-dev, transformer/config.json
FLUX_DEV = dict(
    patch_size=1,
    in_channels=64,
    num_layers=19,
    num_single_layers=38,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=4096,
    pooled_projection_dim=768,
    guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)
#: Qwen/Qwen-Image, transformer/config.json
QWEN_IMAGE = dict(
    patch_size=2,
    in_channels=64,
    out_channels=16,
    num_layers=60,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=3584,
    axes_dims_rope=(16, 56, 56),
)
_WAN = dict(
    patch_size=(1, 2, 2),
    attention_head_dim=128,
    text_dim=4096,
    freq_dim=256,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    rope_max_seq_len=1024,
)
#: Wan-AI/Wan2.1-T2V-1.3B-Diffusers, transformer/config.json
WAN21_1_3B = dict(_WAN, num_attention_heads=12, in_channels=16, out_channels=16, ffn_dim=8960, num_layers=30)
#: Wan-AI/Wan2.2-TI2V-5B-Diffusers, transformer/config.json (48 latent channels of the Wan2.2 VAE)
WAN22_TI2V_5B = dict(_WAN, num_attention_heads=24, in_channels=48, out_channels=48, ffn_dim=14336, num_layers=30)
#: Wan-AI/Wan2.2-T2V-A14B-Diffusers, transformer/ and transformer_2/config.json (one per expert)
WAN22_A14B = dict(_WAN, num_attention_heads=40, in_channels=16, out_channels=16, ffn_dim=13824, num_layers=40)

# ---------------------------------------------------------------------------------- schedulers
#: black-forest-labs/FLUX.1-dev, scheduler/scheduler_config.json (FlowMatchEulerDiscreteScheduler)
FLUX_DEV_SCHEDULER = dict(
    shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096
)
#: Qwen/Qwen-Image, scheduler/scheduler_config.json (FlowMatchEulerDiscreteScheduler)
QWEN_IMAGE_SCHEDULER = dict(
    base_image_seq_len=256,
    base_shift=0.5,
    max_image_seq_len=8192,
    max_shift=0.9,
    shift=1.0,
    shift_terminal=0.02,
    time_shift_type="exponential",
    use_dynamic_shifting=True,
)

# ---------------------------------------------------------------------------------- text encoders, VAEs
#: openai/clip-vit-large-patch14 (SD 1.5's text_encoder, SD3's and FLUX's CLIP-L)
CLIP_L = dict(
    hidden_size=768,
    intermediate_size=3072,
    num_attention_heads=12,
    num_hidden_layers=12,
    max_position_embeddings=77,
    vocab_size=49408,
    hidden_act="quick_gelu",
    projection_dim=768,
)
#: laion CLIP-ViT-bigG-14 text tower (SD3's text_encoder_2)
CLIP_G = dict(
    hidden_size=1280,
    intermediate_size=5120,
    num_attention_heads=20,
    num_hidden_layers=32,
    max_position_embeddings=77,
    vocab_size=49408,
    hidden_act="gelu",
    projection_dim=1280,
)
#: google/t5-v1_1-xxl's encoder (SD3's text_encoder_3, FLUX's text_encoder_2)
T5_XXL = dict(
    vocab_size=32128,
    d_model=4096,
    d_kv=64,
    d_ff=10240,
    num_layers=24,
    num_heads=64,
    feed_forward_proj="gated-gelu",
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    layer_norm_epsilon=1e-6,
    tie_word_embeddings=False,
)
#: google/umt5-xxl's encoder (Wan's text_encoder)
UMT5_XXL = dict(T5_XXL, vocab_size=256384)
#: Qwen/Qwen2.5-VL-7B-Instruct (Qwen-Image's text_encoder): 28 query heads over 4 key-value heads,
#: multimodal RoPE sections 16:24:24 of the 128-dim heads
QWEN25_VL_7B_TEXT = dict(
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    max_position_embeddings=128000,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": [16, 24, 24]},
    hidden_act="silu",
    tie_word_embeddings=False,
)
QWEN25_VL_7B_VISION = dict(
    depth=32,
    hidden_size=1280,
    intermediate_size=3420,
    num_heads=16,
    in_chans=3,
    out_hidden_size=3584,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    window_size=112,
    fullatt_block_indexes=[7, 15, 23, 31],
    hidden_act="silu",
)
#: SD 1.5's vae/config.json
SD15_VAE = dict(
    block_out_channels=(128, 256, 512, 512),
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    latent_channels=4,
    layers_per_block=2,
    norm_num_groups=32,
    sample_size=512,
)
#: SD3.5's vae/config.json (16 latent channels, no quant convs)
SD3_VAE = dict(
    SD15_VAE,
    latent_channels=16,
    use_quant_conv=False,
    use_post_quant_conv=False,
    shift_factor=0.0609,
    scaling_factor=1.5305,
    sample_size=1024,
)
#: FLUX.1-dev's vae/config.json: SD3's with its own latent statistics
FLUX_VAE = dict(SD3_VAE, shift_factor=0.1159, scaling_factor=0.3611)
#: Wan2.1's (and Qwen-Image's) VAE: diffusers' AutoencoderKLWan / AutoencoderKLQwenImage defaults
#: are these checkpoints' configs, latent statistics included
WAN21_VAE = dict(
    base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, temperal_downsample=[False, True, True]
)
#: Wan2.2's VAE (TI2V-5B): 48 channels, 16x spatial compression, a decoder wider than its encoder.
#: Its 48 latent means and stds are left at 0 and 1 (they scale the latents; no count depends on them).
WAN22_VAE = dict(
    WAN21_VAE,
    base_dim=160,
    decoder_base_dim=256,
    z_dim=48,
    in_channels=12,
    out_channels=12,
    is_residual=True,
    patch_size=2,
    scale_factor_spatial=16,
    scale_factor_temporal=4,
    latents_mean=[0.0] * 48,
    latents_std=[1.0] * 48,
)


def _diffusers(name: str) -> Callable[..., nn.Module]:
    def build(**config: Any) -> nn.Module:
        import diffusers

        return getattr(diffusers, name)(**config)

    return build


def _clip(projection: bool) -> Callable[..., nn.Module]:
    def build(**config: Any) -> nn.Module:
        from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

        return (CLIPTextModelWithProjection if projection else CLIPTextModel)(CLIPTextConfig(**config))

    return build


def _t5(umt5: bool) -> Callable[..., nn.Module]:
    def build(**config: Any) -> nn.Module:
        from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

        return UMT5EncoderModel(UMT5Config(**config)) if umt5 else T5EncoderModel(T5Config(**config))

    return build


def _qwen25_vl(**config: Any) -> nn.Module:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(text_config=config["text"], vision_config=config["vision"])
    )


@dataclass(frozen=True)
class Component:
    """One model of a pipeline: how to build it and its published config."""

    build: Callable[..., nn.Module]
    config: dict[str, Any]

    def on_meta(self, **overrides: Any) -> nn.Module:
        """The model on the meta device: shapes without memory or initialisation."""
        with torch.device("meta"):
            return self.build(**{**self.config, **overrides})


COMPONENTS: dict[str, Component] = {
    "clip_l": Component(_clip(False), CLIP_L),
    "clip_l_projection": Component(_clip(True), CLIP_L),
    "clip_g_projection": Component(_clip(True), CLIP_G),
    "t5_xxl": Component(_t5(False), T5_XXL),
    "umt5_xxl": Component(_t5(True), UMT5_XXL),
    "qwen25_vl_7b": Component(_qwen25_vl, {"text": QWEN25_VL_7B_TEXT, "vision": QWEN25_VL_7B_VISION}),
    "sd15_vae": Component(_diffusers("AutoencoderKL"), SD15_VAE),
    "sd3_vae": Component(_diffusers("AutoencoderKL"), SD3_VAE),
    "flux_vae": Component(_diffusers("AutoencoderKL"), FLUX_VAE),
    "wan21_vae": Component(_diffusers("AutoencoderKLWan"), WAN21_VAE),
    "qwen_image_vae": Component(_diffusers("AutoencoderKLQwenImage"), WAN21_VAE),
    "wan22_vae": Component(_diffusers("AutoencoderKLWan"), WAN22_VAE),
}


def _no_unused(model: nn.Module) -> tuple[str, ...]:
    return ()


def _sd3_unused(model: nn.Module) -> tuple[str, ...]:
    from .sd3 import sd3_unused_modules

    return sd3_unused_modules(model)


def _qwen_unused(model: nn.Module) -> tuple[str, ...]:
    from .qwen_image import unused_text_outputs

    return unused_text_outputs(model)


@dataclass(frozen=True)
class Target:
    """A real model this project trains: its denoiser (``experts`` of them: Wan2.2 A14B has two),
    the shipped config that trains it (None: none ships) and that config's LoRA (its rank, alpha and
    targets; the adapter's default LoRA where no config ships or the config fine-tunes fully)."""

    denoiser: Component
    experts: int
    config_file: str | None
    lora: LoraSettings
    default_targets: tuple[str, ...]
    unused: Callable[[nn.Module], tuple[str, ...]] = _no_unused
    components: tuple[str, ...] = field(default=())

    def denoiser_on_meta(self, **overrides: Any) -> nn.Module:
        return self.denoiser.on_meta(**overrides)

    def lora_parameters(self, model: nn.Module | None = None) -> int:
        """LoRA parameters of all experts, attached as the adapter attaches them (the targets, less
        the modules whose output is never used), on the meta device."""
        model = model if model is not None else self.denoiser_on_meta()
        with torch.device("meta"):
            attach_lora(model, self.lora, self.default_targets, unused_submodules(model, self.unused(model)))
        return self.experts * sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)


_WAN_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
_QWEN_VERL_TARGETS = (*_WAN_TARGETS, "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
                      "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2")  # fmt: skip
TARGETS: dict[str, Target] = {
    "sd15": Target(
        Component(_diffusers("UNet2DConditionModel"), SD15_UNET),
        1,
        "configs/sd15.yaml",
        LoraSettings(rank=4, alpha=4.0),
        SD15_LORA_TARGETS,
        components=("clip_l", "sd15_vae"),
    ),
    "sd35_medium": Target(
        Component(_diffusers("SD3Transformer2DModel"), SD35_MEDIUM),
        1,
        "configs/sd35.yaml",
        LoraSettings(rank=32, alpha=64.0),
        SD3_LORA_TARGETS,
        _sd3_unused,
        components=("clip_l_projection", "clip_g_projection", "t5_xxl", "sd3_vae"),
    ),
    "sd35_large": Target(
        Component(_diffusers("SD3Transformer2DModel"), SD35_LARGE),
        1,
        "configs/sd35_large.yaml",
        LoraSettings(rank=32, alpha=64.0),
        SD3_LORA_TARGETS,
        _sd3_unused,
        components=("clip_l_projection", "clip_g_projection", "t5_xxl", "sd3_vae"),
    ),
    "flux_dev": Target(
        Component(_diffusers("FluxTransformer2DModel"), FLUX_DEV),
        1,
        "configs/flux.yaml",
        LoraSettings(rank=32, alpha=64.0),  # the config's LoRA alternative to its full fine-tuning
        FLUX_LORA_TARGETS,
        components=("clip_l", "t5_xxl", "flux_vae"),
    ),
    "qwen_image": Target(
        Component(_diffusers("QwenImageTransformer2DModel"), QWEN_IMAGE),
        1,
        "configs/qwen_image.yaml",
        LoraSettings(rank=64, alpha=128.0, target_modules=_QWEN_VERL_TARGETS),
        SD3_LORA_TARGETS,
        _qwen_unused,
        components=("qwen25_vl_7b", "qwen_image_vae"),
    ),
    "wan21_1_3b": Target(
        Component(_diffusers("WanTransformer3DModel"), WAN21_1_3B),
        1,
        "configs/wan.yaml",
        LoraSettings(rank=32, alpha=64.0),
        _WAN_TARGETS,
        components=("umt5_xxl", "wan21_vae"),
    ),
    "wan22_ti2v_5b": Target(
        Component(_diffusers("WanTransformer3DModel"), WAN22_TI2V_5B),
        1,
        None,
        LoraSettings(rank=32, alpha=64.0),
        _WAN_TARGETS,
        components=("umt5_xxl", "wan22_vae"),
    ),
    "wan22_a14b": Target(
        Component(_diffusers("WanTransformer3DModel"), WAN22_A14B),
        2,
        None,
        LoraSettings(rank=32, alpha=64.0),
        _WAN_TARGETS,
        components=("umt5_xxl", "wan21_vae"),
    ),
}


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def buffers(model: nn.Module) -> int:
    return sum(b.numel() for b in model.buffers())
