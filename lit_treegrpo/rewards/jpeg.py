"""JPEG compressibility / incompressibility (Black et al., "Training Diffusion Models with
Reinforcement Learning" (DDPO), ICLR 2024, ``ddpo_pytorch/rewards.py``)."""

from __future__ import annotations

import io
from typing import Annotated

import numpy as np
import torch
from torch import Tensor

from lit_treegrpo.common.values import Range
from lit_treegrpo.rewards.base import BatchSize, RewardModel


def jpeg_kilobytes(images: Tensor, quality: int = 95) -> Tensor:
    """JPEG sizes [B] float32 in kB of ``images`` [B, 3, H, W] in [0, 1]."""
    from PIL import Image

    pixels = (images.detach() * 255).round().clamp(0, 255).to(torch.uint8)  # [B, 3, H, W]
    pixels = pixels.permute(0, 2, 3, 1).cpu().numpy()  # [B, H, W, 3]
    sizes = []
    for image in pixels:
        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(image)).save(buf, format="JPEG", quality=quality)
        sizes.append(buf.tell() / 1000.0)
    return torch.tensor(sizes, dtype=torch.float32, device=images.device)  # [B]


class JpegIncompressibility(RewardModel):
    """+ JPEG size in kB (DDPO's ``jpeg_incompressibility``); ignores the prompt."""

    name = "jpeg_incompressibility"
    uses_prompt = False
    sign = 1.0

    def __init__(self, quality: Annotated[int, Range(1, 100)] = 95, max_batch: BatchSize | None = None) -> None:
        super().__init__(max_batch=max_batch)
        if not 1 <= quality <= 100:
            raise ValueError(f"reward '{self.name}': quality must be in [1, 100], got {quality}")
        self.quality = quality
        self.freeze()

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        return self.sign * jpeg_kilobytes(images, self.quality)  # [B]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, quality={self.quality}"


class JpegCompressibility(JpegIncompressibility):
    """- JPEG size in kB (DDPO's ``jpeg_compressibility``): smaller files score higher."""

    name = "jpeg_compressibility"
    sign = -1.0
