"""Video rewards: :class:`VideoRewardModel` scores ``videos [B, F, 3, H, W]`` in [0, 1] against prompts."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_treegrpo.common.values import Range
from lit_treegrpo.core.choices import check_choice
from lit_treegrpo.rewards.base import BatchSize, MultiReward, RewardLoadError, RewardModel, check_inputs
from lit_treegrpo.rewards.registry import build_reward

VideoScorer = Callable[[Tensor, list[str]], Tensor]  # (videos [B, F, 3, H, W], prompts) -> [B]


def check_video_inputs(videos: Tensor, prompts: Sequence[str], name: str) -> None:
    """Validate ``videos`` [B, F, 3, H, W] float in [0, 1] and ``prompts`` (B strings)."""
    if not isinstance(videos, Tensor) or videos.ndim != 5 or videos.shape[2] != 3:
        shape = list(videos.shape) if isinstance(videos, Tensor) else type(videos).__name__
        raise ValueError(
            f"reward '{name}' scores videos [B, F, 3, H, W], got {shape}; image rewards score "
            "[B, 3, H, W] (wrap one in frame_average to score videos)"
        )
    if videos.shape[1] == 0:
        raise ValueError(f"reward '{name}': got videos with no frames")
    check_inputs(videos[:, 0], prompts, name)  # type, dtype, batch, prompts: as for images
    videos = videos.detach()
    finite = torch.isfinite(videos).flatten(1).all(dim=1)  # [B]
    if not bool(finite.all()):
        raise ValueError(f"reward '{name}': videos {(~finite).nonzero().squeeze(1).tolist()[:8]} contain NaN or inf")
    lo, hi = float(videos.min()), float(videos.max())
    if lo < 0.0 or hi > 1.0:
        raise ValueError(f"reward '{name}': videos must lie in [0, 1], got values in [{lo:.4g}, {hi:.4g}]")


class VideoRewardModel(RewardModel):
    """A frozen scorer of videos against prompts: ``forward(videos [B, F, 3, H, W] in [0, 1], prompts) -> [B]``
    float32."""

    name = "video"

    def check(self, images: Tensor, prompts: Sequence[str]) -> None:
        check_video_inputs(images, prompts, self.name)

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement score_batch (videos [B, F, 3, H, W])")


def frame_indices(num_frames: int, frames: int | None) -> list[int]:
    """``frames`` evenly spaced frame indices out of ``num_frames``, first and last included (all
    frames when ``frames`` is ``None`` or not smaller)."""
    if frames is None or frames >= num_frames:
        return list(range(num_frames))
    if frames == 1:
        return [num_frames // 2]
    return torch.linspace(0, num_frames - 1, frames).round().long().tolist()


class FrameAverage(VideoRewardModel):
    """An image reward on the frames of each video, averaged: ``mean_f image(frame_f, prompt)``.

    Args:
        image: the image reward, a registered name (``hps``, ``brightness``, ...) or a RewardModel.
        image_kwargs: the loader's arguments when ``image`` is a name.
        frames: score this many evenly spaced frames (first and last included); ``None``: all.
        max_batch: videos per call.
    """

    name = "frame_average"
    #: the argument that names the image reward, and the one holding its loader's arguments
    #: (the CLI checks those against that reward's declaration)
    nested_reward = ("image", "image_kwargs")

    def __init__(
        self,
        image: str | RewardModel = "brightness",
        image_kwargs: Mapping[str, Any] | None = None,
        frames: Annotated[int, Range(1)] | None = None,
        max_batch: BatchSize | None = None,
    ) -> None:
        super().__init__(max_batch=max_batch)
        if frames is not None and frames < 1:
            raise ValueError(f"reward 'frame_average': frames must be >= 1 or None, got {frames}")
        if isinstance(image, str):
            image = build_reward(image, **dict(image_kwargs or {}))
        elif image_kwargs:
            raise ValueError("reward 'frame_average': image_kwargs applies to an image reward given by name")
        if not isinstance(image, RewardModel) or is_video_reward(image):
            raise TypeError(f"reward 'frame_average': image must be an image RewardModel, got {type(image).__name__}")
        self.image = image
        self.frames = frames
        self.uses_prompt = image.uses_prompt
        self.freeze()

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        index = frame_indices(images.shape[1], self.frames)
        chosen = images[:, index]  # [B, F', 3, H, W]
        flat_prompts = [p for p in prompts for _ in index]  # frame-major within each video
        scores = self.image.raw_scores(chosen.flatten(0, 1), flat_prompts)  # [B * F']
        return scores.view(len(prompts), len(index)).mean(dim=1)  # [B]

    def extra_repr(self) -> str:
        return f"frames={self.frames}, " + super().extra_repr()


TemporalMetric = Literal["l2", "cosine"]


class TemporalConsistency(VideoRewardModel):
    """How alike consecutive frames are, averaged over the ``F - 1`` pairs (prompt-free)."""

    name = "temporal_consistency"
    uses_prompt = False

    def __init__(
        self, metric: TemporalMetric = "l2", max_side: Annotated[int, Range(1)] = 64, max_batch: BatchSize | None = None
    ) -> None:
        super().__init__(max_batch=max_batch)
        check_choice("reward 'temporal_consistency': metric", metric, TemporalMetric)
        if max_side < 1:
            raise ValueError(f"reward 'temporal_consistency': max_side must be >= 1, got {max_side}")
        self.metric = metric
        self.max_side = max_side
        self.freeze()

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        B, frames, C, H, W = images.shape
        if frames < 2:
            raise ValueError(f"reward 'temporal_consistency' needs videos of 2 or more frames, got {frames}")
        x = images.float().flatten(0, 1)  # [B * F, 3, H, W]
        side = max(H, W)
        if side > self.max_side:
            x = F.adaptive_avg_pool2d(x, (max(1, self.max_side * H // side), max(1, self.max_side * W // side)))
        x = x.reshape(B, frames, -1)  # [B, F, D]
        a, b = x[:, :-1], x[:, 1:]  # [B, F - 1, D] consecutive pairs
        if self.metric == "l2":
            per_pair = 1.0 - (b - a).pow(2).mean(dim=2).sqrt()  # [B, F - 1]
        else:
            a, b = a - a.mean(dim=2, keepdim=True), b - b.mean(dim=2, keepdim=True)
            norms = a.norm(dim=2) * b.norm(dim=2)  # [B, F - 1]
            cos = (a * b).sum(dim=2) / norms.clamp_min(1e-12)
            flat = (a.norm(dim=2) < 1e-6) & (b.norm(dim=2) < 1e-6)  # two constant frames: alike
            per_pair = torch.where(flat, torch.ones_like(cos), cos)
        return per_pair.mean(dim=1)  # [B]

    def extra_repr(self) -> str:
        return f"metric={self.metric!r}, max_side={self.max_side}, " + super().extra_repr()


def _import(path: str) -> Any:
    """``"package.module:name"`` -> the object (one-line error naming the path otherwise)."""
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"reward 'video_model': scorer {path!r} must be 'package.module:name'")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise RewardLoadError(f"cannot load reward 'video_model' scorer {path!r}: {err}") from err
    return obj


class VideoModelReward(VideoRewardModel):
    """Hook for a learned video reward model (Video-Align / VideoAlign, VideoScore, ...).

    Args:
        scorer: the callable, or ``"package.module:name"``.
        init_args: keyword arguments that build the scorer from an imported class / factory.
        uses_prompt: whether the scores depend on the prompt (documentation and logs).
        max_batch: videos per call.
    """

    name = "video_model"

    def __init__(
        self,
        scorer: str | VideoScorer,
        init_args: Mapping[str, Any] | None = None,
        uses_prompt: bool = True,
        max_batch: BatchSize | None = None,
    ) -> None:
        super().__init__(max_batch=max_batch)
        if isinstance(scorer, str):
            obj = _import(scorer)
            scorer = obj(**dict(init_args)) if init_args is not None else obj
        elif init_args is not None:
            raise ValueError("reward 'video_model': init_args applies to a scorer given as an import path")
        if not callable(scorer):
            raise TypeError(f"reward 'video_model': scorer must be callable, got {type(scorer).__name__}")
        self.scorer = scorer  # a module scorer registers as a submodule and is frozen below
        self.uses_prompt = uses_prompt
        self.freeze()

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        return torch.as_tensor(self.scorer(images, list(prompts)), device=images.device).float().reshape(-1)


class VideoMultiReward(MultiReward):
    """:class:`~lit_treegrpo.rewards.base.MultiReward` over video rewards: every component is
    normalised within each prompt's group of videos, then weighted (``normalize_then_weight``), or
    the raw scores weighted (``weighted_sum``)."""

    name = "video_multi"

    def __init__(self, rewards: Mapping[str, RewardModel], **kwargs: Any) -> None:
        images = [k for k, r in rewards.items() if not is_video_reward(r)]
        if images:
            raise TypeError(f"VideoMultiReward: {images} score images, not videos; wrap them in frame_average")
        super().__init__(rewards, **kwargs)

    def check(self, images: Tensor, prompts: Sequence[str]) -> None:
        check_video_inputs(images, prompts, self.name)


def is_video_reward(reward: RewardModel) -> bool:
    """Whether ``reward`` scores videos [B, F, 3, H, W] (rather than images [B, 3, H, W])."""
    return isinstance(reward, (VideoRewardModel, VideoMultiReward))
