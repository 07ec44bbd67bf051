"""A tiny, seeded Qwen-Image-shaped ``QwenImagePipeline`` built from configs (no downloads), for tests and the
``configs/tiny_qwen_image.yaml`` smoke run."""

from __future__ import annotations

from typing import Any

from .published import QWEN_IMAGE_SCHEDULER
from .qwen_image import QwenImageAdapter

#: the words of QwenImagePipeline's prompt template, whole tokens as in Qwen's vocabulary
_TEMPLATE_WORDS = [
    "system",
    "user",
    "assistant",
    "Describe",
    "the",
    "image",
    "by",
    "detailing",
    "color",
    "shape",
    "size",
    "texture",
    "quantity",
    "text",
    "spatial",
    "relationships",
    "of",
    "objects",
    "and",
    "background",
]


def tiny_qwen_tokenizer(model_max_length: int = 2048):
    """A working offline fast tokenizer (~120 tokens): chat-template specials, the template's
    words, printable ASCII characters; spaces separate words and are not tokens."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    vocab = [(t, 0.0) for t in specials] + [("\n", -1.0)]
    vocab += [(w, -1.0) for w in _TEMPLATE_WORDS] + [(chr(i), -2.0) for i in range(33, 127)]
    backend = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(" ", "removed"), pre_tokenizers.Split(Regex(r"\n|[,:.!?]"), "isolated")]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=model_max_length,
    )


def _tiny_qwen_text_encoder(tokenizer: Any, vocab: int) -> Any:
    """A tiny Qwen2.5-VL text encoder (its weights drawn from the global RNG, seeded by the caller)."""
    text = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_scaling={"mrope_section": [2, 3, 3], "rope_type": "default", "type": "default"},
        rope_theta=1e6,
    )
    vision = dict(depth=2, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=64)
    return qwen_text_encoder(tokenizer, vocab, text, vision)


def qwen_text_encoder(tokenizer: Any, vocab: int, text: dict[str, Any], vision: dict[str, Any]) -> Any:
    """A random Qwen2.5-VL for the offline tokenizer: ``vocab`` ids, the last four the vision tokens
    (never produced by text), the tokenizer's end and padding ids; ``text`` / ``vision`` the rest."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = dict(bos_token_id=None, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
               pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    return Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(
            text_config={**text, "vocab_size": vocab, **ids},
            vision_config=vision,
            vocab_size=vocab,
            vision_start_token_id=vocab - 4,
            image_token_id=vocab - 3,
            video_token_id=vocab - 2,
            vision_end_token_id=vocab - 1,
            **ids,
        )
    )


def tiny_qwen_image_pipeline(seed: int = 0):
    """A seeded ``QwenImagePipeline`` (~0.3M parameters) with Qwen-Image's scheduler config."""
    import torch
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )

    tokenizer = tiny_qwen_tokenizer()
    vocab = 128  # > the tokenizer's ids; the vision-token ids sit above them, never produced by text
    torch.manual_seed(seed)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,
        out_channels=16,
        num_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=64,  # the text encoder's width
        axes_dims_rope=(4, 14, 14),
    )
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLQwenImage(
        base_dim=4,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * 16,
        latents_std=[1.0] * 16,
    )
    torch.manual_seed(seed + 2)
    text_encoder = _tiny_qwen_text_encoder(tokenizer, vocab)
    scheduler = FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER)
    return QwenImagePipeline(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer
    )


class TinyQwenImageAdapter(QwenImageAdapter):
    """:class:`QwenImageAdapter` over :func:`tiny_qwen_image_pipeline`; defaults to 32 x 32 px and
    64 text tokens. Every other option is QwenImageAdapter's."""

    def __init__(
        self, seed: int = 0, *, height: int = 32, width: int = 32, max_sequence_length: int = 64, **kwargs: Any
    ) -> None:
        super().__init__(
            tiny_qwen_image_pipeline(seed),
            height=height,
            width=width,
            max_sequence_length=max_sequence_length,
            **kwargs,
        )
        self.base_pipeline_code = (
            "from lit_treegrpo.models.tiny_qwen import tiny_qwen_image_pipeline",
            f"tiny_qwen_image_pipeline(seed={seed})",
        )
