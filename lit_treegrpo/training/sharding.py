"""Sharding under ``ModelParallelStrategy`` (FSDP2): :func:`data_parallel_mesh`, the mesh dimension
the adapter's denoiser shards over (the module's ``configure_model``)."""

from __future__ import annotations

from typing import Any


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
