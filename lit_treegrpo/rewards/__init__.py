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
from lit_treegrpo.rewards.image_reward import ImageReward, import_image_reward
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


#: name -> a check that raises an ``ImportError`` naming the extra to install when the reward's
#: package is missing; run before any model loads (``check_reward_available``)
REQUIREMENTS: dict[str, Callable[[], object]] = {
    "image_reward": import_image_reward,
}


def check_reward_available(name: str) -> None:
    """Raise ``ValueError`` for an unknown name, ``ImportError`` (naming the ``pip install`` that
    fixes it) when the reward needs a package that is not installed. Loads no weights."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; known rewards: {', '.join(sorted(REWARDS))}")
    requirement = REQUIREMENTS.get(name)
    if requirement is not None:
        try:
            requirement()
        except ImportError as err:
            raise ImportError(f"reward {name!r} needs a package that is not installed: {err}") from err


def build_reward(name: str, **kwargs) -> RewardModel:
    """The reward registered as ``name``, built with ``kwargs``."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; known rewards: {', '.join(sorted(REWARDS))}")
    return REWARDS[name](**kwargs)


__all__ = [
    "REQUIREMENTS",
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
    "check_reward_available",
]
