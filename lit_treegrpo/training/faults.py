"""The fault policy: its option (:class:`FaultPolicy`), its state and decisions (:class:`FaultLedger`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from ..common.errors import first_line
from ..core.choices import check_choice
from ..core.samples import Scored, Screened
from ..rewards.scores import RewardOutputError

NonFinite = Literal["error", "skip"]


@dataclass(frozen=True)
class FaultPolicy:
    """What a training step does with NaN / inf rewards, a failing reward call, or a non-finite
    loss or gradient. Counters are logged as ``faults/*`` and kept in checkpoints."""

    nonfinite: NonFinite = "error"
    """``error`` stops at the first fault, naming it; ``skip`` drops the prompts whose leaves got NaN / inf
    rewards from the step, skips the step when the reward call raises and the optimizer step when a
    loss or gradient is not finite, and stops after 3 steps in a row without an update."""

    def __post_init__(self) -> None:
        check_choice("faults.nonfinite", self.nonfinite, NonFinite)


#: with ``skip``: training steps in a row without an update that stop the run
MAX_CONSECUTIVE_SKIPS = 3
#: the ledger's counters, in the order they are logged and saved
FAULT_COUNTERS = ("skipped_groups", "skipped_steps", "skipped_updates", "consecutive", "zero_std_groups")
_SHOW = 8  # prompts a message names

ScoreFn = Callable[[Tensor, list[str]], tuple[Tensor, dict[str, Tensor]]]
SumOverRanks = Callable[[list[int | bool]], list[int]]


class FaultWarning(RuntimeWarning):
    """A fault that the ``skip`` policy skipped (the message says what and where)."""


class FaultLimitError(RuntimeError):
    """Too many consecutive training steps were skipped because of faults."""


class StepPlan(NamedTuple):
    """Whether a step trains, decided alike on every rank from the faults of all ranks."""

    train: bool  # run the policy-gradient update
    kept: bool  # pruning kept an edge on some rank
    faulty: bool  # a fault touched this step on some rank
    cause: str | None  # this rank's fault, if any (for the messages)


def constant_groups(rewards: Tensor, leaf_prompt: Tensor, num_prompts: int) -> Tensor:
    """[P] bool: prompts whose leaves all got the same reward (their advantages are exactly 0)."""
    hi = rewards.new_full((num_prompts,), float("-inf")).scatter_reduce(0, leaf_prompt, rewards, reduce="amax")
    lo = rewards.new_full((num_prompts,), float("inf")).scatter_reduce(0, leaf_prompt, rewards, reduce="amin")
    return hi == lo


class FaultLedger:
    """The fault counters of a run and the policy's decisions, one method per point of a step:
    :meth:`score` -> :meth:`screen` -> :meth:`tally` -> (:meth:`refuse_update`) -> :meth:`end_step`.

    Args:
        policy: what to do with a fault (``error`` / ``skip``) and when to stop skipping.
    """

    def __init__(self, policy: FaultPolicy) -> None:
        self.policy = policy
        self.counts: dict[str, int] = dict.fromkeys(FAULT_COUNTERS, 0)

    @property
    def skip(self) -> bool:
        return self.policy.nonfinite == "skip"

    # ------------------------------------------------------------------------ rewards
    def score(self, score: ScoreFn, images: Tensor, prompts: list[str], iteration: int) -> Scored:
        """``score(images, prompts)``; under ``skip`` a call that raises gives NaN rewards and the
        exception's one-line message as :attr:`Scored.failure`, with a :class:`FaultWarning`."""
        if not self.skip:
            return Scored(*score(images, prompts), None)
        try:
            return Scored(*score(images, prompts), None)
        except RewardOutputError:
            raise  # the reward's own bug, the same at every step: never skipped
        except Exception as err:  # a reward model may fail in any way (a remote API, a CUDA error)
            cause = f"the reward raised {type(err).__name__}: {first_line(err)}"
            warnings.warn(
                f"iteration {iteration}: {cause}; skipping this training step (faults.nonfinite=skip)",
                FaultWarning,
                stacklevel=2,
            )
            return Scored(torch.full((len(prompts),), float("nan"), device=images.device), {}, cause)

    def screen(self, rewards: Tensor, leaf_prompt: Tensor, num_prompts: int) -> Screened:
        """Under ``skip``, drop the prompts with a NaN / inf leaf reward: normalisation is per prompt, so finite
        stand-ins (0) for their rewards leave every other prompt's advantages as they are."""
        dropped = torch.zeros(num_prompts, dtype=torch.bool, device=rewards.device)  # [P]
        if not self.skip:
            return Screened(rewards, dropped)
        dropped[leaf_prompt[~torch.isfinite(rewards)]] = True
        return Screened(torch.where(dropped[leaf_prompt], torch.zeros_like(rewards), rewards), dropped)  # [L]

    def tally(
        self,
        scored: Scored,
        screened: Screened,
        keep: Tensor,
        prompts: Sequence[str],
        leaf_prompt: Tensor,
        *,
        iteration: int,
        sum_over_ranks: SumOverRanks,
    ) -> StepPlan:
        """Count the step's dropped prompts and constant-reward prompts over all ranks (one collective,
        ``sum_over_ranks``) and decide whether the update runs: not when the reward call failed on some rank, nor
        when dropped prompts left no edge to train on any rank."""
        zero_std = constant_groups(screened.rewards, leaf_prompt, len(prompts)) & ~screened.dropped  # [P]
        dropped = 0 if scored.failure is not None else int(screened.dropped.sum())
        names: list[str] = []
        if dropped:
            names = sorted({prompts[i] for i in screened.dropped.nonzero().flatten().tolist()})
            warnings.warn(
                f"iteration {iteration}: non-finite rewards for {dropped} of {len(prompts)} prompts "
                f"{names[:_SHOW]}; these prompts are left out of this step (faults.nonfinite=skip)",
                FaultWarning,
                stacklevel=2,
            )
        failed, kept, dropped_all, zero_std_all = sum_over_ranks(
            [scored.failure is not None, bool(keep.any()), dropped, int(zero_std.sum())]
        )
        self.counts["skipped_groups"] += dropped_all
        self.counts["zero_std_groups"] += zero_std_all
        cause = scored.failure or (f"non-finite rewards for prompts {names[:_SHOW]}" if dropped else None)
        train = not (failed or (not kept and dropped_all))
        return StepPlan(train=train, kept=bool(kept), faulty=bool(failed or dropped_all), cause=cause)

    # ------------------------------------------------------------------------ updates
    def refuse_update(self, problem: str | None, iteration: int) -> str:
        """An optimizer step refused because a loss or gradient is not finite (``problem``: this
        rank's, None when only another rank's was): raise ``FloatingPointError`` under ``error``;
        under ``skip`` count it, warn, and return the cause."""
        problem = problem or f"a non-finite loss or gradient on another rank at iteration {iteration}"
        if not self.skip:
            raise FloatingPointError(
                f"{problem}; no optimizer step was taken (set --model.faults.nonfinite skip to skip such steps)"
            )
        self.counts["skipped_updates"] += 1
        warnings.warn(f"{problem}; optimizer step skipped (faults.nonfinite=skip)", FaultWarning, stacklevel=2)
        return problem

    def end_step(self, plan: StepPlan, updates: int, update_fault: str | None, iteration: int) -> None:
        """Count a step that made no update (``updates`` optimizer steps taken) because of a fault (the plan's, or
        ``update_fault``: the last refused optimizer step's); raise :class:`FaultLimitError` when
        ``max_consecutive_skips`` of them come in a row."""
        if updates > 0:
            self.counts["consecutive"] = 0
            return
        if not (plan.faulty or update_fault is not None):  # nothing trained without a fault (pruning)
            return
        self.counts["skipped_steps"] += 1
        self.counts["consecutive"] += 1
        if self.counts["consecutive"] >= MAX_CONSECUTIVE_SKIPS:
            cause = update_fault or plan.cause or "a fault on another data-parallel rank"
            raise FaultLimitError(
                f"{self.counts['consecutive']} training steps in a row were skipped "
                f"(at most {MAX_CONSECUTIVE_SKIPS}), up to iteration "
                f"{iteration}; last cause: {cause}; fix the reward or lower the learning rate, "
                "or resume from the last checkpoint with --ckpt_path last"
            )

    # ------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, int]:
        """The counters, as a checkpoint holds them (``checkpoint["lit_treegrpo"]["faults"]``)."""
        return dict(self.counts)

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore the counters; a checkpoint from before the counters existed starts them at 0."""
        self.counts = {**dict.fromkeys(FAULT_COUNTERS, 0), **state}
