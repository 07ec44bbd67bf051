"""Memory of one rollout at its peak, counted from the tree's shape (pure arithmetic).

What :func:`lit_treegrpo.core.rollout.rollout` holds at its peak on one data-parallel rank with
``P`` prompts, latents of ``n`` elements of ``b`` bytes each (``lat = n * b``), and a tree of
``L`` leaves per prompt (``L`` is also its widest frontier: every node alive after the last split
is the ancestor of exactly one leaf):

=====================  =========================================================================
recorded sources       ``source_x``: one row per node at every stochastic step,
                       ``sum_{t stochastic} nodes_at(t) * P * lat``
recorded edges         ``edge_x_next``: ``num_edges() * P * lat``
leaf latents           ``L * P * lat``
final concatenation    the ``torch.cat`` of the per-step lists copies sources and edges once more
conditioning per node  ``index_cond(cond, node_prompt)``: one conditioning row per frontier node,
                       ``L * P`` rows, plus the prompts' own ``P`` rows
step workspace         at the widest step: the frontier and the model output in the latent dtype
                       (2 b) and four float32 tensors (noise, float32 copies of the model output
                       and the sample, the mean; ``flow_sde_step`` / ``ddim_step`` compute in
                       float32): ``L * P * n * (2 b + 16)``
model call input       one chunk of at most ``max_batch`` rows of latents and conditioning,
                       doubled by classifier-free guidance
=====================  =========================================================================

Activations inside the model call are not counted: they depend on the architecture, and chunking
by ``max_batch`` is what bounds them. Callers leave headroom for them (the module's memory guard
compares against a fraction of the free memory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils import _pytree as pytree

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
    """Peak bytes of ``rollout(..., spec, cond, noise)`` for ``num_prompts`` prompts.

    Args:
        spec: the tree of this training step.
        num_prompts: prompts on this rank (``P``).
        latent_shape: one latent's shape without the batch dimension, e.g. ``(16, 128, 128)``.
        latent_dtype: the latents' dtype (the denoiser's).
        cond_bytes: conditioning bytes per prompt row (:func:`cond_row_bytes` of the encoded cond).
        cfg: whether each model call doubles its rows for classifier-free guidance.
        max_batch: most nodes per model call, as given to ``rollout`` (``RolloutLimits``).
    """
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
    """(bytes available to one process on ``device``, where the number comes from): free device
    memory on CUDA; on CPU :func:`mem_available` shared by the ``processes`` of this node; None
    where it cannot be measured."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0], f"free on {device}"
    if device.type != "cpu":
        return None, f"not measured on {device.type}"
    available = mem_available()
    if available is None:
        return None, "MemAvailable unknown"
    return available // processes, f"MemAvailable / {processes} process(es) of this node"


__all__ = ["RolloutMemory", "available_memory", "cond_row_bytes", "format_bytes", "mem_available", "rollout_memory"]
