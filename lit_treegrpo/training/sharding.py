"""Sharding under ``ModelParallelStrategy`` (FSDP2): :class:`Sharding`, the module's
``configure_model`` hook (mixed into :class:`~lit_treegrpo.training.module.TreeGRPOModule`), and
:func:`data_parallel_mesh`, the mesh dimension the adapter's denoiser shards over."""

from __future__ import annotations

from typing import Any


def data_parallel_mesh(device_mesh: Any, world_size: int) -> Any:
    """The data-parallel dimension of ``ModelParallelStrategy``'s mesh, which FSDP2 shards over.

    Refused when the tensor-parallel dimension is > 1: nothing here splits tensors, so those ranks
    would hold copies that no gradient reduction synchronises (Lightning's ``"auto"`` sizes give
    one data-parallel rank per node and every process of a node to tensor parallelism)."""
    tensor_parallel = device_mesh["tensor_parallel"].size()
    if tensor_parallel > 1:
        raise ValueError(
            f"ModelParallelStrategy has a tensor-parallel size of {tensor_parallel}, but this module only shards over "
            "data parallelism (FSDP2), so those ranks would train unsynchronised copies; set "
            f"trainer.strategy.init_args.data_parallel_size: {world_size} and tensor_parallel_size: 1"
        )
    return device_mesh["data_parallel"]


class Sharding:
    """The module's ``configure_model``; a base class of ``TreeGRPOModule`` (it reads ``adapter``)."""

    def configure_model(self) -> None:
        """FSDP2 under ``ModelParallelStrategy``: the adapter shards its denoiser over the
        data-parallel mesh (:meth:`DiffusionAdapter.shard`; each rank keeps whole prompt trees).
        Other strategies need nothing here."""
        from lightning.pytorch.strategies import ModelParallelStrategy

        if not isinstance(self.trainer.strategy, ModelParallelStrategy):
            return
        if self.trainer.strategy._save_distributed_checkpoint:
            raise ValueError(
                "ModelParallelStrategy(save_distributed_checkpoint=True) writes a sharded checkpoint of "
                "every weight, which this module's trainable-only checkpoints cannot resume from; set "
                "trainer.strategy.init_args.save_distributed_checkpoint: false"
            )
        self.adapter.shard(data_parallel_mesh(self.device_mesh, self.trainer.world_size))
