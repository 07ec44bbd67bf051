"""Brightness: a verifiable, prompt-free pixel reward for smoke tests and tiny models."""

from __future__ import annotations

from typing import Annotated

from torch import Tensor

from lit_treegrpo.common.values import Range
from lit_treegrpo.rewards.base import BatchSize, RewardModel

_LUMA = (0.299, 0.587, 0.114)  # ITU-R BT.601 luma weights


class Brightness(RewardModel):
    """Mean luma of the image in [0, 1]; with ``target`` set, ``-|luma - target|`` instead.

    Args:
        target: desired mean luma in [0, 1]; ``None`` rewards brighter images.
        max_batch: images per scoring call (``None``: all at once).
    """

    name = "brightness"
    uses_prompt = False

    def __init__(
        self, target: Annotated[float, Range(0.0, 1.0)] | None = None, max_batch: BatchSize | None = None
    ) -> None:
        super().__init__(max_batch=max_batch)
        if target is not None and not 0.0 <= target <= 1.0:
            raise ValueError(f"reward 'brightness': target must be in [0, 1] or None, got {target}")
        self.target = target
        self.freeze()

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        r, g, b = images.float().unbind(dim=1)  # [B, H, W] each
        luma = (_LUMA[0] * r + _LUMA[1] * g + _LUMA[2] * b).mean(dim=(1, 2))  # [B]
        return luma if self.target is None else -(luma - self.target).abs()

    def extra_repr(self) -> str:
        return f"target={self.target}, " + super().extra_repr()
