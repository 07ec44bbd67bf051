"""What a reward returns, checked (rule 3 of docs/failure_modes.md): :class:`RewardScores`, one real
float score per image (:func:`check_scores`, :class:`RewardOutputError` at the first call that
returns anything else), finite or a :class:`NonFiniteRewardError` naming the prompts
(:func:`check_finite`, which the fault policy may turn into a skip)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

_SHOW = 8  # how many offending indices / prompts an error message lists
#: ``RewardModel.name`` of a reward that names itself nothing
DEFAULT_NAME = "reward"


class NonFiniteRewardError(ValueError):
    """A reward produced NaN or infinite scores."""


class RewardOutputError(ValueError):
    """A reward returned something other than one real float score per image (a bug of the reward,
    reported in one line at its first call, under every fault policy)."""


class RewardScores(NamedTuple):
    """What :meth:`RewardModel.score` returns: the score and, for a MultiReward, every component
    (for logging)."""

    total: Tensor  # [B] float32
    components: dict[str, Tensor]  # name -> [B] float32 raw (un-normalised) scores


def check_finite(scores: Tensor, name: str, prompts: Sequence[str]) -> None:
    """Raise :class:`NonFiniteRewardError` naming ``name``, the indices and their prompts."""
    bad = ~torch.isfinite(scores)  # [B]
    if bool(bad.any()):
        idx = bad.nonzero().squeeze(1).tolist()
        shown = [prompts[i] for i in idx[:_SHOW]]
        raise NonFiniteRewardError(
            f"reward '{name}' gave non-finite scores for {len(idx)} of {scores.numel()} images "
            f"(indices {idx[:_SHOW]}, prompts {shown})"
        )


def check_scores(scores: object, count: int, name: str) -> Tensor:
    """``scores`` as float32 [count], if they are a real floating-point tensor of ``count`` scores ([count], or [count,
    1] as a linear head gives them); :class:`RewardOutputError` otherwise."""
    fix = f"make the reward return a float tensor of shape [{count}], one score per image"
    if not isinstance(scores, Tensor):
        raise RewardOutputError(f"reward '{name}' returned a {type(scores).__name__}, not a torch.Tensor; {fix}")
    if scores.is_complex():
        raise RewardOutputError(
            f"reward '{name}' returned complex scores ({scores.dtype}), and a reward is a real number; {fix} "
            "(e.g. its .real or .abs())"
        )
    if not scores.is_floating_point():
        raise RewardOutputError(f"reward '{name}' returned {scores.dtype} scores; {fix} (e.g. scores.float())")
    if tuple(scores.shape) not in ((count,), (count, 1)):
        raise RewardOutputError(
            f"reward '{name}' returned scores of shape {list(scores.shape)} for {count} images; {fix}"
        )
    scores = scores.reshape(count)
    narrowed = scores.float()
    if scores.dtype != torch.float32:
        _check_float32_resolves(scores, narrowed, name)
    return narrowed


#: float32 must tell a batch's scores apart to this fraction of their spread
_RESOLUTION = 1e-3


def _check_float32_resolves(scores: Tensor, narrowed: Tensor, name: str) -> None:
    """Refuse wider scores (float64) that float32, which the advantages and logs use, cannot tell apart: scores near
    1e9 lie 64 apart in float32, so a batch whose spread is a few hundred collapses to a few values and trains on
    nothing, silently."""
    finite = scores[torch.isfinite(scores)].double()  # [N] (a non-finite score is check_finite's to name)
    if finite.numel() < 2:
        return
    spread, largest = float(finite.max() - finite.min()), float(finite.abs().max())
    spacing = float(torch.finfo(torch.float32).eps) * largest
    # differences below 1e-9 of the scores' size are float64 rounding of equal scores, not a signal to keep
    if spread > 1e-9 * largest and spacing > _RESOLUTION * spread:
        distinct, kept = torch.unique(finite).numel(), torch.unique(narrowed[torch.isfinite(scores)]).numel()
        raise RewardOutputError(
            f"reward '{name}' returned {scores.dtype} scores around {float(finite.abs().max()):.3g} whose spread "
            f"{spread:.3g} float32 resolves only to {spacing:.3g} ({distinct} distinct values become {kept}); "
            "return scores on a scale float32 keeps apart, e.g. minus a fixed offset or divided by a fixed scale"
        )


def check_reward_scores(scores: object, count: int, name: str) -> RewardScores:
    """What a reward's ``score`` returned, checked: a :class:`RewardScores` whose total and every
    component pass :func:`check_scores`."""
    if not isinstance(scores, RewardScores):
        raise RewardOutputError(
            f"reward '{name}': score() returned a {type(scores).__name__}, not RewardScores(total, components); "
            "return RewardScores(scores, {}) or implement score_batch only"
        )
    total = check_scores(scores.total, count, name)
    return RewardScores(total, {k: check_scores(v, count, f"{name}/{k}") for k, v in scores.components.items()})


def label(reward: Any) -> str:
    """A reward's name in a message: its ``name``, or its class's when it kept the default."""
    return reward.name if reward.name != DEFAULT_NAME else type(reward).__name__


def checking_output(score: Callable[..., object]) -> Callable[..., RewardScores]:
    """``score`` (a RewardModel's method) with its output checked by :func:`check_reward_scores`."""

    @functools.wraps(score)
    def checked(self: Any, images: Tensor, prompts: Sequence[str], *args: object, **kwargs: object):
        return check_reward_scores(score(self, images, prompts, *args, **kwargs), len(prompts), label(self))

    checked.checks_output = True  # type: ignore[attr-defined]
    return checked
