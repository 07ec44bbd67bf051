"""The memory guard: before a fit draws its first batch, estimate the rollout's peak memory from the
tree's shape (:func:`lit_treegrpo.core.memory.rollout_memory`) and refuse a tree that cannot fit,
naming the options that shrink it; then measure what one parent of the training pass costs
(:func:`~lit_treegrpo.training.memory_probe.probe_training`) and work out how many parents a training forward can take: a larger
micro-batch is split into several forwards with gradients accumulated, and a run that cannot fit
even one is refused. :class:`MemoryGuard` holds the options, :class:`RolloutGuard` and
:class:`TrainingGuard` the checks of one fit (once: before the first batch is drawn when the data
come from a :class:`~lit_treegrpo.data.PromptDataModule`, else at the first training step). What
they measure (the memory available, one parent's saved tensors, the optimizer state) comes from
:mod:`lit_treegrpo.training.memory_probe`."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from ..core.memory import (
    SavedTensors,
    TrainingMemory,
    cond_row_bytes,
    format_bytes,
    held_tree_bytes,
    largest_micro_batch,
    parents_per_rank,
    rollout_memory,
    training_memory,
)
from ..core.spec import TreeSpec
from .memory_probe import available_memory, optimizer_state_bytes, probe_training

if TYPE_CHECKING:
    from ..models.base import DiffusionAdapter


@dataclass(frozen=True)
class MemoryGuard:
    """Before the first batch is drawn, estimate its peak memory from the tree's shape
    (:func:`lit_treegrpo.core.memory.rollout_memory`) and refuse a run that cannot fit; measure what
    one parent of the training pass costs (:func:`lit_treegrpo.training.memory_probe.probe_training`) and
    split a training micro-batch that does not fit into several forwards, refusing a run where
    not even one parent fits."""

    enabled: bool = True
    """Run the check (false: start the rollout without estimating)."""
    fraction: float = 0.9
    """Refuse when the estimate exceeds this fraction of the available memory; the rest is
    headroom for the model's activations, which the estimate does not count."""
    available_gb: float | None = None
    """Memory to compare against, in GB (1e9 bytes); null measures it: free device memory on CUDA,
    MemAvailable of /proc/meminfo shared by the processes of this node on CPU."""
    max_train_parents: int | None = None
    """The most parents (rows of a training forward, two each with CFG) one forward and backward of
    the training pass takes: a micro-batch with more runs as several, gradients accumulated, for the
    same update up to float rounding. Null: as many as the estimate lets fit (all of them while
    they fit, which leaves the computation as it is). Applies with ``enabled: false`` too."""

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"memory_guard.fraction must be in (0, 1], got {self.fraction}")
        if self.available_gb is not None and self.available_gb <= 0:
            raise ValueError(f"memory_guard.available_gb must be > 0 or null, got {self.available_gb}")
        if self.max_train_parents is not None and self.max_train_parents < 1:
            raise ValueError(f"memory_guard.max_train_parents must be >= 1 or null, got {self.max_train_parents}")


class RolloutMemoryError(ValueError):
    """The memory guard refused a tree that cannot fit (a configuration error)."""


class TrainingMemoryError(ValueError):
    """The memory guard refused a training pass that cannot fit even one parent per forward."""


def memory_for_rank(guard: MemoryGuard, device: torch.device, processes: int) -> tuple[int | None, str]:
    """(bytes available to this rank, where the number comes from): ``guard.available_gb`` when
    given, else measured on ``device`` (on CPU shared by the ``processes`` of this node)."""
    if guard.available_gb is not None:
        return int(guard.available_gb * 1e9), "--model.memory_guard.available_gb"
    return available_memory(device, processes=processes)


def check_rollout_memory(
    guard: MemoryGuard,
    spec: TreeSpec,
    cond: Any,
    noise: Tensor,
    num_prompts: int,
    *,
    cfg: bool,
    max_batch: int = 64,
    available: tuple[int | None, str],
    any_rank: Callable[[bool], bool],
) -> None:
    """Raise :class:`RolloutMemoryError` when the rollout of ``num_prompts`` prompts on this rank
    (latents shaped like a row of ``noise`` [n, *S], conditioning rows like ``cond``'s) needs more
    than ``guard.fraction`` of the ``available`` memory on this rank or, through ``any_rank``, on
    another one: every rank decides together, so none is left waiting in a collective. Memory that
    cannot be measured is warned about, not checked."""
    estimate = rollout_memory(
        spec,
        num_prompts,
        tuple(noise.shape[1:]),
        noise.dtype,
        cond_bytes=cond_row_bytes(cond),
        cfg=cfg,
        max_batch=max_batch,
    )
    available_bytes, where = available
    if available_bytes is None:
        warnings.warn(
            f"memory guard: the available memory is {where}, so the rollout's estimated "
            f"{estimate.describe()} is not checked; give --model.memory_guard.available_gb",
            stacklevel=3,
        )
    limit = None if available_bytes is None else available_bytes * guard.fraction
    refuse = limit is not None and estimate.total > limit
    if not any_rank(refuse):
        return
    if not refuse:
        raise RolloutMemoryError("memory guard: another data-parallel rank cannot fit the rollout; see its message")
    raise RolloutMemoryError(
        f"memory guard: one rollout needs about {estimate.describe()} for {num_prompts} prompts x "
        f"{spec.num_leaves} leaves on this rank, but {format_bytes(available_bytes)} is available ({where}; "
        f"x {guard.fraction} = {format_bytes(limit)}); lower --data.batch_size, --model.rollout.max_batch, "
        "the branching or num_trees, or set --model.memory_guard.enabled false to skip this check"
    )


class RolloutGuard:
    """The memory guard of one fit: :func:`check_rollout_memory` once, before the first batch.

    Args:
        settings: the guard's options (``--model.memory_guard``).
        max_batch: most nodes per model call of the rollouts it guards (``--model.rollout``).
    """

    def __init__(self, settings: MemoryGuard, max_batch: int = 64) -> None:
        self.settings = settings
        self.max_batch = max_batch
        self.checked = False

    def available(self, device: torch.device, processes: int) -> tuple[int | None, str]:
        """(bytes available to this rank, where the number comes from): see :func:`memory_for_rank`."""
        return memory_for_rank(self.settings, device, processes)

    def check(
        self,
        adapter: Any,
        spec: TreeSpec,
        cond: Any,
        noise: Tensor,
        num_prompts: int,
        *,
        processes: int,
        any_rank: Callable[[bool], bool],
    ) -> None:
        """Check a rollout of ``num_prompts`` prompts on this rank (``cond`` / ``noise``: one
        prompt's conditioning rows and root noise [n, *S] or more) unless disabled."""
        if self.settings.enabled:
            available = self.available(adapter.device, processes)
            check_rollout_memory(
                self.settings,
                spec,
                cond,
                noise,
                num_prompts,
                cfg=adapter.do_cfg,
                max_batch=self.max_batch,
                available=available,
                any_rank=any_rank,
            )
        self.checked = True

    def before_data(
        self, adapter: Any, datamodule: Any, spec: TreeSpec, *, processes: int, any_rank: Callable[[bool], bool]
    ) -> None:
        """At the start of a fit, before the first batch is drawn (and before the sanity check's
        sampling): the prompts per rank come from the datamodule, the conditioning's size from one
        training prompt. Without a :class:`~lit_treegrpo.data.PromptDataModule` the check waits for
        the first training step (:meth:`check`, when :attr:`checked` is still false)."""
        self.checked = False
        if not self.settings.enabled or not hasattr(datamodule, "per_rank_batch_size"):
            return
        cond, noise = one_prompt(adapter, datamodule)
        self.check(adapter, spec, cond, noise, datamodule.per_rank_batch_size(), processes=processes, any_rank=any_rank)


def one_prompt(adapter: Any, datamodule: Any) -> tuple[Any, Tensor]:
    """(conditioning, root noise [1, *S]) of the datamodule's first training prompt: what the
    guards measure before any batch is drawn (the noise from its own generator: no draw of the run's)."""
    with torch.no_grad():
        cond = adapter.encode_prompts(datamodule.train_set.prompts[:1])
        noise = adapter.initial_noise(1, torch.Generator(adapter.device).manual_seed(0))  # [1, *S]
    return cond, noise


# ------------------------------------------------------------------------------- training pass
def check_training_memory(
    guard: MemoryGuard,
    memory: TrainingMemory,
    largest: int,
    *,
    available: tuple[int | None, str],
    any_rank: Callable[[bool], bool],
    fixes: str,
) -> int | None:
    """The most parents one training forward can take on this rank by the estimate (None: the memory
    cannot be measured). Raise :class:`TrainingMemoryError` when not even one fits in
    ``guard.fraction`` of the ``available`` memory, here or, through ``any_rank``, on another rank. ``largest``: parents of the largest
    micro-batch (in the warning when the memory cannot be measured); ``fixes``: the options that
    would make a parent fit, for the message."""
    available_bytes, where = available
    if available_bytes is None:
        warnings.warn(
            f"memory guard: the available memory is {where}, so the training pass's estimated "
            f"{memory.describe(largest)} is not checked; give --model.memory_guard.available_gb",
            stacklevel=3,
        )
        fits = None
    else:
        fits = memory.parents_that_fit(available_bytes * guard.fraction)
    refuse = fits == 0
    if any_rank(refuse):
        if not refuse:
            raise TrainingMemoryError(
                "memory guard: another data-parallel rank cannot fit the training pass; see its message"
            )
        raise TrainingMemoryError(
            f"memory guard: the training pass cannot fit even one parent per forward: it needs about "
            f"{memory.describe(1)} on this rank, but {format_bytes(available_bytes)} is available ({where}; "
            f"x {guard.fraction} = {format_bytes(available_bytes * guard.fraction)}); {fixes}, or set "
            "--model.memory_guard.enabled false to skip this check"
        )
    return fits


class TrainingGuard:
    """The training pass's memory guard of one fit. Before the first rollout, :meth:`check` probes one
    parent (:func:`probe_training`), sets :attr:`cap`, the most parents per training forward on this
    rank, and refuses a run where not even one fits; the module then runs a micro-batch of more
    parents as :meth:`chunks` forwards with gradients accumulated. With ``max_train_parents`` the cap
    is that many parents at most, with the check disabled too.

    Args:
        settings: the guard's options (``--model.memory_guard``).
    """

    def __init__(self, settings: MemoryGuard) -> None:
        self.settings = settings
        self.cap: int | None = settings.max_train_parents  # the most parents per forward; None: no limit
        self.fits: int | None = None  # the parents per forward that fit by the last check's estimate
        self.memory: TrainingMemory | None = None  # that estimate
        self.limit = ""  # the budget it was compared with, for the announcement
        self.checked = False
        self.announced = False

    @property
    def active(self) -> bool:
        """Whether micro-batches may be split (the same on every rank: the options decide)."""
        return self.settings.enabled or self.settings.max_train_parents is not None

    def check(
        self,
        adapter: DiffusionAdapter,
        spec: TreeSpec,
        cond: Any,
        noise: Tensor,
        num_prompts: int,
        *,
        micro_batches: int,
        optimizer: torch.optim.Optimizer | None,
        processes: int,
        any_rank: Callable[[bool], bool],
    ) -> None:
        """Probe one parent and set :attr:`cap` (``cond`` / ``noise``: one prompt's conditioning rows
        and root noise [n, *S], as :meth:`RolloutGuard.check` takes them; ``micro_batches``: how many
        the kept edges of one inner epoch split into when pruning keeps every edge)."""
        self.checked = True
        if not self.settings.enabled:
            return
        saved = probe_training(adapter, spec, cond, noise)
        checkpointing = adapter.gradient_checkpointing
        params = adapter.trainable_parameters()
        memory = training_memory(
            saved,
            checkpointing=checkpointing,
            trainable_bytes=sum(p.numel() * p.element_size() for p in params),
            optimizer_state_bytes=optimizer_state_bytes(optimizer, params),
            held_bytes=held_tree_bytes(
                spec, num_prompts, tuple(noise.shape[1:]), noise.dtype, cond_bytes=cond_row_bytes(cond)
            ),
        )
        largest = largest_micro_batch(parents_per_rank(spec, num_prompts), micro_batches)
        available = memory_for_rank(self.settings, adapter.device, processes)
        self.fits = check_training_memory(
            self.settings,
            memory,
            largest,
            available=available,
            any_rank=any_rank,
            fixes=_fixes(adapter, saved, checkpointing),
        )
        self.memory = memory
        caps = [cap for cap in (self.fits, self.settings.max_train_parents) if cap is not None]
        self.cap = min(caps) if caps else None
        if available[0] is not None:
            limit = available[0] * self.settings.fraction
            self.limit = f"{format_bytes(limit)} ({available[1]} x {self.settings.fraction})"
        if self.cap is not None and largest > self.cap:
            self.announce(largest)

    def before_data(
        self,
        adapter: Any,
        datamodule: Any,
        spec: TreeSpec,
        *,
        micro_batches: Callable[[int], int],
        optimizer: torch.optim.Optimizer | None,
        processes: int,
        any_rank: Callable[[bool], bool],
    ) -> None:
        """:meth:`check` at the start of a fit, before the first batch is drawn, as
        :meth:`RolloutGuard.before_data` (``micro_batches``: of the prompts per rank)."""
        self.checked = False
        if not self.settings.enabled or not hasattr(datamodule, "per_rank_batch_size"):
            return
        cond, noise = one_prompt(adapter, datamodule)
        num_prompts = datamodule.per_rank_batch_size()
        self.check(
            adapter,
            spec,
            cond,
            noise,
            num_prompts,
            micro_batches=micro_batches(num_prompts),
            optimizer=optimizer,
            processes=processes,
            any_rank=any_rank,
        )

    def chunks(self, parents: list[int]) -> list[int]:
        """Forwards for micro-batches of ``parents`` parents each on this rank: one while they fit."""
        if self.cap is None:
            return [1] * len(parents)
        return [max(1, math.ceil(count / self.cap)) for count in parents]

    def announce(self, parents: int) -> None:
        """Say once per fit that micro-batches are split, why, and which option sets the limit."""
        if self.announced or self.cap is None:
            return
        self.announced = True
        if self.fits is not None and self.memory is not None and parents > self.fits:
            why = f" needs about {self.memory.describe(parents)}, more than {self.limit}, so it"
        else:
            why = f" (--model.memory_guard.max_train_parents {self.settings.max_train_parents})"
        rank_zero_info(
            f"memory guard: a training micro-batch of {parents} parents{why} runs as {math.ceil(parents / self.cap)} "
            f"forwards of at most {self.cap} parent(s), gradients accumulated (the same update up to float rounding); "
            "--model.memory_guard.max_train_parents sets the most parents per forward"
        )


def _fixes(adapter: DiffusionAdapter, saved: SavedTensors, checkpointing: bool) -> str:
    """The options that shrink one parent's training memory, for the refusal."""
    fixes = []
    if not checkpointing and saved.activations(True) < saved.activations(False):
        fixes.append(
            "turn on --model.adapter.init_args.gradient_checkpointing (about "
            f"{format_bytes(saved.per_row(True))} per parent instead of {format_bytes(saved.per_row(False))})"
        )
    if adapter.lora is None:
        fixes.append("train LoRA (--model.adapter.init_args.lora) instead of every weight")
    fixes.append("lower --data.batch_size, the branching or num_trees (the rollout's tree is held while training)")
    return "; ".join(fixes)
