"""The reward registry: the names a config's ``model.reward`` may give, as a lazy name -> loader map."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any, Generic, TypeVar

from lit_treegrpo.rewards.base import ZERO_WEIGHTS, RewardModel

T = TypeVar("T")


class LazyRegistry(MutableMapping[str, T], Generic[T]):
    """A name -> object map whose entries may be given as import paths (``"package.module:attr.attr"``),
    imported on first look-up and kept."""

    def __init__(self, entries: Mapping[str, T | str]) -> None:
        self._entries: dict[str, T | str] = dict(entries)

    def __getitem__(self, name: str) -> T:
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attributes = entry.partition(":")
            found: Any = importlib.import_module(module)
            for attribute in attributes.split("."):
                found = getattr(found, attribute)
            self._entries[name] = entry = found
        return entry

    def __setitem__(self, name: str, value: T | str) -> None:
        self._entries[name] = value

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({sorted(self._entries)})"


#: name -> loader; what a config's ``reward:`` may say
REWARDS: LazyRegistry[Callable[..., RewardModel]] = LazyRegistry(
    {
        "hps": "lit_treegrpo.rewards.hps:HPSv2.from_pretrained",
        "image_reward": "lit_treegrpo.rewards.image_reward:ImageReward.from_pretrained",
        "pickscore": "lit_treegrpo.rewards.pickscore:PickScore.from_pretrained",
        "clip_score": "lit_treegrpo.rewards.clip_score:CLIPScore.from_pretrained",
        "aesthetic": "lit_treegrpo.rewards.aesthetic:Aesthetic.from_pretrained",
        "jpeg_compressibility": "lit_treegrpo.rewards.jpeg:JpegCompressibility",
        "jpeg_incompressibility": "lit_treegrpo.rewards.jpeg:JpegIncompressibility",
        "brightness": "lit_treegrpo.rewards.pixel:Brightness",
        "shapes": "lit_treegrpo.shapes.reward:ShapesReward",
        # video rewards (videos [B, F, 3, H, W]; lit_treegrpo.rewards.video)
        "frame_average": "lit_treegrpo.rewards.video:FrameAverage",
        "temporal_consistency": "lit_treegrpo.rewards.video:TemporalConsistency",
        "video_model": "lit_treegrpo.rewards.video:VideoModelReward",
    }
)


#: name -> a check that raises an ``ImportError`` naming the extra to install when the reward's
#: package is missing; run before any model loads (``check_reward_available``)
REQUIREMENTS: LazyRegistry[Callable[[], object]] = LazyRegistry(
    {
        "image_reward": "lit_treegrpo.rewards.image_reward:import_image_reward",
    }
)


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
    """The registered reward names that ``reward`` (a name, or a name -> weight mapping) refers to, checked without
    loading anything: known names, ``reward_kwargs`` naming only those, and every extra package they need installed."""
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
