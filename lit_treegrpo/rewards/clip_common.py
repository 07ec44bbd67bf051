"""Shared pieces of the CLIP-based rewards: loading, embedding, and tiny random CLIPs for tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_treegrpo.rewards.base import BatchSize, RewardModel, clip_pixels, load_or_explain, unique_prompts


def _embedding(out: Any) -> Tensor:
    """The projected embedding from a transformers 4 tensor or a transformers 5 model output."""
    return out if isinstance(out, Tensor) else out.pooler_output


def image_embeds(model, pixel_values: Tensor) -> Tensor:
    """Projected CLIP image embeddings [B, D] (not normalised) of ``pixel_values`` [B, 3, S, S]."""
    return _embedding(model.get_image_features(pixel_values=pixel_values))


def text_embeds(model, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """Projected CLIP text embeddings [B, D] (not normalised) of ``input_ids`` [B, T]."""
    return _embedding(model.get_text_features(input_ids=input_ids, attention_mask=attention_mask))


def tokenize(tokenizer, prompts: list[str], max_length: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """``input_ids``, ``attention_mask`` [B, T] padded to the longest prompt, truncated to
    ``max_length`` (the tokenizer keeps the end-of-text token last)."""
    enc = tokenizer(prompts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def load_clip(name_or_path: str | Path, what: str, dtype: torch.dtype = torch.float32):
    """``CLIPModel.from_pretrained`` with a one-line error when it is missing (e.g. offline)."""
    from transformers import CLIPModel

    model = load_or_explain(what, name_or_path, lambda: CLIPModel.from_pretrained(str(name_or_path)))
    return model.to(dtype)


def offline_clip_tokenizer(folder: str | Path, model_max_length: int = 77):
    """The offline 514-token byte-level CLIP tokenizer of :mod:`lit_treegrpo.models.tiny`, saved
    in ``folder`` (works on transformers 4 and 5; the extra venv runs 4.x)."""
    from lit_treegrpo.models.tiny import tiny_clip_tokenizer

    tokenizer = tiny_clip_tokenizer(folder, model_max_length=model_max_length)
    tokenizer.save_pretrained(folder)
    return tokenizer


def tiny_clip_config(image_size: int = 32, projection_dim: int = 16, hidden_act: str = "gelu"):
    """A 2-layer, 32-wide ``CLIPConfig`` matching the offline 514-token tokenizer of
    :func:`lit_treegrpo.models.tiny.tiny_clip_tokenizer` (bos 512, eos = pad = 513)."""
    from transformers import CLIPConfig

    common = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        hidden_act=hidden_act,
        projection_dim=projection_dim,
    )
    text = dict(
        common,
        vocab_size=514,
        max_position_embeddings=77,
        bos_token_id=512,
        eos_token_id=513,
        pad_token_id=513,
    )
    vision = dict(common, image_size=image_size, patch_size=8)
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=projection_dim)


def write_tiny_clip(folder: str | Path, seed: int = 0, image_size: int = 32, projection_dim: int = 16) -> Path:
    """Save a seeded random tiny ``CLIPModel`` and its offline tokenizer into ``folder``."""
    from transformers import CLIPModel

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):  # seeded without touching the caller's RNG
        torch.manual_seed(seed)
        model = CLIPModel(tiny_clip_config(image_size, projection_dim))
    model.save_pretrained(folder)
    offline_clip_tokenizer(folder)
    return folder


class ClipReward(RewardModel):
    """Base of the rewards built on a transformers ``CLIPModel``: torch preprocessing (CLIP's
    validation transform at the model's image size) and L2-normalised embeddings.

    Args:
        model: a ``CLIPModel`` (any size, any dtype; embeddings are returned in float32).
        tokenizer: its tokenizer (``None`` for image-only rewards).
        max_batch: images per model call (``None``: all at once).
    """

    def __init__(self, model, tokenizer=None, max_batch: BatchSize | None = None) -> None:
        super().__init__(max_batch=max_batch)
        self.model = model
        self.tokenizer = tokenizer
        self.image_size = int(model.config.vision_config.image_size)

    def embed_images(self, images: Tensor) -> Tensor:
        """Unit-norm image embeddings [B, D] float32 of ``images`` [B, 3, H, W] in [0, 1]."""
        pixels = clip_pixels(images, self.image_size).to(self.param_dtype())  # [B, 3, S, S]
        return F.normalize(image_embeds(self.model, pixels).float(), dim=-1)  # [B, D]

    def embed_prompts(self, prompts: list[str], device: torch.device) -> Tensor:
        """Unit-norm text embeddings [B, D] float32; each distinct prompt is encoded once."""
        if self.tokenizer is None:
            raise RuntimeError(f"reward '{self.name}' has no tokenizer")
        distinct, index = unique_prompts(prompts)  # [U] strings, [B]: a prompt is encoded once
        max_length = int(self.model.config.text_config.max_position_embeddings)
        ids, mask = tokenize(self.tokenizer, distinct, max_length, device)  # [U, T]
        emb = F.normalize(text_embeds(self.model, ids, mask).float(), dim=-1)  # [U, D]
        return emb[index.to(device)]  # [B, D]
