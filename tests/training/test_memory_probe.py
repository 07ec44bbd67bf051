"""What the memory guard measures: the memory available (CUDA, MemAvailable shared by the node's
processes), what autograd saves for one parent on a real tiny model (with and without classifier-free
guidance and gradient checkpointing), and the optimizer state still to be allocated."""

from __future__ import annotations

import torch

from lit_treegrpo.core.spec import TreeSpec
from lit_treegrpo.training import memory_probe
from lit_treegrpo.training.memory_probe import available_memory, mem_available, optimizer_state_bytes, probe_training

SPEC = TreeSpec(3, branch_steps=(0, 1), branching=2)


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
    monkeypatch.setattr(memory_probe, "mem_available", lambda: 4000)
    assert available_memory(torch.device("cpu"), processes=4) == (1000, "MemAvailable / 4 process(es) of this node")
    assert available_memory(torch.device("meta")) == (None, "not measured on meta")
    monkeypatch.setattr(memory_probe, "mem_available", lambda: None)
    assert available_memory(torch.device("cpu")) == (None, "MemAvailable unknown")


def test_mem_available_reads_this_machine() -> None:
    available = mem_available()
    assert available is not None and available > 0
