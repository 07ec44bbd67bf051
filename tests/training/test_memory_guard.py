"""The memory guard (training/memory_guard.py) on its own, no Trainer: the estimate against a
fraction of the available memory, a refusal on another rank, memory that cannot be measured, the
training pass's split on a real tiny model, and what it measures (the memory available, one
parent's saved tensors, the optimizer state). Its use in a real fit: test_module.py, tests/cli."""

from __future__ import annotations

import pytest
import torch

from lit_treegrpo.core.memory import TrainingMemory, format_bytes, rollout_memory
from lit_treegrpo.core.spec import TreeSpec
from lit_treegrpo.training import memory_guard
from lit_treegrpo.training.memory_guard import (
    MemoryCheck,
    MemoryGuard,
    RolloutMemoryError,
    TrainingMemoryError,
    available_memory,
    mem_available,
    optimizer_state_bytes,
    probe_training,
)

SPEC = TreeSpec(3, branch_steps=(0, 1), branching=2)
COND = torch.zeros(1, 10)  # 40 bytes per prompt row
NOISE = torch.zeros(1, 4, 8, 8)  # latents [4, 8, 8] float32
ESTIMATE = rollout_memory(SPEC, 2, (4, 8, 8), torch.float32, cond_bytes=40)  # 2 prompts


def check(available: int | None, *, any_rank=lambda decision: decision, fraction: float = 0.5) -> None:
    MemoryCheck(MemoryGuard(fraction=fraction))._refuse_rollout(
        ESTIMATE, SPEC, 2, (available, "measured here"), any_rank
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
    assert MemoryCheck(MemoryGuard(), available_bytes=2_500).available(torch.device("meta"), 4) == (2_500, "as given")
    assert MemoryCheck(MemoryGuard()).available(torch.device("meta"), 4) == (None, "not measured on meta")


def test_the_guard_checks_once_and_a_disabled_one_estimates_nothing(tiny) -> None:
    adapters, conds, noise = tiny
    adapter, cond = adapters[1.0, False], conds[1.0, False]
    kwargs = dict(max_batch=64, micro_batches=1, optimizer=None, processes=1, any_rank=lambda d: d)
    guard = MemoryCheck(MemoryGuard(), available_bytes=1000)  # 1 kB: nothing fits
    with pytest.raises(RolloutMemoryError, match="for 2 prompts x 4 leaves on this rank, but 1 kB is available"):
        guard.check(adapter, SPEC, cond, noise, 2, **kwargs)
    assert guard.checked
    disabled = MemoryCheck(MemoryGuard(enabled=False), available_bytes=1000)
    disabled.check(adapter, SPEC, cond, noise, 2, **kwargs)
    assert disabled.checked and disabled.memory is None  # nothing estimated


# ------------------------------------------------------------------------------ the training pass
TRAINING = TrainingMemory(1000, {"gradients": 100, "optimizer state": 200, "the rollout's tree": 0})


def test_the_parents_that_fit_a_training_forward_come_from_the_fraction_of_the_memory() -> None:
    assert TRAINING.parents_that_fit(0.5 * 2 * (300 + 3 * 1000)) == 3  # limit 0.5 x 6600 = 3300: 3 parents
    assert TRAINING.parents_that_fit(0.5 * 2 * (300 + 1000)) == 1
    assert TRAINING.parents_that_fit(0.5 * (2 * (300 + 1000) - 2)) == 0  # 1 byte short of one parent


def test_the_training_guard_refuses_a_parent_that_cannot_fit_and_warns_when_unmeasured(tiny) -> None:
    adapters, conds, noise = tiny
    adapter, cond = adapters[1.0, False], conds[1.0, False]
    guard = MemoryCheck(MemoryGuard(fraction=0.5))
    args = (adapter, SPEC, cond, noise, 2, 1, None)
    with pytest.raises(TrainingMemoryError) as err:
        guard._size_training(*args, (1000, "measured here"), lambda d: d)
    assert str(err.value).startswith(
        "memory guard: the training pass cannot fit even one parent per forward: it needs about "
    )
    assert "on this rank, but 1 kB is available (measured here; x 0.5 = 500 B); turn on " in str(err.value)
    assert str(err.value).endswith("or set --model.memory_guard.enabled false to skip this check")
    with pytest.raises(TrainingMemoryError, match="another data-parallel rank cannot fit the training pass"):
        guard._size_training(*args, (10**9, "measured here"), lambda decision: True)
    with pytest.warns(UserWarning, match="so the training pass's estimated .* is not checked"):
        guard._size_training(*args, (None, "measured here"), lambda d: d)
    assert guard.fits is None and guard.cap is None


def test_the_training_guard_sets_the_cap_and_splits_micro_batches(tiny) -> None:
    adapters, conds, noise = tiny
    adapter, cond = adapters[1.0, False], conds[1.0, False]
    saved = probe_training(adapter, SPEC, cond, noise)
    kwargs = dict(max_batch=64, micro_batches=1, optimizer=None, processes=1, any_rank=lambda d: d)
    guard = MemoryCheck(MemoryGuard(), available_bytes=10**9)
    guard.check(adapter, SPEC, cond, noise, 2, **kwargs)
    assert guard.checked and guard.memory.per_parent == saved.per_row(False)
    assert guard.cap == guard.fits == guard.memory.parents_that_fit(0.9e9) > 6  # all 6 parents fit: no split
    assert guard.chunks([6, 3, 0]) == [1, 1, 1] and not guard.announced
    capped = MemoryCheck(MemoryGuard(), available_bytes=10**9, max_train_parents=4)
    capped.check(adapter, SPEC, cond, noise, 2, **kwargs)
    assert capped.cap == 4 and capped.chunks([6, 4, 9, 0]) == [2, 1, 3, 1] and capped.announced
    # disabled: no probe, no estimate; only a given cap splits
    off = MemoryCheck(MemoryGuard(enabled=False), max_train_parents=2)
    off.check(adapter, SPEC, cond, noise, 2, **kwargs)
    assert off.memory is None and off.active and off.chunks([5]) == [3]
    assert not MemoryCheck(MemoryGuard(enabled=False)).active


# ------------------------------------------------------------------------------ what it measures
def test_the_probe_counts_cfg_rows_and_what_checkpointing_saves(tiny) -> None:
    adapters, conds, noise = tiny
    probes = {key: probe_training(adapter, SPEC, conds[key], noise) for key, adapter in adapters.items()}
    # the same counts whether checkpointing is on (its regions run directly in the probe) or off (it
    # is switched on for the probe, to find the regions, and off again)
    assert probes[1.0, False] == probes[1.0, True] and probes[4.5, False] == probes[4.5, True]
    assert (
        not adapters[1.0, False].denoiser.is_gradient_checkpointing
        and adapters[1.0, True].denoiser.is_gradient_checkpointing
    )
    plain, guided = probes[1.0, False], probes[4.5, False]
    assert len(plain.regions) == 2  # the tiny SD3 transformer's two blocks
    assert plain.activations(True) < plain.activations(False)
    # classifier-free guidance doubles the rows of a parent's forward (the conditioning and the
    # children's step outside it do not double: a little less than twice)
    assert 1.8 * plain.saved < guided.saved < 2 * plain.saved
    assert all(p.grad is None for p in adapters[1.0, False].trainable_parameters())


def test_optimizer_state_still_to_come_is_counted_by_the_optimizer() -> None:
    params = [torch.nn.Parameter(torch.zeros(10)), torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))]
    size = 10 * 4 + 5 * 8
    assert optimizer_state_bytes(torch.optim.AdamW(params), params) == 2 * size  # two moments
    assert optimizer_state_bytes(torch.optim.Adam(params, amsgrad=True), params) == 3 * size
    assert optimizer_state_bytes(torch.optim.SGD(params, lr=0.1), params) == 0
    assert optimizer_state_bytes(torch.optim.SGD(params, lr=0.1, momentum=0.9), params) == size
    assert optimizer_state_bytes(torch.optim.RMSprop(params), params) == 2 * size  # any other: two copies
    assert optimizer_state_bytes(None, params) == 2 * size
    stepped = torch.optim.AdamW(params)
    params[0].grad = torch.ones(10)
    stepped.step()  # params[0] has its state now (a resumed run's is loaded after the check)
    assert optimizer_state_bytes(stepped, params) == 2 * 5 * 8


def test_available_memory_shares_memavailable_among_the_node_processes(monkeypatch) -> None:
    monkeypatch.setattr(memory_guard, "mem_available", lambda: 4000)
    assert available_memory(torch.device("cpu"), processes=4) == (1000, "MemAvailable / 4 process(es) of this node")
    assert available_memory(torch.device("meta")) == (None, "not measured on meta")
    monkeypatch.setattr(memory_guard, "mem_available", lambda: None)
    assert available_memory(torch.device("cpu")) == (None, "MemAvailable unknown")


def test_mem_available_reads_this_machine() -> None:
    available = mem_available()
    assert available is not None and available > 0
