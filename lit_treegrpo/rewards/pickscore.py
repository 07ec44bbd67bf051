"""PickScore (Kirstain et al., "Pick-a-Pic: An Open Dataset of User Preferences for Text-to-Image
Generation", NeurIPS 2023): a CLIP ViT-H-14 fine-tuned on human preferences."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from lit_treegrpo.rewards.base import BatchSize, load_tokenizer
from lit_treegrpo.rewards.clip_common import (
    ClipReward,
    load_clip,
    write_tiny_clip,
)

PICKSCORE_MODEL = "yuvalkirstain/PickScore_v1"
PICKSCORE_TOKENIZER = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"  # the model card's processor


class PickScore(ClipReward):
    """PickScore_v1 on a transformers ``CLIPModel``; see the module docstring."""

    name = "pickscore"

    def __init__(self, model, tokenizer, max_batch: BatchSize | None = None) -> None:
        super().__init__(model, tokenizer, max_batch=max_batch)
        self.freeze()

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path = PICKSCORE_MODEL,
        tokenizer: str | Path = PICKSCORE_TOKENIZER,
        dtype: torch.dtype = torch.float32,
        max_batch: BatchSize | None = None,
    ) -> PickScore:
        """Model and tokenizer from local folders or hub ids (one-line error when missing)."""
        return cls(
            load_clip(model, "PickScore model", dtype),
            load_tokenizer(tokenizer, "PickScore tokenizer"),
            max_batch=max_batch,
        )

    @classmethod
    def tiny(cls, folder: str | Path, seed: int = 0, max_batch: BatchSize | None = None) -> PickScore:
        """A random 2-layer CLIP (32 px) with the offline tokenizer, saved to and loaded from
        ``folder`` through :meth:`from_pretrained`; for tests."""
        path = write_tiny_clip(folder, seed=seed)
        return cls.from_pretrained(path, path, max_batch=max_batch)

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        img = self.embed_images(images)  # [B, D] unit norm
        txt = self.embed_prompts(prompts, images.device)  # [B, D] unit norm
        return self.model.logit_scale.float().exp() * (img * txt).sum(dim=-1)  # [B]
