"""A tiny, seeded Wan2.1-shaped ``WanPipeline`` built from configs (no downloads), for tests and
the ``configs/tiny_wan.yaml`` smoke run. ``save_pretrained`` of it writes a folder that exercises
:class:`~lit_treegrpo.models.wan.WanAdapter`'s real loading path.

Shapes (diffusers' own Wan test sizes): transformer 2 layers x 2 heads x 12 dims, patch (1, 2, 2),
UMT5 2 layers x 32 dims, VAE base width 3 with Wan's 16 latent channels and 4x temporal / 8x
spatial compression; the default video is 9 frames of 32 x 32 px (latents [16, 3, 4, 4]).
"""

from __future__ import annotations

from typing import Any

from .tiny import tiny_t5_tokenizer
from .wan import WanAdapter


def tiny_wan_pipeline(seed: int = 0, shift: float = 3.0):
    """A seeded ``WanPipeline`` (~60k parameters) with a ``FlowMatchEulerDiscreteScheduler(shift)``."""
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=32,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    )
    torch.manual_seed(seed + 2)
    text_encoder = UMT5EncoderModel(
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
    return WanPipeline(
        tokenizer=tiny_t5_tokenizer(model_max_length=512),
        text_encoder=text_encoder,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift),
        transformer=transformer,
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
