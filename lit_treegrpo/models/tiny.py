"""Tiny, seeded model components built from configs, for tests and smoke runs (no downloads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .flux import FluxAdapter
from .published import FLUX_DEV_SCHEDULER
from .sd3 import SD3Adapter
from .sd15 import SD15Adapter


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / CLIP byte-to-printable-character table (the BPE alphabet)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def write_clip_vocab(folder: str | Path) -> tuple[Path, Path]:
    """Write ``vocab.json`` and ``merges.txt`` of a 514-token byte-level CLIP BPE into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    alphabet = list(_bytes_to_unicode().values())
    tokens = alphabet + [c + "</w>" for c in alphabet] + ["<|startoftext|>", "<|endoftext|>"]
    vocab_file, merges_file = folder / "vocab.json", folder / "merges.txt"
    vocab_file.write_text(json.dumps({t: i for i, t in enumerate(tokens)}, ensure_ascii=False))
    merges_file.write_text("#version: 0.2\n")
    return vocab_file, merges_file


def tiny_clip_tokenizer(folder: str | Path, model_max_length: int = 77):
    """A working offline ``CLIPTokenizer`` (514 tokens), its files written into ``folder``."""
    from transformers import CLIPTokenizer

    vocab_file, merges_file = write_clip_vocab(folder)
    # positional: transformers 4 names them vocab_file / merges_file, 5 names them vocab / merges
    return CLIPTokenizer(str(vocab_file), str(merges_file), model_max_length=model_max_length)


def tiny_t5_tokenizer(model_max_length: int = 128):
    """A working offline ``T5TokenizerFast``: unigram over printable ASCII, ``</s>`` appended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import T5TokenizerFast

    chars = [chr(i) for i in range(32, 127)]
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -1.0)]
    vocab += [(c, -2.0) for c in chars] + [("▁" + c, -2.0) for c in chars]
    backend = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return T5TokenizerFast(
        tokenizer_object=backend,
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_ids=0,
        model_max_length=model_max_length,
    )


def _tiny_clip_text_config(**overrides):
    from transformers import CLIPTextConfig

    # ids of the written vocabulary: 512 <|startoftext|>, 513 <|endoftext|> (also padding)
    fields = dict(
        bos_token_id=512,
        eos_token_id=513,
        pad_token_id=513,
        hidden_size=32,
        intermediate_size=37,
        num_attention_heads=4,
        num_hidden_layers=2,
        vocab_size=600,
        max_position_embeddings=77,
        projection_dim=32,
    )
    fields.update(overrides)
    return CLIPTextConfig(**fields)


def _tiny_t5_encoder():
    """A 2-layer T5 encoder (d_model 32) whose 200-row vocabulary covers :func:`tiny_t5_tokenizer`'s
    ids (0 pad, 1 eos), initialised from the global seed."""
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=200,
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
    )
    return T5EncoderModel(config)


def _tiny_vae(latent_channels: int, **extra):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=4,
        sample_size=32,
        **extra,
    )


def tiny_sd15_pipeline(seed: int = 0, folder: str | Path | None = None, prediction_type: str = "epsilon"):
    """A seeded SD 1.5-shaped ``StableDiffusionPipeline`` (~0.2M parameters, 32 px images)."""
    import tempfile

    import torch
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="tiny_sd15_"))
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        block_out_channels=(16, 32),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=4,
        norm_num_groups=8,
    )
    torch.manual_seed(seed + 1)
    vae = _tiny_vae(4)
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(_tiny_clip_text_config())
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
        prediction_type=prediction_type,
    )
    return StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tiny_clip_tokenizer(folder / "tokenizer"),
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def tiny_sd3_pipeline(seed: int = 0, folder: str | Path | None = None, with_t5: bool = True, sd35: bool = True):
    """A seeded SD3-shaped ``StableDiffusion3Pipeline`` (two CLIPs, optional tiny T5, 32 px)."""
    import tempfile

    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection

    folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="tiny_sd3_"))
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        joint_attention_dim=32,
        pooled_projection_dim=64,
        pos_embed_max_size=16,
        **(dict(qk_norm="rms_norm", dual_attention_layers=(0,)) if sd35 else {}),
    )
    torch.manual_seed(seed + 1)
    vae = _tiny_vae(4, use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035)
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModelWithProjection(_tiny_clip_text_config())
    torch.manual_seed(seed + 3)
    text_encoder_2 = CLIPTextModelWithProjection(_tiny_clip_text_config())
    t5 = None
    if with_t5:
        torch.manual_seed(seed + 4)
        t5 = _tiny_t5_encoder()
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tiny_clip_tokenizer(folder / "tokenizer"),
        text_encoder_2=text_encoder_2,
        tokenizer_2=tiny_clip_tokenizer(folder / "tokenizer_2"),
        text_encoder_3=t5,
        tokenizer_3=tiny_t5_tokenizer() if with_t5 else None,
    )


def tiny_flux_pipeline(seed: int = 0, folder: str | Path | None = None, schnell: bool = False):
    """A seeded FLUX.1-shaped ``FluxPipeline`` (CLIP pooled + tiny T5, 1 double- and 1 single-stream block, 32 px;
    heads of 32 dims split by RoPE as FLUX.1's 128 are, 16:56:56)."""
    import tempfile

    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="tiny_flux_"))
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,  # 4 latent channels packed 2x2
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=32,  # T5's d_model
        pooled_projection_dim=32,  # CLIP's hidden size (its pooled output)
        guidance_embeds=not schnell,
        axes_dims_rope=(4, 14, 14),  # FLUX.1's (16, 56, 56) of 128 dims, at 32
    )
    torch.manual_seed(seed + 1)
    vae = _tiny_vae(4, use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.1159, scaling_factor=0.3611)
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(_tiny_clip_text_config())
    torch.manual_seed(seed + 3)
    t5 = _tiny_t5_encoder()
    if schnell:
        scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False)
    else:
        scheduler = FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER)
    return FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tiny_clip_tokenizer(folder / "tokenizer"),
        text_encoder_2=t5,
        tokenizer_2=tiny_t5_tokenizer(),
        transformer=transformer,
    )


class TinySD15Adapter(SD15Adapter):
    """:class:`SD15Adapter` over :func:`tiny_sd15_pipeline`: a seconds-scale model for smoke
    configs and tests. Every other option is SD15Adapter's."""

    def __init__(self, seed: int = 0, *, prediction_type: str = "epsilon", **kwargs: Any) -> None:
        super().__init__(tiny_sd15_pipeline(seed, prediction_type=prediction_type), **kwargs)
        self.base_pipeline_code = (
            "from lit_treegrpo.models.tiny import tiny_sd15_pipeline",
            f"tiny_sd15_pipeline(seed={seed}, prediction_type={prediction_type!r})",
        )


class TinySD3Adapter(SD3Adapter):
    """:class:`SD3Adapter` over :func:`tiny_sd3_pipeline` (with its tiny T5 unless ``use_t5`` is
    false; SD3.5's blocks unless ``sd35`` is false). Every other option is SD3Adapter's."""

    def __init__(self, seed: int = 0, *, sd35: bool = True, **kwargs: Any) -> None:
        with_t5 = kwargs.get("use_t5", True)
        super().__init__(tiny_sd3_pipeline(seed, with_t5=with_t5, sd35=sd35), **kwargs)
        self.sd35 = sd35
        self.base_pipeline_code = (
            "from lit_treegrpo.models.tiny import tiny_sd3_pipeline",
            f"tiny_sd3_pipeline(seed={seed}, with_t5={with_t5}, sd35={sd35})",
        )


class TinyFluxAdapter(FluxAdapter):
    """:class:`FluxAdapter` over :func:`tiny_flux_pipeline` (32 px unless ``resolution`` says
    otherwise; ``schnell`` for the -schnell shape). Every other option is FluxAdapter's."""

    def __init__(self, seed: int = 0, *, schnell: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("resolution", 32)
        kwargs.setdefault("max_sequence_length", 128)  # the tiny T5 tokenizer's limit
        super().__init__(tiny_flux_pipeline(seed, schnell=schnell), **kwargs)
        self.base_pipeline_code = (
            "from lit_treegrpo.models.tiny import tiny_flux_pipeline",
            f"tiny_flux_pipeline(seed={seed}, schnell={schnell})",
        )
