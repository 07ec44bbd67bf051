"""The memory guard: before a fit draws its first batch, estimate the rollout's peak memory from the
tree's shape (:func:`lit_treegrpo.core.memory.rollout_memory`) and refuse a tree that cannot fit,
naming the options that shrink it. :class:`~lit_treegrpo.settings.MemoryGuard` holds the options,
:class:`RolloutGuard` the check of one fit (once: before the first batch is drawn when the data
come from a :class:`~lit_treegrpo.data.PromptDataModule`, else at the first training step)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .core.memory import available_memory, cond_row_bytes, format_bytes, rollout_memory
from .core.spec import TreeSpec
from .settings import MemoryGuard


class RolloutMemoryError(ValueError):
    """The memory guard refused a tree that cannot fit (a configuration error)."""


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
        self, adapter: Any, spec: TreeSpec, cond: Any, noise: Tensor, num_prompts: int, *,
        processes: int, any_rank: Callable[[bool], bool],
    ) -> None:  # fmt: skip
        """Check a rollout of ``num_prompts`` prompts on this rank (``cond`` / ``noise``: one
        prompt's conditioning rows and root noise [n, *S] or more) unless disabled."""
        if self.settings.enabled:
            available = self.available(adapter.device, processes)
            check_rollout_memory(self.settings, spec, cond, noise, num_prompts, cfg=adapter.do_cfg,
                                 max_batch=self.max_batch, available=available, any_rank=any_rank)  # fmt: skip
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
        num_prompts = datamodule.per_rank_batch_size()
        with torch.no_grad():
            cond = adapter.encode_prompts(datamodule.train_set.prompts[:1])
            noise = adapter.initial_noise(1, torch.Generator(adapter.device).manual_seed(0))  # [1, *S]
        self.check(adapter, spec, cond, noise, num_prompts, processes=processes, any_rank=any_rank)
