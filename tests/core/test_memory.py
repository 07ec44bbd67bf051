"""The rollout memory estimate: hand-counted bytes, and the recorded parts equal to what a real
rollout stores."""

from __future__ import annotations

import pytest
import torch

from lit_treegrpo.core import memory
from lit_treegrpo.core.memory import available_memory, cond_row_bytes, format_bytes, mem_available, rollout_memory
from lit_treegrpo.core.rollout import rollout
from lit_treegrpo.core.spec import TreeSpec

from .helpers import ToyFlow


def test_hand_counted_bytes_of_a_small_tree() -> None:
    # T=4, k=2 at steps 0 and 1: nodes_at = 1, 2, 4, 4; stochastic steps 0, 1 -> 1 + 2 = 3 sources,
    # edges 1*2 + 2*2 = 6, leaves 4 per prompt. P = 2 prompts, latents [4, 16, 16] float32:
    # n = 1024 elements, lat = 4096 bytes; conditioning 1000 bytes per row; CFG on; max_batch 5.
    spec = TreeSpec(4, branch_steps=(0, 1), branching=2)
    est = rollout_memory(spec, 2, (4, 16, 16), torch.float32, cond_bytes=1000, cfg=True, max_batch=5)
    assert est.parts == {
        "recorded sources": 3 * 2 * 4096,  # 24576
        "recorded edges": 6 * 2 * 4096,  # 49152
        "leaf latents": 4 * 2 * 4096,  # 32768
        "final concatenation": (3 + 6) * 2 * 4096,  # 73728
        "conditioning per node": (4 * 2 + 2) * 1000,  # 10000: 8 node rows + the 2 prompts' own
        "step workspace": 4 * 2 * 1024 * (2 * 4 + 4 * 4),  # 196608: 8 frontier rows
        "model call input": 5 * (4096 + 1000) * 2,  # 50960: a chunk of max_batch=5 rows, CFG doubles
    }
    assert est.total == 24576 + 49152 + 32768 + 73728 + 10000 + 196608 + 50960
    assert est.largest(2) == [("step workspace", 196608), ("final concatenation", 73728)]
    assert est.describe(2) == "438 kB (step workspace 197 kB, final concatenation 73.7 kB)"


def test_bfloat16_latents_and_flat_trees() -> None:
    # flat GRPO, G = 3 chains, SDE at steps 0..2 of T=4: sources 3 per step x 3 steps = 9, edges 9,
    # leaves 3; bfloat16 latents of 16 x 8 x 8 = 1024 elements, 2048 bytes; no CFG, no cond
    spec = TreeSpec(4, sde_steps=(0, 1, 2), num_trees=3)
    est = rollout_memory(spec, 1, (16, 8, 8), torch.bfloat16)
    assert est.parts["recorded sources"] == 9 * 2048
    assert est.parts["recorded edges"] == 9 * 2048
    assert est.parts["leaf latents"] == 3 * 2048
    assert est.parts["step workspace"] == 3 * 1024 * (2 * 2 + 16)
    assert est.parts["model call input"] == 3 * 2048
    assert est.parts["conditioning per node"] == 0


@pytest.mark.parametrize(
    "spec,max_batch",
    [
        (TreeSpec(6, branch_steps=(0, 2), branching=(3, 2), sde_steps=(3,)), 64),
        (TreeSpec(5, sde_steps=(0, 1, 2, 3), num_trees=4), 64),
        (TreeSpec(6, branch_steps=(1, 3), branching=2, num_trees=2), 3),
    ],
)
def test_the_recorded_parts_are_what_a_rollout_stores(spec: TreeSpec, max_batch: int) -> None:
    P, shape = 3, (2, 4, 4)
    flow = ToyFlow(spec.num_steps)
    gen = torch.Generator().manual_seed(0)
    tree = rollout(flow.predict, flow.step, spec, torch.zeros(P), torch.randn(P * spec.num_trees, *shape, generator=gen), generator=gen,
                   max_batch=max_batch)  # fmt: skip
    est = rollout_memory(spec, P, shape, torch.float32, cond_bytes=cond_row_bytes(torch.zeros(P)), max_batch=max_batch)
    nbytes = lambda t: t.numel() * t.element_size()  # noqa: E731
    assert est.parts["recorded sources"] == nbytes(tree.source_x)
    assert est.parts["recorded edges"] == nbytes(tree.edge_x_next)
    assert est.parts["leaf latents"] == nbytes(tree.leaf_latents)
    assert est.parts["model call input"] == min(max_batch, tree.num_leaves) * (2 * 4 * 4 * 4 + 4)
    assert max(flow.calls) <= max_batch  # the chunking the estimate assumes


def test_cond_row_bytes_counts_every_tensor_of_a_row() -> None:
    cond = {"embeds": torch.zeros(3, 7, 5), "pooled": torch.zeros(3, 2, dtype=torch.float16), "tag": "x"}
    assert cond_row_bytes(cond) == 7 * 5 * 4 + 2 * 2
    with pytest.raises(ValueError, match="disagree on the number of prompt rows"):
        cond_row_bytes({"a": torch.zeros(2, 1), "b": torch.zeros(3, 1)})


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (999, 1000, 1234567, 2.5e9)] == ["999 B", "1 kB", "1.23 MB", "2.5 GB"]


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="num_prompts must be >= 1"):
        rollout_memory(TreeSpec(2), 0, (1,), torch.float32)
    with pytest.raises(ValueError, match="cond_bytes must be >= 0"):
        rollout_memory(TreeSpec(2), 1, (1,), torch.float32, cond_bytes=-1)


def test_available_memory_shares_memavailable_among_the_node_processes(monkeypatch) -> None:
    monkeypatch.setattr(memory, "mem_available", lambda: 4000)
    assert available_memory(torch.device("cpu"), processes=4) == (1000, "MemAvailable / 4 process(es) of this node")
    assert available_memory(torch.device("meta")) == (None, "not measured on meta")
    monkeypatch.setattr(memory, "mem_available", lambda: None)
    assert available_memory(torch.device("cpu")) == (None, "MemAvailable unknown")


def test_mem_available_reads_this_machine() -> None:
    available = mem_available()
    assert available is not None and available > 0
