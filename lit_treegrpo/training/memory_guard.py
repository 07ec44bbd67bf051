"""The memory guard, in one place with one entry point (:meth:`MemoryCheck.check`, once per fit before the first
rollout): refuse a tree whose rollout cannot fit in memory, measure what one parent of the training pass costs on
the real model, and size the training forwards so that a micro-batch too large runs as several (gradients
accumulated), refusing a run where not even one parent fits."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from ..core.memory import (
    SavedTensors,
    TrainingMemory,
    cond_row_bytes,
    count_saved_tensors,
    format_bytes,
    held_tree_bytes,
    largest_micro_batch,
    parents_per_rank,
    rollout_memory,
    shard_elements,
    training_memory,
)
from ..core.rollout import index_cond
from ..core.spec import TreeSpec

AnyRank = Callable[[bool], bool]


@dataclass(frozen=True)
class MemoryGuard:
    """``--model.memory_guard``: check before the first rollout that the tree and its training
    pass fit in memory (see the module docstring)."""

    enabled: bool = True
    """Run the checks (false: start the rollout without estimating)."""
    fraction: float = 0.9
    """Refuse when the estimate exceeds this fraction of the available memory; the rest is
    headroom for the model's activations, which the estimate does not count."""

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"memory_guard.fraction must be in (0, 1], got {self.fraction}")


class RolloutMemoryError(ValueError):
    """The memory guard refused a tree that cannot fit (a configuration error)."""


class TrainingMemoryError(ValueError):
    """The memory guard refused a training pass that cannot fit even one parent per forward."""


class MemoryCheck:
    """One fit's memory guard: :meth:`check` once, then :meth:`chunks` for each epoch's micro-batches.

    Args:
        options: ``--model.memory_guard``.
        available_bytes: the memory to compare with instead of measuring it (tests, benchmarks).
        max_train_parents: the most parents per training forward whatever the estimate (tests).
    """

    def __init__(
        self, options: MemoryGuard, *, available_bytes: int | None = None, max_train_parents: int | None = None
    ) -> None:
        self.options = options
        self.available_bytes = available_bytes
        self.max_train_parents = max_train_parents
        self.cap: int | None = max_train_parents  # the most parents per forward; None: no limit
        self.fits: int | None = None  # the parents per forward that fit by the estimate
        self.memory: TrainingMemory | None = None  # that estimate
        self.limit = ""  # the budget it was compared with, for the announcement
        self.checked = False
        self.announced = False
        #: FSDP2: one reduce-scatter per optimizer step (True) or one per micro-batch; decided by :meth:`check`
        self.defer_sync = True

    @property
    def active(self) -> bool:
        """Whether micro-batches may be split (the same on every rank: the options decide)."""
        return self.options.enabled or self.max_train_parents is not None

    def available(self, device: torch.device, processes: int) -> tuple[int | None, str]:
        """(bytes available to this rank, where the number comes from)."""
        if self.available_bytes is not None:
            return self.available_bytes, "as given"
        return available_memory(device, processes)

    def check(
        self,
        adapter: Any,
        spec: TreeSpec,
        cond: Any,
        noise: Tensor,
        num_prompts: int,
        *,
        max_batch: int,
        micro_batches: int,
        optimizer: torch.optim.Optimizer | None,
        processes: int,
        any_rank: AnyRank,
    ) -> None:
        """Check a rollout of ``num_prompts`` prompts on this rank and size its training forwards
        (``cond`` / ``noise``: one prompt's conditioning rows and root noise [n, *S]; ``micro_batches``:
        how many one inner epoch splits into when every edge is kept). Every rank decides together."""
        self.checked = True
        if not self.options.enabled:
            return
        available = self.available(adapter.device, processes)
        estimate = rollout_memory(
            spec,
            num_prompts,
            tuple(noise.shape[1:]),
            noise.dtype,
            cond_bytes=cond_row_bytes(cond),
            cfg=adapter.do_cfg,
            max_batch=max_batch,
        )
        self._refuse_rollout(estimate, spec, num_prompts, available, any_rank)
        self._size_training(adapter, spec, cond, noise, num_prompts, micro_batches, optimizer, available, any_rank)

    def _refuse_rollout(
        self, estimate: Any, spec: TreeSpec, num_prompts: int, available: tuple[int | None, str], any_rank: AnyRank
    ) -> None:
        available_bytes, where = available
        if available_bytes is None:
            warnings.warn(
                f"memory guard: the available memory is {where}, so the rollout's estimated "
                f"{estimate.describe()} is not checked",
                stacklevel=4,
            )
        limit = None if available_bytes is None else available_bytes * self.options.fraction
        refuse = limit is not None and estimate.total > limit
        if not any_rank(refuse):
            return
        if not refuse:
            raise RolloutMemoryError("memory guard: another data-parallel rank cannot fit the rollout; see its message")
        raise RolloutMemoryError(
            f"memory guard: one rollout needs about {estimate.describe()} for {num_prompts} prompts x "
            f"{spec.num_leaves} leaves on this rank, but {format_bytes(available_bytes)} is available ({where}; "
            f"x {self.options.fraction} = {format_bytes(limit)}); lower --data.batch_size, --model.rollout.max_batch, "
            "the branching or num_trees, or set --model.memory_guard.enabled false to skip this check"
        )

    def _size_training(
        self,
        adapter: Any,
        spec: TreeSpec,
        cond: Any,
        noise: Tensor,
        num_prompts: int,
        micro_batches: int,
        optimizer: torch.optim.Optimizer | None,
        available: tuple[int | None, str],
        any_rank: AnyRank,
    ) -> None:
        saved = probe_training(adapter, spec, cond, noise)
        params = adapter.trainable_parameters()
        gradients, state = training_state_bytes(params, optimizer)
        memory = training_memory(
            saved,
            checkpointing=adapter.gradient_checkpointing,
            trainable_bytes=gradients,
            optimizer_state_bytes=state,
            held_bytes=held_tree_bytes(
                spec, num_prompts, tuple(noise.shape[1:]), noise.dtype, cond_bytes=cond_row_bytes(cond)
            ),
        )
        largest = largest_micro_batch(parents_per_rank(spec, num_prompts), micro_batches)
        available_bytes, where = available
        memory = self._decide_gradient_sync(memory, params, available_bytes, any_rank)
        if available_bytes is None:
            warnings.warn(
                f"memory guard: the available memory is {where}, so the training pass's estimated "
                f"{memory.describe(largest)} is not checked",
                stacklevel=4,
            )
            self.fits = None
        else:
            self.fits = memory.parents_that_fit(available_bytes * self.options.fraction)
        refuse = self.fits == 0
        if any_rank(refuse):
            if not refuse:
                raise TrainingMemoryError(
                    "memory guard: another data-parallel rank cannot fit the training pass; see its message"
                )
            budget = available_bytes * self.options.fraction
            raise TrainingMemoryError(
                f"memory guard: the training pass cannot fit even one parent per forward: it needs about "
                f"{memory.describe(1)} on this rank, but {format_bytes(available_bytes)} is available ({where}; "
                f"x {self.options.fraction} = {format_bytes(budget)}); {_fixes(adapter, saved)}, or set "
                "--model.memory_guard.enabled false to skip this check"
            )
        self.memory = memory
        caps = [cap for cap in (self.fits, self.max_train_parents) if cap is not None]
        self.cap = min(caps) if caps else None
        if available_bytes is not None:
            limit = available_bytes * self.options.fraction
            self.limit = f"{format_bytes(limit)} ({where} x {self.options.fraction})"
        if self.cap is not None and largest > self.cap:
            self.announce(largest)

    def _decide_gradient_sync(
        self, memory: TrainingMemory, params: list[nn.Parameter], available: int | None, any_rank: AnyRank
    ) -> TrainingMemory:
        """Under FSDP2, whether the micro-batches of one optimizer step share one reduce-scatter (:attr:`defer_sync`):
        they do when every rank can hold the unsharded gradients that accumulate until then; otherwise each
        micro-batch reduce-scatters (FSDP2's memory-saving default), said once. The estimate it returns counts
        what the choice holds."""
        unsharded = unsharded_gradient_bytes(params)
        if not unsharded:  # nothing sharded: DDP and one device defer through Lightning's no_sync as they are
            self.defer_sync = True
            return memory
        deferred = TrainingMemory(memory.per_parent, {**memory.fixed, "unsharded gradients": unsharded})
        fits = available is None or deferred.total(1) <= available * self.options.fraction
        self.defer_sync = not any_rank(not fits)
        if self.defer_sync:
            return deferred
        rank_zero_info(
            f"memory guard: FSDP2 reduce-scatters the gradients after every micro-batch: holding them unsharded until "
            f"the optimizer step ({format_bytes(unsharded)} on this rank) does not fit beside the rest "
            f"({deferred.describe(1)})"
        )
        return memory

    def chunks(self, parents: list[int]) -> list[int]:
        """Forwards for micro-batches of ``parents`` parents each on this rank: one while they fit."""
        if self.cap is None:
            return [1] * len(parents)
        return [max(1, math.ceil(count / self.cap)) for count in parents]

    def announce(self, parents: int) -> None:
        """Say once per fit that micro-batches are split, and why."""
        if self.announced or self.cap is None:
            return
        self.announced = True
        if self.fits is not None and self.memory is not None and parents > self.fits:
            why = f" needs about {self.memory.describe(parents)}, more than {self.limit}, so it"
        else:
            why = f" (at most {self.cap} parents per forward)"
        rank_zero_info(
            f"memory guard: a training micro-batch of {parents} parents{why} runs as {math.ceil(parents / self.cap)} "
            f"forwards of at most {self.cap} parent(s), gradients accumulated (the same update up to float rounding)"
        )


def _fixes(adapter: Any, saved: SavedTensors) -> str:
    """The options that shrink one parent's training memory, for the refusal."""
    fixes = []
    if not adapter.gradient_checkpointing and saved.activations(True) < saved.activations(False):
        fixes.append(
            "turn on --model.adapter.init_args.gradient_checkpointing (about "
            f"{format_bytes(saved.per_row(True))} per parent instead of {format_bytes(saved.per_row(False))})"
        )
    if adapter.lora is None:
        fixes.append("train LoRA (--model.adapter.init_args.lora) instead of every weight")
    fixes.append("lower --data.batch_size, the branching or num_trees (the rollout's tree is held while training)")
    return "; ".join(fixes)


# ------------------------------------------------------------------------------- what is measured
def mem_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (Linux), else psutil's, else None."""
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the file counts kB
    try:
        import psutil
    except ImportError:  # optional: without it (and without /proc) the guard cannot measure
        return None
    return int(psutil.virtual_memory().available)


def available_memory(device: torch.device, processes: int = 1) -> tuple[int | None, str]:
    """(bytes available to one process on ``device``, where the number comes from): free memory on
    CUDA; on CPU MemAvailable shared by the ``processes`` of this node; None where unmeasurable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0], f"free on {device}"
    if device.type != "cpu":
        return None, f"not measured on {device.type}"
    available = mem_available()
    if available is None:
        return None, "MemAvailable unknown"
    return available // processes, f"MemAvailable / {processes} process(es) of this node"


@contextlib.contextmanager
def _checkpoint_regions_known(denoiser: nn.Module | None) -> Iterator[None]:
    """Gradient checkpointing switched on while the probe runs (where supported and off), so that
    the probe sees the regions it would checkpoint and can say what checkpointing would save."""
    supported = getattr(denoiser, "_supports_gradient_checkpointing", False) and hasattr(
        denoiser, "disable_gradient_checkpointing"
    )
    if not supported or getattr(denoiser, "is_gradient_checkpointing", True):
        yield
        return
    denoiser.enable_gradient_checkpointing()
    try:
        yield
    finally:
        denoiser.disable_gradient_checkpointing()


def probe_training(adapter: Any, spec: TreeSpec, cond: Any, noise: Tensor) -> SavedTensors:
    """What autograd saves for one parent of the training pass, counted on the real model: the model call on one row at
    the tree's first stochastic step and its children's log-probs (the most any parent of ``spec`` has)."""
    stochastic = [t for t in range(spec.num_steps) if spec.is_stochastic(t)]
    children = max(spec.children_at(t) for t in stochastic)
    x = noise[:1]  # [1, *S]
    step = torch.full((1,), stochastic[0], dtype=torch.long, device=x.device)  # [1]
    row = index_cond(cond, torch.zeros(1, dtype=torch.long, device=x.device))
    group = torch.zeros(children, dtype=torch.long, device=x.device)  # [k] every child's parent: row 0

    def forward() -> None:
        out = adapter.predict(x, step, row)  # [1, *S]
        adapter.step(out[group], x[group], step[group], stochastic=True, prev_sample=x[group])

    try:
        with contextlib.ExitStack() as stack:  # every denoiser: Wan2.2 A14B's step may be on either expert
            for model in adapter.denoisers().values():
                stack.enter_context(_checkpoint_regions_known(model))
            return count_saved_tensors(forward, [*adapter.parameters(), *adapter.buffers()])
    finally:
        _reshard_fsdp(adapter)


def _reshard_fsdp(module: nn.Module) -> None:
    """Put FSDP2-sharded modules back into their sharded state after a forward with no backward
    (FSDP2 keeps the root's parameters gathered, and a checkpoint restored next would fail)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed: nothing can be sharded
        return
    for submodule in module.modules():
        if isinstance(submodule, FSDPModule):
            submodule.reshard()


def held_elements(p: Tensor, shards: int = 1) -> int:
    """Elements of ``p`` this rank holds: an FSDP2 parameter's (a DTensor's) local shard, whose ``numel()`` is the
    global size; a plain tensor whole, or as its largest shard when ``shards`` > 1 says how FSDP2 would split it
    (the estimate of a sharded run made on one process, e.g. on the meta device)."""
    local = getattr(p, "to_local", None)
    if local is not None:
        return local().numel()
    return p.numel() if shards == 1 else shard_elements(tuple(p.shape), shards)


def training_state_bytes(
    params: list[nn.Parameter], optimizer: torch.optim.Optimizer | None, shards: int = 1
) -> tuple[int, int]:
    """(gradient bytes, optimizer-state bytes still to allocate) that this rank holds for ``params``: one rule for
    one device, DDP (whole tensors) and FSDP2 (local shards; see :func:`held_elements`)."""
    gradients = sum(held_elements(p, shards) * p.element_size() for p in params)
    return gradients, optimizer_state_bytes(optimizer, params, shards)


def unsharded_gradient_bytes(params: list[nn.Parameter]) -> int:
    """Bytes of the whole (unsharded) gradients of the FSDP2-sharded ``params``, which accumulate on every rank while
    gradient sync is deferred over micro-batches (0 when nothing is sharded)."""
    return sum(p.numel() * p.element_size() for p in params if hasattr(p, "to_local"))


def optimizer_state_bytes(optimizer: torch.optim.Optimizer | None, params: list[nn.Parameter], shards: int = 1) -> int:
    """Bytes ``optimizer`` will allocate on this rank for those of ``params`` it holds no state for yet (their
    :func:`held_elements`): Adam's two moments (three with amsgrad), SGD's momentum buffer if any, two per
    parameter otherwise."""
    groups = optimizer.param_groups if optimizer is not None else [{"params": params}]
    size = 0
    for group in groups:
        if isinstance(optimizer, torch.optim.SGD):
            copies = 1 if group.get("momentum", 0) else 0
        elif isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
            copies = 3 if group.get("amsgrad", False) else 2
        else:
            copies = 2
        size += copies * sum(
            held_elements(p, shards) * p.element_size()
            for p in group["params"]
            if optimizer is None or not optimizer.state.get(p)
        )
    return size
