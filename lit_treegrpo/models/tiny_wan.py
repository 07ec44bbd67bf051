"""A tiny, seeded Wan2.1-shaped ``WanPipeline`` built from configs (no downloads), for tests and the
``configs/tiny_wan.yaml`` smoke run."""

from __future__ import annotations

from typing import Any, Literal

from .tiny import tiny_t5_tokenizer
from .wan import WanAdapter

Wan22 = Literal["ti2v", "a14b"]


def _tiny_transformer(seed: int, channels: int):
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=channels,
        out_channels=channels,
        text_dim=32,
        freq_dim=32,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )


def _tiny_umt5(seed: int):
    import torch
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    return UMT5EncoderModel(
        UMT5Config(
            vocab_size=200,
            d_model=32,
            d_kv=8,
            d_ff=37,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            dropout_rate=0.0,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        )
    )


def tiny_wan_pipeline(seed: int = 0, shift: float = 3.0):
    """A seeded Wan2.1-shaped ``WanPipeline`` (~60k parameters) with a ``FlowMatchEulerDiscreteScheduler(shift)``."""
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline

    transformer = _tiny_transformer(seed, 16)
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    )
    return WanPipeline(
        tokenizer=tiny_t5_tokenizer(model_max_length=512),
        text_encoder=_tiny_umt5(seed + 2),
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift),
        transformer=transformer,
    )


def tiny_wan22_pipeline(seed: int = 0, kind: Wan22 = "a14b", shift: float = 5.0):
    """A seeded Wan2.2-shaped ``WanPipeline`` with a ``FlowMatchEulerDiscreteScheduler(shift)``."""
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline

    common = dict(
        tokenizer=tiny_t5_tokenizer(model_max_length=512),
        text_encoder=_tiny_umt5(seed + 2),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift),
    )
    if kind == "ti2v":
        transformer = _tiny_transformer(seed, 48)
        torch.manual_seed(seed + 1)
        vae = AutoencoderKLWan(  # the Wan2.2 VAE's shape at 1/32 of its widths (base 160, decoder 256)
            base_dim=5,
            decoder_base_dim=8,
            z_dim=48,
            in_channels=12,
            out_channels=12,
            is_residual=True,
            patch_size=2,
            latents_mean=[0.0] * 48,
            latents_std=[1.0] * 48,
            dim_mult=[1, 2, 4, 4],
            num_res_blocks=2,
            scale_factor_spatial=16,
            scale_factor_temporal=4,
            temperal_downsample=[False, True, True],
        )
        return WanPipeline(**common, vae=vae, transformer=transformer, expand_timesteps=True)
    if kind != "a14b":
        raise ValueError(f"kind must be 'ti2v' or 'a14b', got {kind!r}")
    base = tiny_wan_pipeline(seed, shift)
    return WanPipeline(
        **common,
        vae=base.vae,
        transformer=base.transformer,
        transformer_2=_tiny_transformer(seed + 3, 16),
        boundary_ratio=0.875,
    )


class TinyWanAdapter(WanAdapter):
    """:class:`WanAdapter` over :func:`tiny_wan_pipeline`; defaults to 9 frames of 32 x 32 px and
    32 UMT5 tokens. Every other option is WanAdapter's."""

    def __init__(
        self,
        seed: int = 0,
        *,
        height: int = 32,
        width: int = 32,
        num_frames: int = 9,
        max_sequence_length: int = 32,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            tiny_wan_pipeline(seed),
            height=height,
            width=width,
            num_frames=num_frames,
            max_sequence_length=max_sequence_length,
            **kwargs,
        )
        self.base_pipeline_code = (
            "from lit_treegrpo.models.tiny_wan import tiny_wan_pipeline",
            f"tiny_wan_pipeline(seed={seed})",
        )


class TinyWan22Adapter(WanAdapter):
    """:class:`WanAdapter` over :func:`tiny_wan22_pipeline` (``kind`` ``ti2v`` or ``a14b``); defaults to 9 frames of 64
    x 64 px (TI2V: latents [48, 3, 4, 4]) or 32 x 32 px (A14B: [16, 3, 4, 4]) and 32 UMT5 tokens."""

    def __init__(
        self,
        seed: int = 0,
        *,
        kind: Wan22 = "a14b",
        height: int | None = None,
        width: int | None = None,
        num_frames: int = 9,
        max_sequence_length: int = 32,
        **kwargs: Any,
    ) -> None:
        side = 64 if kind == "ti2v" else 32
        super().__init__(
            tiny_wan22_pipeline(seed, kind),
            height=height or side,
            width=width or side,
            num_frames=num_frames,
            max_sequence_length=max_sequence_length,
            **kwargs,
        )
        self.base_pipeline_code = (
            "from lit_treegrpo.models.tiny_wan import tiny_wan22_pipeline",
            f"tiny_wan22_pipeline(seed={seed}, kind={kind!r})",
        )
