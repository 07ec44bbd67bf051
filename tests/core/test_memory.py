"""The rollout memory estimate: hand-counted bytes, and the recorded parts equal to what a real
rollout stores. The training pass's: what autograd saves, counted exactly on small modules, with
and without checkpointed regions, and its arithmetic."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils import checkpoint as torch_checkpoint

from lit_treegrpo.core.memory import (
    SavedTensors,
    TrainingMemory,
    cond_row_bytes,
    count_saved_tensors,
    format_bytes,
    held_tree_bytes,
    largest_micro_batch,
    parents_per_rank,
    rollout_memory,
    training_memory,
)
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
    tree = rollout(
        flow.predict,
        flow.step,
        spec,
        torch.zeros(P),
        torch.randn(P * spec.num_trees, *shape, generator=gen),
        generator=gen,
        max_batch=max_batch,
    )
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


# ------------------------------------------------------------------------------ the training pass


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


@pytest.mark.parametrize("rows", [1, 3])
def test_saved_tensors_are_counted_exactly_without_the_parameters(rows: int) -> None:
    # Linear(8, 16) saves its input x [rows, 8] (and its weight: a parameter, left out); ReLU saves its
    # output [rows, 16], which the second Linear saves again as its input (one storage: counted once)
    mlp = _mlp()
    x = torch.randn(rows, 8)
    saved = count_saved_tensors(lambda: mlp(x).sum(), mlp.parameters())
    assert saved == SavedTensors(rows * 8 * 4 + rows * 16 * 4, rows * 16 * 4, ())
    assert saved.activations(True) == saved.activations(False) == saved.saved  # nothing checkpointed
    assert saved.per_row(False) == saved.saved + 2 * rows * 16 * 4  # the backward's workspace
    assert all(p.grad is None for p in mlp.parameters())  # nothing was backpropagated


class _Checkpointed(nn.Module):
    """Two checkpointed blocks between an input and an output layer, as diffusers calls them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.out = nn.Linear(8, 32), nn.Linear(32, 4)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = torch_checkpoint.checkpoint(block, h, use_reentrant=False)
        return self.out(h)


def test_checkpointed_regions_are_seen_and_keep_only_their_inputs() -> None:
    model = _Checkpointed()
    x = torch.randn(5, 8)
    original = torch_checkpoint.checkpoint
    saved = count_saved_tensors(lambda: model(x).sum(), model.parameters())
    assert torch_checkpoint.checkpoint is original  # the probe's detour is undone
    # outside: inp saves x [5, 8]; out saves its input [5, 32] (the second block's output). Each
    # block: Linear saves h [5, 32], ReLU its output [5, 64], the second Linear that again
    row32, row64 = 5 * 32 * 4, 5 * 64 * 4
    assert saved.regions == ((row32, row32 + row64), (row32, row32 + row64))
    assert saved.saved == 5 * 8 * 4 + 2 * (row32 + row64) + row32
    # checkpointing keeps each block's input instead, and recomputes one block at a time
    assert saved.activations(False) == saved.saved
    assert saved.activations(True) == 5 * 8 * 4 + row32 + 2 * row32 + (row32 + row64)
    assert saved.largest == row64
    # a region that raises leaves torch's checkpoint as it was
    with pytest.raises(RuntimeError, match="mat1 and mat2"):
        count_saved_tensors(lambda: model(torch.randn(5, 7)), model.parameters())
    assert torch_checkpoint.checkpoint is original


def test_the_probe_holds_no_activations() -> None:
    # each saved tensor is dropped at once: a big forward's graph keeps nothing alive afterwards
    mlp = _mlp()
    x = torch.randn(4, 8)
    outputs = []
    count_saved_tensors(lambda: outputs.append(mlp(x)), mlp.parameters())
    with pytest.raises(TypeError, match="unpack_hook expected to be a Tensor"):  # its saved tensors are gone
        outputs[0].sum().backward()


def test_training_memory_arithmetic() -> None:
    saved = SavedTensors(saved=1000, largest=100, regions=((10, 400), (10, 300)))
    mem = training_memory(saved, checkpointing=True, trainable_bytes=50, optimizer_state_bytes=100, held_bytes=150)
    # checkpointed: 1000 - (400 + 300) + (10 + 10) + 400 = 720, plus 2 x 100 of backward workspace
    assert mem == TrainingMemory(920, {"gradients": 50, "optimizer state": 100, "the rollout's tree": 150})
    assert (
        training_memory(saved, checkpointing=False, trainable_bytes=0, optimizer_state_bytes=0, held_bytes=0).per_parent
        == 1200
    )
    assert mem.total(3) == 3 * 920 + 300
    assert mem.parents_that_fit(300 + 3 * 920) == 3 and mem.parents_that_fit(300 + 3 * 920 - 1) == 2
    assert mem.parents_that_fit(300 + 919) == 0 and mem.parents_that_fit(100) == 0
    assert (
        mem.describe(2)
        == "2.14 kB (2 parent(s) x 920 B, gradients 50 B, optimizer state 100 B, the rollout's tree 150 B)"
    )


def test_parents_and_the_largest_micro_batch() -> None:
    spec = TreeSpec(4, branch_steps=(0, 1), branching=2)  # stochastic steps 0, 1: 1 + 2 = 3 sources
    assert parents_per_rank(spec, 2) == 6
    assert parents_per_rank(TreeSpec(4, sde_steps=(0, 1, 2), num_trees=3), 1) == 9
    assert [largest_micro_batch(6, m) for m in (1, 2, 4, 6, 10)] == [6, 3, 2, 1, 1]
    # what the training pass holds of the tree: sources, edges, leaves (4096 B each), the prompts' cond
    assert held_tree_bytes(spec, 2, (4, 16, 16), torch.float32, cond_bytes=1000) == (3 + 6 + 4) * 2 * 4096 + 2 * 1000


def test_shard_elements_is_the_largest_chunk_of_dim_0() -> None:
    from lit_treegrpo.core.memory import shard_elements

    assert shard_elements((10, 3), 4) == 3 * 3  # rows 10 in chunks of ceil(10 / 4) = 3: 3, 3, 3, 1
    assert shard_elements((8, 5, 2), 8) == 1 * 10
    assert shard_elements((5,), 8) == 1  # fewer rows than ranks: one row each, three ranks empty
    assert shard_elements((), 8) == 1 and shard_elements((7, 2), 1) == 14
    with pytest.raises(ValueError, match="shards must be >= 1, got 0"):
        shard_elements((4,), 0)
