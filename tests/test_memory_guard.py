"""The memory guard's decision on its own (no Trainer): the estimate against a fraction of the
available memory, a refusal on another rank, memory that cannot be measured, and the check once
per fit. Its use in a real fit is tested in test_module.py and test_cli.py."""

from __future__ import annotations

import pytest
import torch

from lit_treegrpo.core.memory import format_bytes, rollout_memory
from lit_treegrpo.core.spec import TreeSpec
from lit_treegrpo.memory_guard import RolloutGuard, RolloutMemoryError, check_rollout_memory, memory_for_rank
from lit_treegrpo.settings import MemoryGuard

SPEC = TreeSpec(3, branch_steps=(0, 1), branching=2)
COND = torch.zeros(1, 10)  # 40 bytes per prompt row
NOISE = torch.zeros(1, 4, 8, 8)  # latents [4, 8, 8] float32
ESTIMATE = rollout_memory(SPEC, 2, (4, 8, 8), torch.float32, cond_bytes=40)  # 2 prompts


def check(available: int | None, *, any_rank=lambda decision: decision, fraction: float = 0.5) -> None:
    check_rollout_memory(MemoryGuard(fraction=fraction), SPEC, COND, NOISE, 2, cfg=False,
                         available=(available, "measured here"), any_rank=any_rank)  # fmt: skip


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
    with pytest.warns(UserWarning, match="memory guard: the available memory is measured here, so the rollout's estimated"):
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
