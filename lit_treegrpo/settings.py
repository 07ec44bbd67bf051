"""The module's settings: option dataclasses validated in ``__post_init__`` (messages name the
option), and :func:`check_settings`, the checks that need no model. The CLI runs all of them before
any weights load; :class:`~lit_treegrpo.module.TreeGRPOModule` runs them again when it is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .core.advantages import METHODS, AdvantageMethod, StdScope
from .core.spec import RolloutLimits, TreeSpec


@dataclass(frozen=True)
class AdvantageSettings:
    """How leaf rewards become per-edge advantages (``lit_treegrpo.core.advantages``)."""

    method: AdvantageMethod = "mean"
    """``mean`` (TreeGRPO code), ``logprob_softmax`` (TreeGRPO paper), ``branch_fusion``
    (BranchGRPO) or ``parent_relative``."""
    beta: float = 1.0
    """Path-probability temperature of ``branch_fusion`` (0: uniform mean of leaf rewards)."""
    clip: float | None = None
    """Clamp advantages to ``[-clip, clip]`` before pruning (the loss clamps again at adv_clip)."""
    std_scope: StdScope = "group"
    """Std of the leaf normalisation: ``group`` (per prompt: TreeGRPO, DanceGRPO) or ``global``
    (over all leaves of this process's batch, the mean still per prompt: Flow-GRPO's
    ``global_std``). Not for ``branch_fusion``."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"advantage.method must be one of {', '.join(METHODS)}; got {self.method!r}")
        if self.std_scope not in ("group", "global"):
            raise ValueError(f"advantage.std_scope must be 'group' or 'global', got {self.std_scope!r}")
        if self.std_scope == "global" and self.method == "branch_fusion":
            raise ValueError(
                "advantage.std_scope global does not apply to branch_fusion, which normalises per "
                "depth; use std_scope group"
            )
        if self.clip is not None and self.clip <= 0:
            raise ValueError(f"advantage.clip must be > 0 or null, got {self.clip}")


@dataclass(frozen=True)
class FaultPolicy:
    """What a training step does with NaN / inf rewards, a failing reward call, or a non-finite
    loss or gradient. Counters are logged as ``faults/*`` and kept in checkpoints."""

    nonfinite: Literal["error", "skip"] = "error"
    """``error``: stop at the first fault, naming it (the reward and its prompts, or the iteration
    and micro-batch). ``skip``: drop the prompts whose leaves got NaN / inf rewards from the step
    (the other prompts train as usual), skip the whole step when the reward call raises, skip the
    optimizer step (gradients zeroed) when the loss or a gradient is not finite."""
    max_consecutive_skips: int = 3
    """With ``skip``: stop once this many training steps in a row made no update because of a
    fault, naming the last cause."""

    def __post_init__(self) -> None:
        if self.nonfinite not in ("error", "skip"):
            raise ValueError(f"faults.nonfinite must be 'error' or 'skip', got {self.nonfinite!r}")
        if self.max_consecutive_skips < 1:
            raise ValueError(f"faults.max_consecutive_skips must be >= 1, got {self.max_consecutive_skips}")


@dataclass(frozen=True)
class MemoryGuard:
    """Before the first batch is drawn, estimate its peak memory from the tree's shape
    (:func:`lit_treegrpo.core.memory.rollout_memory`) and refuse a run that cannot fit; measure what
    one parent of the training pass costs (:func:`lit_treegrpo.memory_guard.probe_training`) and
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


def check_settings(
    tree: TreeSpec,
    *,
    minibatches: int,
    accumulate: int,
    inner_epochs: int,
    grad_clip: float | None,
    val_samples: int = 1,
    edges_per_update: int | None = None,
    adapter_num_steps: int | None = None,
    limits: RolloutLimits | None = None,
    prefix: str = "",
) -> None:
    """The module's checks that need no model (the CLI runs them before any weights load);
    ``prefix`` (``"--model."``) turns the names in the messages into command-line options."""
    if adapter_num_steps is not None and tree.num_steps != adapter_num_steps:
        raise ValueError(
            f"{prefix}tree.num_steps={tree.num_steps} but the adapter samples with num_steps="
            f"{adapter_num_steps}; set both to the same value"
        )
    if tree.num_edges() == 0:
        raise ValueError(
            f"{prefix}tree has no stochastic step, so nothing would train; give branch_steps or sde_steps"
        )
    if tree.num_leaves == 1:
        # rewards are normalised among the leaves of a prompt: a single leaf is always 0
        raise ValueError(
            f"{prefix}tree has one leaf per prompt (num_trees 1, branching 1), so every advantage "
            "would be 0 and nothing would train; give branching >= 2 or num_trees >= 2"
        )
    if limits is not None:
        limits.check(tree)  # its message names --model.rollout.max_leaves
    for name, value in (("minibatches", minibatches), ("accumulate", accumulate), ("inner_epochs", inner_epochs),
                        ("val_samples", val_samples)):  # fmt: skip
        if value < 1:
            raise ValueError(f"{prefix}{name} must be >= 1, got {value}")
    if grad_clip is not None and grad_clip <= 0:
        raise ValueError(f"{prefix}grad_clip must be > 0 or null, got {grad_clip}")
    if edges_per_update is not None:
        if edges_per_update < 1:
            raise ValueError(f"{prefix}edges_per_update must be >= 1 or null, got {edges_per_update}")
        if minibatches != 1:
            raise ValueError(
                f"{prefix}edges_per_update={edges_per_update} sets the number of optimizer steps from "
                f"the kept edges, so minibatches={minibatches} would be ignored; keep minibatches 1"
            )


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
