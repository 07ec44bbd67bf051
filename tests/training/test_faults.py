"""FaultLedger on its own: each decision and the counters it leaves, derived by hand (no model, no
Trainer). The module's use of it inside a real fit is tested in test_module.py."""

from __future__ import annotations

import math

import pytest
import torch

from lit_treegrpo.training.faults import (
    FAULT_COUNTERS,
    FaultLedger,
    FaultLimitError,
    FaultPolicy,
    FaultWarning,
    Scored,
    StepPlan,
    constant_groups,
)

NAN = float("nan")
PROMPTS = ["a", "b", "c"]
LEAF_PROMPT = torch.tensor([0, 0, 1, 1, 2, 2])  # two leaves per prompt


def ledger(nonfinite: str = "skip") -> FaultLedger:
    return FaultLedger(FaultPolicy(nonfinite=nonfinite))


def one_rank(values: list[int | bool]) -> list[int]:
    return [int(v) for v in values]


def test_screen_drops_the_prompts_with_a_non_finite_leaf_under_skip_only() -> None:
    rewards = torch.tensor([0.1, 0.2, 0.3, NAN, 0.5, float("inf")])  # [L]
    screened = ledger().screen(rewards, LEAF_PROMPT, 3)
    # leaf 3 (prompt 1) is NaN, leaf 5 (prompt 2) inf: prompts 1 and 2 drop, all their leaves become 0
    assert screened.dropped.tolist() == [False, True, True]
    assert screened.rewards.tolist() == pytest.approx([0.1, 0.2, 0.0, 0.0, 0.0, 0.0])
    assert screened.kept_leaves(LEAF_PROMPT).tolist() == [True, True, False, False, False, False]
    unscreened = ledger("error").screen(rewards, LEAF_PROMPT, 3)
    assert unscreened.rewards is rewards and not unscreened.dropped.any()


def test_constant_groups_are_the_prompts_whose_leaves_all_tie() -> None:
    rewards = torch.tensor([0.5, 0.5, 0.1, 0.2, 0.0, 0.0])
    assert constant_groups(rewards, LEAF_PROMPT, 3).tolist() == [True, False, True]


def test_tally_counts_dropped_and_zero_std_prompts_and_names_the_dropped_ones() -> None:
    book = ledger()
    rewards = torch.tensor([0.3, 0.3, NAN, 0.2, 0.1, 0.4])  # prompt 0 ties, prompt 1 has a NaN
    scored = Scored(rewards, {}, None)
    screened = book.screen(rewards, LEAF_PROMPT, 3)
    keep = torch.tensor([True, False, True])  # [E] this rank's kept edges
    with pytest.warns(
        FaultWarning, match=r"iteration 7: non-finite rewards for 1 of 3 prompts \['b'\]; these prompts are left out"
    ):
        plan = book.tally(scored, screened, keep, PROMPTS, LEAF_PROMPT, iteration=7, sum_over_ranks=one_rank)
    # prompt 1 dropped: skipped_groups 1; its stand-ins (0, 0) tie but a dropped prompt is not
    # counted, so zero_std_groups counts prompt 0 only
    assert book.counts == {
        "skipped_groups": 1,
        "skipped_steps": 0,
        "skipped_updates": 0,
        "consecutive": 0,
        "zero_std_groups": 1,
    }
    assert plan == StepPlan(train=True, kept=True, faulty=True, cause="non-finite rewards for prompts ['b']")


def test_tally_decides_on_the_sums_over_ranks() -> None:
    # this rank is fine; the other rank's reward call failed and it dropped nothing (a failed call
    # drops no groups): [failed, kept, dropped, zero_std] of the other rank = [1, 0, 0, 0]
    book = ledger()
    rewards = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    screened = book.screen(rewards, LEAF_PROMPT, 3)
    two_ranks = lambda values: [int(v) + other for v, other in zip(values, [1, 0, 0, 0])]  # noqa: E731
    plan = book.tally(
        Scored(rewards, {}, None),
        screened,
        torch.ones(4, dtype=torch.bool),
        PROMPTS,
        LEAF_PROMPT,
        iteration=0,
        sum_over_ranks=two_ranks,
    )
    assert plan == StepPlan(train=False, kept=True, faulty=True, cause=None)
    book.end_step(plan, 0, None, 0)
    assert book.counts["skipped_steps"] == 1 and book.counts["consecutive"] == 1
    # dropped prompts that leave no kept edge anywhere also skip the update; a failed call on this
    # rank counts no dropped group even though every leaf is NaN
    nan = torch.full((6,), NAN)
    failed = Scored(nan, {}, "the reward raised RuntimeError: down")
    screened = book.screen(nan, LEAF_PROMPT, 3)
    keep = torch.zeros(4, dtype=torch.bool) & ~screened.dropped[torch.tensor([0, 1, 2, 2])]
    plan = book.tally(failed, screened, keep, PROMPTS, LEAF_PROMPT, iteration=1, sum_over_ranks=one_rank)
    assert plan == StepPlan(train=False, kept=False, faulty=True, cause="the reward raised RuntimeError: down")
    assert book.counts["skipped_groups"] == 0 and book.counts["zero_std_groups"] == 0


def test_score_turns_a_raising_reward_into_nan_under_skip_and_propagates_under_error() -> None:
    def broken(images, prompts):
        raise RuntimeError("service down\nsecond line")

    images = torch.rand(3, 3, 4, 4)
    with pytest.warns(
        FaultWarning, match=r"iteration 2: the reward raised RuntimeError: service down; skipping this training step"
    ):
        scored = ledger().score(broken, images, ["a", "a", "b"], 2)
    assert scored.failure == "the reward raised RuntimeError: service down" and scored.components == {}
    assert scored.rewards.shape == (3,) and all(math.isnan(r) for r in scored.rewards.tolist())
    with pytest.raises(RuntimeError, match="service down"):
        ledger("error").score(broken, images, ["a", "a", "b"], 2)
    fine = ledger().score(lambda i, p: (torch.ones(3), {"x": torch.zeros(3)}), images, ["a", "a", "b"], 2)
    assert fine.failure is None and fine.rewards.tolist() == [1.0, 1.0, 1.0] and set(fine.components) == {"x"}


def test_refuse_update_raises_under_error_and_counts_under_skip() -> None:
    with pytest.raises(
        FloatingPointError,
        match=r"^non-finite gradient at iteration 4; no optimizer step was taken \(set --model.faults.nonfinite skip",
    ):
        ledger("error").refuse_update("non-finite gradient at iteration 4", 4)
    book = ledger()
    with pytest.warns(FaultWarning, match=r"non-finite loss nan at iteration 4, micro-batch 1; optimizer step skipped"):
        cause = book.refuse_update("non-finite loss nan at iteration 4, micro-batch 1", 4)
    assert cause == "non-finite loss nan at iteration 4, micro-batch 1"
    with pytest.warns(FaultWarning):
        cause = book.refuse_update(None, 4)  # only another rank's was not finite
    assert cause == "a non-finite loss or gradient on another rank at iteration 4"
    assert book.counts["skipped_updates"] == 2 and book.counts["skipped_steps"] == 0  # steps count in end_step


def test_end_step_counts_skipped_steps_and_stops_after_max_consecutive() -> None:
    book = ledger()  # stops at MAX_CONSECUTIVE_SKIPS = 3
    fault = StepPlan(train=False, kept=True, faulty=True, cause="non-finite rewards for prompts ['a']")
    clean = StepPlan(train=True, kept=True, faulty=False, cause=None)
    nothing_kept = StepPlan(train=True, kept=False, faulty=False, cause=None)
    book.end_step(fault, 0, None, 0)  # skipped 1, in a row 1
    book.end_step(clean, 0, "non-finite gradient at iteration 1", 1)  # every optimizer step refused: 2, 2
    book.end_step(clean, 2, None, 2)  # an update: the row resets
    book.end_step(nothing_kept, 0, None, 3)  # no update, but no fault either: not counted
    book.end_step(fault, 1, None, 4)  # a fault, yet one optimizer step ran: an update, not a skip
    assert book.counts["skipped_steps"] == 2 and book.counts["consecutive"] == 0
    book.end_step(fault, 0, None, 5)
    book.end_step(fault, 0, None, 6)
    with pytest.raises(FaultLimitError) as err:
        book.end_step(clean, 0, "non-finite loss nan at iteration 7, micro-batch 0", 7)
    assert str(err.value) == (
        "3 training steps in a row were skipped (at most 3), up to iteration 7; "
        "last cause: non-finite loss nan at iteration 7, micro-batch 0; fix the reward or lower the "
        "learning rate, or resume from the last checkpoint with --ckpt_path last"
    )
    assert book.counts["skipped_steps"] == 5 and book.counts["consecutive"] == 3


def test_a_fault_only_on_another_rank_is_named_as_such() -> None:
    book = ledger()
    other = StepPlan(train=False, kept=True, faulty=True, cause=None)
    book.end_step(other, 0, None, 0)
    book.end_step(other, 0, None, 1)
    with pytest.raises(FaultLimitError, match="last cause: a fault on another data-parallel rank;"):
        book.end_step(other, 0, None, 2)


def test_state_dict_round_trip_and_checkpoints_without_counters() -> None:
    book = ledger()
    book.counts.update(skipped_groups=4, skipped_steps=2, zero_std_groups=1)
    state = book.state_dict()
    assert list(state) == list(FAULT_COUNTERS)  # checkpoint["lit_treegrpo"]["faults"]
    assert state == {
        "skipped_groups": 4,
        "skipped_steps": 2,
        "skipped_updates": 0,
        "consecutive": 0,
        "zero_std_groups": 1,
    }
    state["skipped_groups"] = 99
    assert book.counts["skipped_groups"] == 4  # a copy, not the live counters
    fresh = ledger()
    fresh.load_state_dict(book.state_dict())
    assert fresh.counts == book.counts
    older = ledger()
    older.load_state_dict({"skipped_groups": 1})  # a checkpoint from before the other counters
    assert older.counts == {
        "skipped_groups": 1,
        "skipped_steps": 0,
        "skipped_updates": 0,
        "consecutive": 0,
        "zero_std_groups": 0,
    }
