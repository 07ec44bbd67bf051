"""Reward models behind one base class, :class:`RewardModel`, and a registry of names for configs.

- :mod:`.base`: :class:`RewardModel` (input checks, batching, NaN refusal), :class:`MultiReward`,
  the loaders' helpers (``load_or_explain``, ``load_tokenizer``).
- :mod:`.registry`: ``REWARDS``, the lazy name -> loader map a config's ``model.reward`` names, and
  ``REQUIREMENTS``; ``build_reward("pickscore")`` loads PickScore_v1 from the hub cache, keyword
  arguments going to the reward's loader (``build_reward("hps", checkpoint="v2.0")``);
  :func:`check_reward_names` checks a config's names without loading anything.
- :mod:`.build`: :func:`build_rewards`, what a config's ``model.reward`` says (a name, a name ->
  weight mapping, or a ready model) built and checked against the policy (images or videos).
- one module per reward family: :mod:`.hps`, :mod:`.image_reward`, :mod:`.pickscore`,
  :mod:`.clip_score`, :mod:`.aesthetic` (over :mod:`.clip_common`), :mod:`.jpeg`, :mod:`.pixel`,
  :mod:`.shapes`, :mod:`.video`.

May import: torch, :mod:`lit_treegrpo.core`, :mod:`lit_treegrpo.common`, the Shapes world, and
transformers / huggingface_hub inside the loaders; never the Lightning layer.
"""

from __future__ import annotations

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
from lit_treegrpo.rewards.shapes import ShapesAnalysis, ShapesReward
from lit_treegrpo.rewards.video import (
    FrameAverage,
    TemporalConsistency,
    VideoModelReward,
    VideoMultiReward,
    VideoRewardModel,
    is_video_reward,
)

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
