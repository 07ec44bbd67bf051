"""Memory of one rollout at its peak, counted from the tree's shape (pure arithmetic)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils import checkpoint as torch_checkpoint

from .spec import TreeSpec

FLOAT32_BYTES = 4
_STEP_FLOAT32_COPIES = 4  # noise, float32 model output, float32 sample, mean (see the table above)


class RolloutMemory(NamedTuple):
    """Bytes of one rollout at its peak, by part (the rows of the module docstring's table)."""

    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def largest(self, count: int = 3) -> list[tuple[str, int]]:
        """The ``count`` biggest parts, biggest first."""
        return sorted(self.parts.items(), key=lambda item: -item[1])[:count]

    def describe(self, count: int = 3) -> str:
        """``"1.2 GB (recorded edges 0.8 GB, ...)"``: the total and its biggest parts."""
        parts = ", ".join(f"{name} {format_bytes(size)}" for name, size in self.largest(count))
        return f"{format_bytes(self.total)} ({parts})"


def cond_row_bytes(cond: Any) -> int:
    """Bytes per prompt row of a conditioning pytree (its tensors have the prompt dimension first)."""
    tensors = [t for t in pytree.tree_leaves(cond) if isinstance(t, torch.Tensor)]
    rows = {t.shape[0] for t in tensors}
    if len(rows) > 1:
        raise ValueError(f"cond tensors disagree on the number of prompt rows: {sorted(rows)}")
    if not tensors or rows == {0}:
        return 0
    return sum(t.numel() * t.element_size() for t in tensors) // rows.pop()


def rollout_memory(
    spec: TreeSpec,
    num_prompts: int,
    latent_shape: tuple[int, ...],
    latent_dtype: torch.dtype,
    *,
    cond_bytes: int = 0,
    cfg: bool = False,
    max_batch: int = 64,
) -> RolloutMemory:
    """Peak bytes of ``rollout(..., spec, cond, noise)`` for ``num_prompts`` prompts."""
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    if cond_bytes < 0:
        raise ValueError(f"cond_bytes must be >= 0, got {cond_bytes}")
    P = num_prompts
    numel = 1
    for size in latent_shape:
        numel *= int(size)
    elem = torch.empty((), dtype=latent_dtype).element_size()
    lat = numel * elem  # bytes of one latent
    sources = sum(spec.nodes_at(t) for t in range(spec.num_steps) if spec.is_stochastic(t))  # per prompt
    edges = spec.num_edges()  # per prompt
    leaves = spec.num_leaves  # per prompt, and the widest frontier
    call_rows = min(max_batch, leaves * P)
    return RolloutMemory(
        {
            "recorded sources": sources * P * lat,
            "recorded edges": edges * P * lat,
            "leaf latents": leaves * P * lat,
            "final concatenation": (sources + edges) * P * lat,
            "conditioning per node": (leaves * P + P) * cond_bytes,
            "step workspace": leaves * P * numel * (2 * elem + _STEP_FLOAT32_COPIES * FLOAT32_BYTES),
            "model call input": call_rows * (lat + cond_bytes) * (2 if cfg else 1),
        }
    )


def format_bytes(size: float) -> str:
    """``1234567`` -> ``"1.23 MB"`` (decimal units, three significant digits)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{int(size)} B"


# ------------------------------------------------------------------------------------ training


class SavedTensors(NamedTuple):
    """What autograd saves for one forward (:func:`count_saved_tensors`), in bytes."""

    saved: int  # distinct storages saved for the backward, parameters left out (checkpointing off)
    largest: int  # the largest of them
    regions: tuple[tuple[int, int], ...] = ()  # (inputs, saved) of each checkpointed region

    def activations(self, checkpointing: bool) -> int:
        """Bytes kept for the backward, with or without gradient checkpointing (which keeps a
        region's inputs instead of what it saves, and recomputes one region at a time)."""
        if not checkpointing or not self.regions:
            return self.saved
        inside = sum(saved for _, saved in self.regions)
        inputs = sum(size for size, _ in self.regions)
        return self.saved - inside + inputs + max(saved for _, saved in self.regions)

    def per_row(self, checkpointing: bool) -> int:
        """Activations plus the backward workspace (see the module docstring)."""
        return self.activations(checkpointing) + 2 * self.largest


_CHECKPOINT_OPTIONS = ("use_reentrant", "context_fn", "determinism_check", "debug", "preserve_rng_state", "early_stop")


@contextmanager
def _regions_run_directly(record: Callable[[list[Any], Callable[[], Any]], Any]) -> Iterator[None]:
    """While open, ``torch.utils.checkpoint.checkpoint(fn, *args)`` (diffusers' gradient
    checkpointing calls it through the module) runs ``fn(*args)`` at once through
    ``record(inputs, run)``: a checkpointed region's saved tensors would otherwise hide from the
    outer hooks behind checkpoint's own, and the probe would not see what the region costs."""
    original = torch_checkpoint.checkpoint

    def direct(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        for option in _CHECKPOINT_OPTIONS:
            kwargs.pop(option, None)
        return record(pytree.tree_leaves((args, kwargs)), lambda: function(*args, **kwargs))

    torch_checkpoint.checkpoint = direct
    try:
        yield
    finally:
        torch_checkpoint.checkpoint = original


def count_saved_tensors(forward: Callable[[], Any], params: Iterable[nn.Parameter | torch.Tensor]) -> SavedTensors:
    """Run ``forward()`` with grad and count what autograd saves for its backward: distinct storages, leaving out those
    of ``params`` (the model's parameters and buffers, resident anyway)."""
    # (a sharded parameter, a tensor subclass, has no storage of its own to compare with)
    resident = {p.untyped_storage().data_ptr() for p in params if type(p) in (torch.Tensor, nn.Parameter)}
    seen: dict[int, StorageWeakRef] = {}  # storage address -> the storage counted there, while it lives
    total = largest = 0
    regions: list[tuple[int, int]] = []

    def pack(t: torch.Tensor) -> None:
        nonlocal total, largest
        if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter):
            return None
        if type(t) is not torch.Tensor:  # a tensor subclass (e.g. DTensor): its own size, not deduplicated
            size = t.numel() * t.element_size()
        else:
            storage = t.untyped_storage()
            address = storage.data_ptr()
            if address in resident:
                return None
            counted = seen.get(address)
            if counted is not None and not counted.expired():
                return None  # saved again (x of q, k and v): kept once
            seen[address] = StorageWeakRef(storage)
            size = storage.nbytes()
        total += size
        largest = max(largest, size)
        return None

    kept_inputs: dict[int, StorageWeakRef] = {}  # what checkpointing would keep: each storage once

    def record(inputs: list[Any], run: Callable[[], Any]) -> Any:
        size = 0
        for t in inputs:
            if type(t) is not torch.Tensor:  # not a plain tensor: a parameter (resident), or not kept alone
                continue
            storage = t.untyped_storage()
            address = storage.data_ptr()
            counted = kept_inputs.get(address)
            if address in resident or (counted is not None and not counted.expired()):
                continue
            kept_inputs[address] = StorageWeakRef(storage)
            size += storage.nbytes()
        before = total
        out = run()
        regions.append((size, total - before))
        return out

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None)
    with torch.enable_grad(), hooks, _regions_run_directly(record):
        forward()
    return SavedTensors(total, largest, tuple(regions))


class TrainingMemory(NamedTuple):
    """Bytes of the training pass: ``per_parent`` for each parent of a micro-batch (its forward and
    backward, CFG rows included), plus ``fixed`` parts (the rows of the module docstring's table)."""

    per_parent: int
    fixed: dict[str, int]

    def total(self, parents: int) -> int:
        return parents * self.per_parent + sum(self.fixed.values())

    def parents_that_fit(self, limit: float) -> int:
        """The most parents per forward whose total stays within ``limit`` bytes (0: not even one)."""
        room = limit - sum(self.fixed.values())
        if room < self.per_parent:
            return 0
        return int(room // self.per_parent) if self.per_parent > 0 else 2**62

    def describe(self, parents: int) -> str:
        """``"1.2 GB (4 parents x 250 MB, gradients 180 MB, ...)"``."""
        parts = [f"{parents} parent(s) x {format_bytes(self.per_parent)}"]
        parts += [f"{name} {format_bytes(size)}" for name, size in self.fixed.items() if size]
        return f"{format_bytes(self.total(parents))} ({', '.join(parts)})"


def held_tree_bytes(
    spec: TreeSpec, num_prompts: int, latent_shape: tuple[int, ...], latent_dtype: torch.dtype, *, cond_bytes: int = 0
) -> int:
    """Bytes of the rollout's tree that the training pass holds: sources, edges, leaf latents and
    the prompts' conditioning (the rollout's workspace is gone by then)."""
    parts = rollout_memory(spec, num_prompts, latent_shape, latent_dtype, cond_bytes=cond_bytes).parts
    return parts["recorded sources"] + parts["recorded edges"] + parts["leaf latents"] + num_prompts * cond_bytes


def training_memory(
    saved: SavedTensors, *, checkpointing: bool, trainable_bytes: int, optimizer_state_bytes: int, held_bytes: int
) -> TrainingMemory:
    """The training pass's memory from one parent's :func:`count_saved_tensors` (see the module
    docstring): ``trainable_bytes`` of the trained parameters (their gradients),
    ``optimizer_state_bytes`` still to be allocated, ``held_bytes`` of the rollout's tree."""
    return TrainingMemory(
        saved.per_row(checkpointing),
        {"gradients": trainable_bytes, "optimizer state": optimizer_state_bytes, "the rollout's tree": held_bytes},
    )


def shard_elements(shape: tuple[int, ...], shards: int) -> int:
    """Elements of a tensor of ``shape`` on the rank holding the most of it when FSDP2 shards it ``shards`` ways:
    dim 0 in ``shards`` chunks of ceil(rows / shards) rows (``torch.chunk``'s split), the first rank's the largest."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    if not shape:
        return 1
    rows = -(-shape[0] // shards)  # ceil
    return rows * math.prod(shape[1:])


def parents_per_rank(spec: TreeSpec, num_prompts: int) -> int:
    """Sources (parents) of one rank's rollout: every training forward row there is to train on."""
    return num_prompts * sum(spec.nodes_at(t) for t in range(spec.num_steps) if spec.is_stochastic(t))


def largest_micro_batch(parents: int, micro_batches: int) -> int:
    """Parents of the largest of ``micro_batches`` near-equal micro-batches of ``parents``
    (:func:`~lit_treegrpo.core.rollout.source_minibatches`)."""
    return math.ceil(parents / max(micro_batches, 1))


__all__ = [
    "RolloutMemory",
    "SavedTensors",
    "TrainingMemory",
    "cond_row_bytes",
    "count_saved_tensors",
    "format_bytes",
    "held_tree_bytes",
    "shard_elements",
    "largest_micro_batch",
    "parents_per_rank",
    "rollout_memory",
    "training_memory",
]
