"""What the memory guard measures: the memory there is (:func:`available_memory`: free CUDA memory,
or ``/proc/meminfo``'s MemAvailable shared by the processes of the node), what autograd saves for
one parent of the training pass on the real model (:func:`probe_training`), and the optimizer
state still to be allocated (:func:`optimizer_state_bytes`). The engine's arithmetic
(:mod:`lit_treegrpo.core.memory`) turns these into estimates and probes nothing itself; the guard
(:mod:`lit_treegrpo.training.memory_guard`) compares them and decides."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..core.memory import SavedTensors, count_saved_tensors
from ..core.rollout import index_cond
from ..core.spec import TreeSpec

if TYPE_CHECKING:
    from ..models.base import DiffusionAdapter


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


# ------------------------------------------------------------------------------- training pass
@contextlib.contextmanager
def _checkpoint_regions_known(denoiser: nn.Module | None) -> Iterator[None]:
    """Gradient checkpointing switched on while the probe runs, where the denoiser supports it
    (diffusers' ``enable_gradient_checkpointing``) and it is off: the probe then sees the regions
    it would checkpoint (and runs them directly, so the count is the same), and can say what
    checkpointing would save. Switched off again afterwards."""
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


def probe_training(adapter: DiffusionAdapter, spec: TreeSpec, cond: Any, noise: Tensor) -> SavedTensors:
    """What autograd saves for one parent of the training pass, counted on the real model
    (:func:`~lit_treegrpo.core.memory.count_saved_tensors`): the model call on one source row at the
    tree's first stochastic step as :func:`~lit_treegrpo.core.rollout.recompute_log_probs` makes it
    (classifier-free guidance doubles its rows inside ``predict``), and the step's log-probs of its
    children (the most any parent of ``spec`` has). ``cond`` / ``noise``: one prompt's conditioning
    rows and root noise (row 0 of each is used). Nothing is trained and no generator is drawn from."""
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
    """Put FSDP2-sharded modules back into their sharded state after a forward with no backward.
    FSDP2 keeps the root module's parameters gathered after its forward (the backward would need
    them at once); with no backward they would stay registered as plain, full tensors, and a
    checkpoint restored next (``ModelParallelStrategy`` restores after ``on_fit_start``) would be
    copied into them as DTensors and fail. ``reshard`` is not recursive, so every FSDP module."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed: nothing can be sharded
        return
    for submodule in module.modules():
        if isinstance(submodule, FSDPModule):
            submodule.reshard()


def optimizer_state_bytes(optimizer: torch.optim.Optimizer | None, params: list[nn.Parameter]) -> int:
    """Bytes ``optimizer`` will allocate for those of ``params`` it holds no state for yet (all of
    them at the start of a fit: a resumed run's state is loaded later): Adam's and AdamW's two moments
    (three with amsgrad), SGD's momentum buffer if it has one, two per parameter for any other."""
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
            p.numel() * p.element_size() for p in group["params"] if optimizer is None or not optimizer.state.get(p)
        )
    return size
