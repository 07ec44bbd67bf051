"""The memory guard's decision on its own (no Trainer): the estimate against a fraction of the
available memory, a refusal on another rank, memory that cannot be measured, and the check once
per fit; for the training pass also the split it decides on a real tiny model (what it measures:
test_memory_probe.py). Its use in a real fit is tested in test_module.py and tests/cli/test_cli.py."""

from __future__ import annotations

import pytest
import torch

from lit_treegrpo.core.memory import TrainingMemory, format_bytes, rollout_memory
from lit_treegrpo.core.spec import TreeSpec
from lit_treegrpo.training.memory_guard import (
    MemoryGuard,
    RolloutGuard,
    RolloutMemoryError,
    TrainingGuard,
    TrainingMemoryError,
    check_rollout_memory,
    check_training_memory,
    memory_for_rank,
)
from lit_treegrpo.training.memory_probe import probe_training

SPEC = TreeSpec(3, branch_steps=(0, 1), branching=2)
COND = torch.zeros(1, 10)  # 40 bytes per prompt row
NOISE = torch.zeros(1, 4, 8, 8)  # latents [4, 8, 8] float32
ESTIMATE = rollout_memory(SPEC, 2, (4, 8, 8), torch.float32, cond_bytes=40)  # 2 prompts


def check(available: int | None, *, any_rank=lambda decision: decision, fraction: float = 0.5) -> None:
    check_rollout_memory(
        MemoryGuard(fraction=fraction),
        SPEC,
        COND,
        NOISE,
        2,
        cfg=False,
        available=(available, "measured here"),
        any_rank=any_rank,
    )


def test_the_estimate_is_compared_with_the_fraction_of_the_available_memory() -> None:
    check(2 * ESTIMATE.total)  # limit = 0.5 x 2 x total = total: fits exactly
    with pytest.raises(RolloutMemoryError) as err:
        check(2 * ESTIMATE.total - 2)  # limit = total - 1
    assert str(err.value).startswith(
        f"memory guard: one rollout needs about {ESTIMATE.describe()} for 2 prompts x 4 leaves on this rank, "
        f"but {format_bytes(2 * ESTIMATE.total - 2)} is available (measured here; x 0.5 = "
    )


def test_a_refusal_on_another_rank_stops_this_one_too() -> None:
    with pytest.raises(RolloutMemoryError, match="another data-parallel rank cannot fit the rollout; see its message"):
        check(10 * ESTIMATE.total, any_rank=lambda decision: True)


def test_memory_that_cannot_be_measured_is_warned_about_not_checked() -> None:
    with pytest.warns(
        UserWarning, match="memory guard: the available memory is measured here, so the rollout's estimated"
    ):
        check(None)


def test_the_given_memory_overrides_the_measurement() -> None:
    given = MemoryGuard(available_gb=2.5)
    assert memory_for_rank(given, torch.device("meta"), 4) == (2_500_000_000, "--model.memory_guard.available_gb")
    assert memory_for_rank(MemoryGuard(), torch.device("meta"), 4) == (None, "not measured on meta")


class _Adapter:
    device = torch.device("cpu")
    do_cfg = False

    def encode_prompts(self, prompts: list[str]) -> torch.Tensor:
        return torch.zeros(len(prompts), 10)

    def initial_noise(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return torch.zeros(n, 4, 8, 8)


class _Prompts:
    """What the guard reads from a PromptDataModule: prompts per rank and one training prompt."""

    class train_set:
        prompts = ["a red circle"]

    def per_rank_batch_size(self) -> int:
        return 2


def test_the_guard_checks_once_per_fit_before_the_data_when_it_can() -> None:
    guard = RolloutGuard(MemoryGuard(available_gb=1e-6))  # 1 kB: nothing fits
    guard.before_data(_Adapter(), None, SPEC, processes=1, any_rank=lambda d: d)  # no PromptDataModule
    assert not guard.checked  # left to the first training step
    with pytest.raises(RolloutMemoryError, match="for 2 prompts x 4 leaves on this rank, but 1 kB is available"):
        guard.before_data(_Adapter(), _Prompts(), SPEC, processes=1, any_rank=lambda d: d)
    disabled = RolloutGuard(MemoryGuard(enabled=False, available_gb=1e-6))
    disabled.before_data(_Adapter(), _Prompts(), SPEC, processes=1, any_rank=lambda d: d)
    disabled.check(_Adapter(), SPEC, COND, NOISE, 2, processes=1, any_rank=lambda d: d)
    assert disabled.checked  # nothing estimated, and not asked again


# ------------------------------------------------------------------------------ the training pass
TRAINING = TrainingMemory(1000, {"gradients": 100, "optimizer state": 200, "the rollout's tree": 0})


def check_training(available: int | None, *, any_rank=lambda decision: decision) -> int | None:
    return check_training_memory(
        MemoryGuard(fraction=0.5),
        TRAINING,
        6,
        available=(available, "measured here"),
        any_rank=any_rank,
        fixes="do this",
    )


def test_the_parents_that_fit_a_training_forward_come_from_the_fraction_of_the_memory() -> None:
    assert check_training(2 * (300 + 3 * 1000)) == 3  # limit 0.5 x 6600 = 3300: 3 parents
    assert check_training(2 * (300 + 1000)) == 1
    with pytest.raises(TrainingMemoryError) as err:
        check_training(2 * (300 + 1000) - 2)  # 1 byte short of one parent
    assert str(err.value) == (
        "memory guard: the training pass cannot fit even one parent per forward: it needs about "
        f"{TRAINING.describe(1)} on this rank, but 2.6 kB is available (measured here; x 0.5 = 1.3 kB); "
        "do this, or set --model.memory_guard.enabled false to skip this check"
    )
    with pytest.raises(TrainingMemoryError, match="another data-parallel rank cannot fit the training pass"):
        check_training(10**9, any_rank=lambda decision: True)
    with pytest.warns(
        UserWarning,
        match="so the training pass's estimated 6.3 kB .* is not checked; give --model.memory_guard.available_gb",
    ):
        assert check_training(None) is None


def test_the_training_guard_sets_the_cap_and_splits_micro_batches(tiny) -> None:
    adapters, conds, noise = tiny
    adapter, cond = adapters[1.0, False], conds[1.0, False]
    saved = probe_training(adapter, SPEC, cond, noise)
    guard = TrainingGuard(MemoryGuard(available_gb=1.0))
    guard.check(adapter, SPEC, cond, noise, 2, micro_batches=1, optimizer=None, processes=1, any_rank=lambda d: d)
    assert guard.checked and guard.memory.per_parent == saved.per_row(False)
    assert guard.cap == guard.fits == guard.memory.parents_that_fit(0.9e9) > 6  # all 6 parents fit: no split
    assert guard.chunks([6, 3, 0]) == [1, 1, 1] and not guard.announced
    capped = TrainingGuard(MemoryGuard(available_gb=1.0, max_train_parents=4))
    capped.check(adapter, SPEC, cond, noise, 2, micro_batches=1, optimizer=None, processes=1, any_rank=lambda d: d)
    assert capped.cap == 4 and capped.chunks([6, 4, 9, 0]) == [2, 1, 3, 1] and capped.announced
    # disabled: no probe, no estimate; only a given cap splits
    off = TrainingGuard(MemoryGuard(enabled=False, max_train_parents=2))
    off.check(adapter, SPEC, cond, noise, 2, micro_batches=1, optimizer=None, processes=1, any_rank=lambda d: d)
    assert off.memory is None and off.active and off.chunks([5]) == [3]
    assert not TrainingGuard(MemoryGuard(enabled=False)).active
    with pytest.raises(ValueError, match="memory_guard.max_train_parents must be >= 1 or null, got 0"):
        MemoryGuard(max_train_parents=0)
