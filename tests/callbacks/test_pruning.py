"""PruningSchedule: the schedule as tables of hand numbers, option checks, resume warnings."""

from __future__ import annotations

import warnings

import pytest

from lit_treegrpo.callbacks import PruningSchedule
from lit_treegrpo.core.pruning import PruningConfig

from .helpers import TRAIN_PROMPTS, StandIn, prompt_loader, trainer


def windows(schedule: PruningSchedule, iterations: list[int]) -> list[tuple[int, int] | None]:
    return [schedule.at(i, 1000).depth_window for i in iterations]


def test_branchgrpo_depth_window_slides_deeper_until_stop() -> None:
    # BranchGRPO: 4 depths, one deeper every 30 steps; lo = min(0 + 1 * (it // 30), 2)
    s = PruningSchedule(depth_window=4, depth_every=30, depth_shift=1, depth_stop=2)
    its = [0, 29, 30, 59, 60, 89, 90, 999]
    assert windows(s, its) == [(0, 4), (0, 4), (1, 5), (1, 5), (2, 6), (2, 6), (2, 6), (2, 6)]


def test_depth_window_deeper_without_stop() -> None:
    # lo = 1 + 3 * (it // 5): 0..4 -> 1, 5..9 -> 4, 10 -> 7, 52 -> 1 + 3 * 10 = 31
    s = PruningSchedule(depth_window=2, depth_every=5, depth_shift=3, depth_start=1)
    assert windows(s, [0, 4, 5, 9, 10, 52]) == [(1, 3), (1, 3), (4, 6), (4, 6), (7, 9), (31, 33)]


def test_depth_window_shallower_clamps_at_zero_or_stop() -> None:
    # lo = max(5 - 2 * (it // 10), stop): 0..9 -> 5, 10..19 -> 3, 20..29 -> 1, then 0 (default stop)
    s = PruningSchedule(depth_window=2, depth_every=10, depth_shift=2, depth_start=5, depth_direction="shallower")
    its = [0, 9, 10, 19, 20, 29, 30, 500]
    assert windows(s, its) == [(5, 7), (5, 7), (3, 5), (3, 5), (1, 3), (1, 3), (0, 2), (0, 2)]
    stopped = PruningSchedule(
        depth_window=2, depth_every=10, depth_shift=2, depth_start=5, depth_stop=2, depth_direction="shallower"
    )
    assert windows(stopped, [0, 10, 20, 30]) == [(5, 7), (3, 5), (2, 4), (2, 4)]


def test_branchgrpo_code_drops_its_deepest_depths_sliding_towards_the_root() -> None:
    # BranchGRPO's script, scaled to 8 trained depths: drop [6, 8), one depth shallower every 30
    # iterations, the window's first depth stopping at 4
    s = PruningSchedule(depth_window=2, depth_start=6, depth_every=30, depth_direction="shallower", depth_stop=4)
    assert windows(s, [0, 30, 60, 90, 1000]) == [(6, 8), (5, 7), (4, 6), (4, 6), (4, 6)]
    assert s.at(0, 1000).depth_mode == "drop"
    assert PruningSchedule(depth_window=2, depth_mode="keep").at(0, 1000).depth_mode == "keep"


def test_fixed_window_and_no_depth_pruning() -> None:
    assert windows(PruningSchedule(depth_window=3, depth_shift=0, depth_start=2), [0, 10_000]) == [(2, 5), (2, 5)]
    assert windows(PruningSchedule(), [0, 10_000]) == [None, None]


@pytest.mark.parametrize(
    ("fraction", "max_steps", "on_steps"),
    [
        (0.3, 10, 3),  # iterations 0, 1, 2
        (0.07, 100, 7),  # 0.07 * 100 = 7.000000000000001 in floats: still 7 steps
        (0.25, 10, 3),  # ceil(2.5)
        (0.5, 4, 2),
    ],
)
def test_width_pruning_for_the_first_fraction_of_steps(fraction: float, max_steps: int, on_steps: int) -> None:
    s = PruningSchedule(width="parent_top1", width_fraction=fraction)
    widths = [s.at(i, max_steps).width for i in range(max_steps)]
    assert widths == ["parent_top1"] * on_steps + ["none"] * (max_steps - on_steps)


def test_width_options_are_carried_and_full_fraction_needs_no_run_length() -> None:
    s = PruningSchedule(width="extreme", ratio=0.25)
    assert s.at(10**6, -1) == PruningConfig(width="extreme", ratio=0.25)
    assert PruningSchedule(width="ratio", ratio=0.3).at(0, None) == PruningConfig(width="ratio", ratio=0.3)


def test_width_fraction_needs_max_steps(tmp_path) -> None:
    s = PruningSchedule(width="extreme", width_fraction=0.5)
    with pytest.raises(ValueError, match="width_fraction=0.5 needs the run length: set trainer.max_steps"):
        s.at(0, -1)
    # and the Trainer fails before the first step
    module = StandIn()
    with pytest.raises(ValueError, match="width_fraction"):
        trainer(tmp_path, -1, [s], max_epochs=1).fit(module, prompt_loader(TRAIN_PROMPTS))
    assert module.seen_pruning == []


@pytest.mark.parametrize(
    ("options", "name"),
    [
        (dict(width="top"), "PruningSchedule.width"),
        (dict(width_fraction=0.0), "PruningSchedule.width_fraction"),
        (dict(width_fraction=1.5), "PruningSchedule.width_fraction"),
        (dict(ratio=0.0), "PruningSchedule.ratio"),
        (dict(depth_window=0), "PruningSchedule.depth_window"),
        (dict(depth_every=0), "PruningSchedule.depth_every"),
        (dict(depth_shift=-1), "PruningSchedule.depth_shift"),
        (dict(depth_start=-1), "PruningSchedule.depth_start"),
        (dict(depth_stop=-1), "PruningSchedule.depth_stop"),
        (dict(depth_direction="up"), "PruningSchedule.depth_direction"),
        (dict(depth_mode="only"), "PruningSchedule.depth_mode"),
        (dict(depth_start=3, depth_stop=1), "PruningSchedule.depth_stop=1 is above depth_start=3"),
        (dict(depth_start=1, depth_stop=3, depth_direction="shallower"), "PruningSchedule.depth_stop=3 is below"),
    ],
)
def test_invalid_options_are_named(options: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        PruningSchedule(**options)


def test_resume_with_same_options_is_silent_and_changed_options_warn() -> None:
    saved = PruningSchedule(depth_window=4, depth_every=30).state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PruningSchedule(depth_window=4, depth_every=30).load_state_dict(saved)
    with pytest.warns(UserWarning, match="depth_every: 30 -> 10"):
        PruningSchedule(depth_window=4, depth_every=10).load_state_dict(saved)


def test_step_fraction_draws_a_seeded_subset_of_the_stochastic_steps() -> None:
    # DanceGRPO: 60% of 9 SDE steps -> ceil(5.4) = 6 steps a iteration, a pure function of (seed, it)
    s = PruningSchedule(step_fraction=0.6, seed=3)
    sde = list(range(9))
    picks = [s.at(i, 100, sde).steps for i in range(20)]
    assert all(len(p) == 6 and list(p) == sorted(set(p)) and set(p) <= set(sde) for p in picks)
    assert picks == [PruningSchedule(step_fraction=0.6, seed=3).at(i, 100, sde).steps for i in range(20)]
    assert len(set(picks)) > 10  # a fresh draw every iteration
    assert picks != [PruningSchedule(step_fraction=0.6, seed=4).at(i, 100, sde).steps for i in range(20)]
    assert PruningSchedule().at(0, 100, sde).steps is None
    with pytest.raises(ValueError, match="step_fraction must be in"):
        PruningSchedule(step_fraction=0.0)


def test_fixed_steps_are_trained_every_iteration_and_exclude_a_step_fraction() -> None:
    fixed = PruningSchedule(steps=[3, 1])
    assert [fixed.at(i, 100, [0, 1, 2, 3]).steps for i in (0, 7)] == [(3, 1), (3, 1)]
    assert fixed.at(0, None) == PruningConfig(steps=(3, 1))
    with pytest.raises(ValueError, match=r"PruningSchedule\.steps must be denoising step indices >= 0"):
        PruningSchedule(steps=[-1])
    with pytest.raises(ValueError, match=r"steps=\(1,\) and step_fraction=0.6 both choose the trained steps"):
        PruningSchedule(steps=[1], step_fraction=0.6)


def test_every_fixed_pruning_is_a_constant_schedule() -> None:
    # the options of the old --model.pruning, each as a schedule that never changes
    cases = [
        (dict(width="parent_top1"), PruningConfig(width="parent_top1")),
        (dict(width="extreme"), PruningConfig(width="extreme")),
        (dict(width="ratio", ratio=0.25), PruningConfig(width="ratio", ratio=0.25)),
        (dict(depth_window=3, depth_start=1, depth_shift=0), PruningConfig(depth_window=(1, 4))),
        (dict(depth_window=1, depth_shift=0, depth_mode="keep"), PruningConfig(depth_window=(0, 1), depth_mode="keep")),
        (dict(steps=[0, 2]), PruningConfig(steps=(0, 2))),
    ]
    for options, fixed in cases:
        schedule = PruningSchedule(**options)
        assert [schedule.at(i, None, [0, 1, 2]) for i in (0, 29, 30, 10_000)] == [fixed] * 4, options


def test_a_checkpoint_from_before_the_steps_option_resumes_silently() -> None:
    saved = PruningSchedule(step_fraction=0.6).state_dict()
    del saved["options"]["steps"]  # as written before the option existed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PruningSchedule(step_fraction=0.6).load_state_dict(saved)
    with pytest.warns(UserWarning, match=r"steps: None -> \(2,\)"):
        PruningSchedule(steps=[2]).load_state_dict(saved | {"options": {**saved["options"], "step_fraction": 1.0}})


def test_the_export_card_reads_the_runs_pruning_from_its_checkpoint() -> None:
    from dataclasses import asdict

    from lit_treegrpo.artifacts.export import pruning_options

    schedule = PruningSchedule(width="parent_top1", depth_window=2, steps=[1, 2])
    checkpoint = {"callbacks": {"EMA": {"shadows": []}, schedule.state_key: schedule.state_dict()}}
    assert pruning_options(checkpoint) == asdict(schedule) and pruning_options(checkpoint)["steps"] == (1, 2)
    assert pruning_options({"callbacks": {"EMA": {"shadows": []}}}) is None  # no schedule: every edge trained
