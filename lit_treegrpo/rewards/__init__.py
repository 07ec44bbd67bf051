"""Reward models behind one base class, :class:`RewardModel`, and a registry of names for configs.

``build_reward("pickscore")`` loads PickScore_v1 from the hub cache; keyword arguments go to the
reward's loader (``build_reward("hps", checkpoint="v2.0")``,
``build_reward("aesthetic", head="path/to/sac+logos+ava1-l14-linearMSE.pth")``).
:func:`build_rewards` builds what a config's ``model.reward`` says (a name, a name -> weight
mapping, or a ready model); :func:`check_reward_names` checks it without loading anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lit_treegrpo.rewards.aesthetic import Aesthetic
from lit_treegrpo.rewards.base import (
    ZERO_WEIGHTS,
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
from lit_treegrpo.rewards.video import (
    FrameAverage,
    TemporalConsistency,
    VideoModelReward,
    VideoMultiReward,
    VideoRewardModel,
    is_video_reward,
)

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
    # video rewards (videos [B, F, 3, H, W]; lit_treegrpo.rewards.video)
    "frame_average": FrameAverage,
    "temporal_consistency": TemporalConsistency,
    "video_model": VideoModelReward,
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


def check_reward_names(reward: Any, kwargs: dict[str, dict[str, Any]]) -> list[str]:
    """The registered reward names that ``reward`` (a name, or a name -> weight mapping) refers to,
    checked without loading anything: known names, ``reward_kwargs`` naming only those, and every
    extra package they need installed. A ready RewardModel (or a class spec) gives ``[]``."""
    if isinstance(reward, str):
        names = [reward]
    elif isinstance(reward, dict):
        if not reward:
            raise ValueError("reward: the name -> weight mapping is empty; name at least one reward")
        if all(isinstance(w, (int, float)) and w == 0 for w in reward.values()):
            raise ValueError(f"reward {reward}: {ZERO_WEIGHTS}")
        names = list(reward)
    else:
        return []
    unknown = set(kwargs) - set(names)
    if unknown:
        raise ValueError(f"reward_kwargs names {sorted(unknown)}, which are not among the rewards {names}")
    for name in names:
        check_reward_available(name)
    return names


def build_rewards(
    reward: RewardModel | str | dict[str, float], kwargs: dict[str, dict[str, Any]], *, video: bool = False
) -> RewardModel:
    """A RewardModel from a name (``kwargs[name]`` its loader's arguments), a name -> weight
    mapping (a :class:`MultiReward`, or a :class:`VideoMultiReward` of video rewards), or a ready
    model (validated before anything loads). ``video``: the policy makes videos, so the reward must
    score videos (and an image-making policy, images)."""
    names = check_reward_names(reward, kwargs)
    if isinstance(reward, str):
        built = build_reward(reward, **kwargs.get(reward, {}))
    elif isinstance(reward, dict):
        models = {name: build_reward(name, **kwargs.get(name, {})) for name in names}
        kinds = {is_video_reward(m) for m in models.values()}
        if len(kinds) > 1:
            raise ValueError(f"reward {reward} mixes image and video rewards; wrap the image rewards in frame_average")
        built = (VideoMultiReward if kinds == {True} else MultiReward)(models, weights=dict(reward))
    elif not isinstance(reward, RewardModel):
        raise TypeError(f"reward must be a name, a name -> weight mapping or a RewardModel, got {type(reward).__name__}")
    elif kwargs:
        raise ValueError("reward_kwargs applies to rewards given by name; this reward is already built")
    else:
        built = reward
    check_reward_kind(built, video)
    return built


def check_reward_kind(reward: RewardModel, video: bool) -> None:
    """Refuse an image reward for a video policy and a video reward for an image policy."""
    if video and not is_video_reward(reward):
        raise ValueError(
            f"the adapter makes videos but reward {reward.name!r} scores images; use a video reward "
            f"(frame_average with reward_kwargs.frame_average.image: {reward.name}, temporal_consistency, video_model)"
        )
    if not video and is_video_reward(reward):
        raise ValueError(f"reward {reward.name!r} scores videos but the adapter makes images; use an image reward")


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
