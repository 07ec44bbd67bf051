"""Reward models behind one base class, :class:`RewardModel`, and a registry of names for configs.

``build_reward("pickscore")`` loads PickScore_v1 from the hub cache; keyword arguments go to the
reward's loader (``build_reward("hps", checkpoint="v2.0")``,
``build_reward("aesthetic", head="path/to/sac+logos+ava1-l14-linearMSE.pth")``).
"""

from __future__ import annotations

from collections.abc import Callable

from lit_treegrpo.rewards.aesthetic import Aesthetic
from lit_treegrpo.rewards.base import (
    MultiReward,
    NonFiniteRewardError,
    RewardLoadError,
    RewardModel,
    RewardScores,
)
from lit_treegrpo.rewards.clip_score import CLIPScore
from lit_treegrpo.rewards.hps import HPSv2
from lit_treegrpo.rewards.image_reward import ImageReward
from lit_treegrpo.rewards.jpeg import JpegCompressibility, JpegIncompressibility
from lit_treegrpo.rewards.pickscore import PickScore
from lit_treegrpo.rewards.pixel import Brightness
from lit_treegrpo.rewards.shapes import ShapesAnalysis, ShapesReward

#: name -> loader; what a config's ``reward:`` may say
REWARDS: dict[str, Callable[..., RewardModel]] = {
    "hps": HPSv2.from_pretrained,
    "image_reward": ImageReward.from_pretrained,
    "pickscore": PickScore.from_pretrained,
    "clip_score": CLIPScore.from_pretrained,
    "aesthetic": Aesthetic.from_pretrained,
    "jpeg_compressibility": JpegCompressibility,
    "jpeg_incompressibility": JpegIncompressibility,
    "brightness": Brightness,
    "shapes": ShapesReward,
}


def build_reward(name: str, **kwargs) -> RewardModel:
    """The reward registered as ``name``, built with ``kwargs``."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; known rewards: {', '.join(sorted(REWARDS))}")
    return REWARDS[name](**kwargs)


__all__ = [
    "REWARDS",
    "Aesthetic",
    "Brightness",
    "CLIPScore",
    "HPSv2",
    "ImageReward",
    "JpegCompressibility",
    "JpegIncompressibility",
    "MultiReward",
    "NonFiniteRewardError",
    "PickScore",
    "RewardLoadError",
    "RewardModel",
    "RewardScores",
    "ShapesAnalysis",
    "ShapesReward",
    "build_reward",
]
