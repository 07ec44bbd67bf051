"""CLIPScore (Hessel et al., "CLIPScore: A Reference-free Evaluation Metric for Image Captioning",
EMNLP 2021) through torchmetrics: ``max(100 * cos(E_I, E_C), 0)`` per image."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from lit_treegrpo.rewards.base import BatchSize, clip_pixels, load_tokenizer
from lit_treegrpo.rewards.clip_common import (
    ClipReward,
    image_embeds,
    load_clip,
    text_embeds,
    write_tiny_clip,
)

CLIP_SCORE_MODEL = "openai/clip-vit-large-patch14"  # torchmetrics' default


class FeatureAdapter:
    """A ``CLIPModel`` whose ``get_image_features`` / ``get_text_features`` return the projected
    embedding tensors [B, D] (in float32) on transformers 4 and 5 alike."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @property
    def config(self):
        return self.model.config  # torchmetrics reads text_config.max_position_embeddings

    def to(self, device: torch.device | str) -> FeatureAdapter:
        self.model.to(device)  # torchmetrics moves the model to the images' device
        return self

    def get_image_features(self, pixel_values: Tensor) -> Tensor:
        dtype = next(self.model.parameters()).dtype
        return image_embeds(self.model, pixel_values.to(dtype)).float()  # [B, D]

    def get_text_features(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return text_embeds(self.model, input_ids, attention_mask).float()  # [B, D]


class TensorProcessor:
    """The processor torchmetrics calls: ``images`` are preprocessed [3, S, S] tensors (stacked),
    ``text`` is tokenized, padded to the longest prompt and truncated at ``max_length``."""

    def __init__(self, tokenizer, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __call__(
        self,
        text: list[str] | None = None,
        images: list[Tensor] | None = None,
        return_tensors: str = "pt",
        padding: bool = True,
    ) -> dict[str, Tensor]:
        if return_tensors != "pt":
            raise ValueError(f"TensorProcessor returns torch tensors only, got return_tensors={return_tensors!r}")
        out: dict[str, Tensor] = {}
        if images is not None:
            out["pixel_values"] = torch.stack(images)  # [B, 3, S, S]
        if text is not None:
            enc = self.tokenizer(
                text,
                padding=padding,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            out["input_ids"], out["attention_mask"] = enc["input_ids"], enc["attention_mask"]
        return out


class CLIPScore(ClipReward):
    """Per-image CLIPScore computed by torchmetrics; see the module docstring."""

    name = "clip_score"

    def __init__(self, model, tokenizer, max_batch: BatchSize | None = None) -> None:
        super().__init__(model, tokenizer, max_batch=max_batch)
        self.adapter = FeatureAdapter(model)
        max_length = int(model.config.text_config.max_position_embeddings)
        self.processor = TensorProcessor(tokenizer, max_length)
        self.freeze()

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path = CLIP_SCORE_MODEL,
        tokenizer: str | Path | None = None,
        dtype: torch.dtype = torch.float32,
        max_batch: BatchSize | None = None,
    ) -> CLIPScore:
        """A CLIP folder or hub id (default torchmetrics' ViT-L/14); tokenizer from ``model`` unless given."""
        return cls(
            load_clip(model, "CLIPScore model", dtype),
            load_tokenizer(model if tokenizer is None else tokenizer, "CLIPScore tokenizer"),
            max_batch=max_batch,
        )

    @classmethod
    def tiny(cls, folder: str | Path, seed: int = 0, max_batch: BatchSize | None = None) -> CLIPScore:
        """A random 2-layer CLIP with the offline tokenizer, through :meth:`from_pretrained`."""
        path = write_tiny_clip(folder, seed=seed)
        return cls.from_pretrained(path, max_batch=max_batch)

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        from torchmetrics.functional.multimodal.clip_score import _clip_score_update

        pixels = clip_pixels(images, self.image_size)  # [B, 3, S, S] on the images' device
        score, _ = _clip_score_update(pixels, list(prompts), self.adapter, self.processor)  # [B]
        return score.clamp(min=0.0)  # CLIPScore = max(100 cos, 0)
