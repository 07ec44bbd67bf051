"""Tiny random rewards, built once per session through their real ``from_pretrained`` paths."""

from __future__ import annotations

import pytest
import torch

from lit_treegrpo.rewards import (
    Aesthetic,
    CLIPScore,
    HPSv2,
    JpegCompressibility,
    JpegIncompressibility,
    PickScore,
)

# CLIPScore clamps at 0: seed 2 gives a tiny random CLIP whose image/text cosines are positive for
# the test inputs, so that the clamp does not hide differences (test_clip_score_is_positive_here
# fails loudly if that ever stops holding).
CLIP_SCORE_SEED = 2

PROMPTS = ["a photo of a cat", "a red dog on the grass", "a photo of a cat", "sunset over the sea"]


@pytest.fixture(scope="session")
def tiny_rewards(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("rewards")
    return {
        "pickscore": PickScore.tiny(root / "pickscore", seed=0),
        "clip_score": CLIPScore.tiny(root / "clip_score", seed=CLIP_SCORE_SEED),
        "hps": HPSv2.tiny(root / "hps", seed=0),
        "aesthetic": Aesthetic.tiny(root / "aesthetic", seed=0),
        "jpeg_compressibility": JpegCompressibility(),
        "jpeg_incompressibility": JpegIncompressibility(),
    }


@pytest.fixture
def images() -> torch.Tensor:
    """Four distinct non-square images in [0, 1]: noise, a smooth ramp, two noise levels."""
    g = torch.Generator().manual_seed(0)
    noise = torch.rand(2, 3, 48, 40, generator=g)  # [2, 3, 48, 40]
    ramp = torch.linspace(0, 1, 40).expand(1, 3, 48, 40)  # [1, 3, 48, 40]
    soft = 0.5 + 0.1 * torch.randn(1, 3, 48, 40, generator=g)
    return torch.cat([noise, ramp, soft.clamp(0, 1)])  # [4, 3, 48, 40]
