"""Sharding under ``ModelParallelStrategy`` (FSDP2): :func:`data_parallel_mesh`, the mesh dimension
the adapter's denoiser shards over (the module's ``configure_model``), and :func:`fsdp_gradient_sync`, which
defers the gradient reduce-scatter over the micro-batches of one optimizer step."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


def data_parallel_mesh(device_mesh: Any, world_size: int) -> Any:
    """The data-parallel dimension of ``ModelParallelStrategy``'s mesh, which FSDP2 shards over."""
    tensor_parallel = device_mesh["tensor_parallel"].size()
    if tensor_parallel > 1:
        raise ValueError(
            f"ModelParallelStrategy has a tensor-parallel size of {tensor_parallel}, but this module only shards over "
            "data parallelism (FSDP2), so those ranks would train unsynchronised copies; set "
            f"trainer.strategy.init_args.data_parallel_size: {world_size} and tensor_parallel_size: 1"
        )
    return device_mesh["data_parallel"]


@contextlib.contextmanager
def fsdp_gradient_sync(module: torch.nn.Module, sync: bool) -> Iterator[None]:
    """FSDP2's gradient reduce-scatter on (``sync``) or off for the backward passes inside, on every sharded module of
    ``module`` (off: each rank accumulates unsharded gradients until a backward with sync on)."""
    from torch.distributed.fsdp import FSDPModule

    sharded = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if sync or not sharded:
        yield
        return
    for m in sharded:
        m.set_requires_gradient_sync(False, recurse=False)
    try:
        yield
    finally:
        for m in sharded:
            m.set_requires_gradient_sync(True, recurse=False)
