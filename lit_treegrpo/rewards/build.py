"""From a config's ``model.reward`` (a registered name, a name -> weight mapping, or a ready model)
to the :class:`~lit_treegrpo.rewards.base.RewardModel` a module scores with: :func:`build_rewards`."""

from __future__ import annotations

from typing import Any

from lit_treegrpo.rewards.base import MultiReward, RewardModel
from lit_treegrpo.rewards.registry import build_reward, check_reward_names
from lit_treegrpo.rewards.video import VideoMultiReward, is_video_reward


def build_rewards(
    reward: RewardModel | str | dict[str, float], kwargs: dict[str, dict[str, Any]], *, video: bool = False
) -> RewardModel:
    """A RewardModel from a name (``kwargs[name]`` its loader's arguments), a name -> weight mapping (a
    :class:`MultiReward`, or a :class:`VideoMultiReward` of video rewards), or a ready model (validated before
    anything loads)."""
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
        raise TypeError(
            f"reward must be a name, a name -> weight mapping or a RewardModel, got {type(reward).__name__}"
        )
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
