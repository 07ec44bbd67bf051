"""Reward models behind one base class, :class:`RewardModel`, and a registry of names for configs.

May import: torch, :mod:`lit_treegrpo.core`, :mod:`lit_treegrpo.common`, the tiny models' tokenizer, and
transformers / huggingface_hub inside the loaders; never the Lightning layer.
"""

from __future__ import annotations

from typing import Any

from lit_treegrpo.rewards.aesthetic import Aesthetic
from lit_treegrpo.rewards.base import MultiReward, RewardLoadError, RewardModel
from lit_treegrpo.rewards.build import build_rewards, check_reward_kind
from lit_treegrpo.rewards.clip_score import CLIPScore
from lit_treegrpo.rewards.hps import HPSv2
from lit_treegrpo.rewards.image_reward import ImageReward
from lit_treegrpo.rewards.jpeg import JpegCompressibility, JpegIncompressibility
from lit_treegrpo.rewards.pickscore import PickScore
from lit_treegrpo.rewards.pixel import Brightness
from lit_treegrpo.rewards.registry import (
    REQUIREMENTS,
    REWARDS,
    build_reward,
    check_reward_available,
    check_reward_names,
)
from lit_treegrpo.rewards.scores import NonFiniteRewardError, RewardOutputError, RewardScores
from lit_treegrpo.rewards.video import (
    FrameAverage,
    TemporalConsistency,
    VideoModelReward,
    VideoMultiReward,
    VideoRewardModel,
    is_video_reward,
)


def __getattr__(name: str) -> Any:
    """``ShapesReward`` and ``ShapesAnalysis`` live with the Shapes testbed (:mod:`lit_treegrpo.shapes`);
    resolved by name, so that this folder never imports the folder that imports it."""
    if name in ("ShapesReward", "ShapesAnalysis"):
        import importlib

        return getattr(importlib.import_module("lit_treegrpo.shapes.reward"), name)
    raise AttributeError(f"module 'lit_treegrpo.rewards' has no attribute {name!r}")


__all__ = [
    "REQUIREMENTS",
    "REWARDS",
    "Aesthetic",
    "Brightness",
    "CLIPScore",
    "FrameAverage",
    "HPSv2",
    "ImageReward",
    "JpegCompressibility",
    "JpegIncompressibility",
    "MultiReward",
    "NonFiniteRewardError",
    "PickScore",
    "RewardLoadError",
    "RewardModel",
    "RewardOutputError",
    "RewardScores",
    "ShapesAnalysis",
    "ShapesReward",
    "TemporalConsistency",
    "VideoModelReward",
    "VideoMultiReward",
    "VideoRewardModel",
    "build_reward",
    "build_rewards",
    "check_reward_available",
    "check_reward_kind",
    "is_video_reward",
    "check_reward_names",
]
