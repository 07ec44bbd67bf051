"""The module's own settings: :class:`AdvantageSettings` (an option dataclass validated in
``__post_init__``, its messages naming the option) and :func:`check_settings`, the checks of the
module's options that need no model. The CLI runs them before any weights load;
:class:`~lit_treegrpo.training.module.TreeGRPOModule` runs them again when it is built. The fault
policy's and the memory guard's options live with their owners
(:class:`~lit_treegrpo.training.faults.FaultPolicy`,
:class:`~lit_treegrpo.training.memory_guard.MemoryGuard`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.advantages import AdvantageMethod, StdEstimator, StdScope, check_advantage_options
from ..core.choices import check_choice
from ..core.spec import RolloutLimits, TreeSpec


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
    std_estimator: StdEstimator = "population"
    """``population`` (TreeGRPO's code) or ``sample`` (the n - 1 std of ``torch.std``, as
    DanceGRPO's and BranchGRPO's code normalise), in the leaf and the depth-wise normalisation."""

    def __post_init__(self) -> None:
        check_advantage_options(self.method, self.std_scope, prefix="advantage.")
        check_choice("advantage.std_estimator", self.std_estimator, StdEstimator)
        if self.clip is not None and self.clip <= 0:
            raise ValueError(f"advantage.clip must be > 0 or null, got {self.clip}")


def check_settings(
    tree: TreeSpec,
    *,
    minibatches: int,
    accumulate: int,
    inner_epochs: int,
    grad_clip: float | None,
    val_samples: int = 1,
    edges_per_update: int | None = None,
    limits: RolloutLimits | None = None,
    prefix: str = "",
) -> None:
    """The module's checks that need no model (the CLI runs them before any weights load);
    ``prefix`` (``"--model."``) turns the names in the messages into command-line options. The
    tree's checks need its ``num_steps`` (:meth:`TreeSpec.with_num_steps` fills in the adapter's);
    a tree still without it skips them."""
    if tree.num_steps is not None and tree.num_edges() == 0:
        raise ValueError(f"{prefix}tree has no stochastic step, so nothing would train; give branch_steps or sde_steps")
    if tree.num_leaves == 1:
        # rewards are normalised among the leaves of a prompt: a single leaf is always 0
        raise ValueError(
            f"{prefix}tree has one leaf per prompt (num_trees 1, branching 1), so every advantage "
            "would be 0 and nothing would train; give branching >= 2 or num_trees >= 2"
        )
    if limits is not None:
        limits.check(tree)  # its message names --model.rollout.max_leaves
    for name, value in (
        ("minibatches", minibatches),
        ("accumulate", accumulate),
        ("inner_epochs", inner_epochs),
        ("val_samples", val_samples),
    ):
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


def check_reuse(
    *,
    minibatches: int = 1,
    inner_epochs: int = 1,
    accumulate: int = 1,
    edges_per_update: int | None = None,
    kl_beta: float = 0.0,
    max_train_parents: int | None = None,
    processes: int = 1,
) -> None:
    """``reuse_rollout_forward`` (training on the rollout's own forwards) is exact only where the
    update sees the weights that sampled: one optimizer step over every kept edge in one forward,
    no reference model; and it is built for one process (the module checks ``processes`` when the
    fit starts, the rest when it is built)."""
    wrong = [
        (processes != 1, f"{processes} processes (one only)"),
        (minibatches != 1, f"--model.minibatches {minibatches} (needs 1)"),
        (inner_epochs != 1, f"--model.inner_epochs {inner_epochs} (needs 1)"),
        (accumulate != 1, f"--model.accumulate {accumulate} (needs 1)"),
        (edges_per_update is not None, f"--model.edges_per_update {edges_per_update} (needs null)"),
        (kl_beta != 0, f"--model.loss.init_args.kl_beta {kl_beta} (needs 0: the KL's reference forwards)"),
        (max_train_parents is not None, f"--model.memory_guard.max_train_parents {max_train_parents} (needs null)"),
    ]
    problems = [text for bad, text in wrong if bad]
    if problems:
        raise ValueError(
            "--model.reuse_rollout_forward true trains on the rollout's forwards, exact only for one update at the "
            f"sampling weights: {', '.join(problems)}; or set it to false"
        )


def check_unused_parameters(adapter: Any, wrapped: Any) -> None:
    """Refuse DDP without unused-parameter detection for an adapter with several trained denoisers
    (Wan2.2 A14B's two experts): a micro-batch whose edges all sit on one side of the boundary
    leaves the other expert's weights without a gradient, and DDP then stops the next step.
    ``wrapped``: the strategy's model (a ``DistributedDataParallel`` under DDP)."""
    from torch.nn.parallel import DistributedDataParallel

    trained = list(adapter.trained_denoisers())
    if len(trained) > 1 and isinstance(wrapped, DistributedDataParallel) and not wrapped.find_unused_parameters:
        raise ValueError(
            f"--trainer.strategy ddp: the adapter trains {' and '.join(trained)}, and a micro-batch on one expert's "
            "steps leaves the other without a gradient, which DDP refuses; use --trainer.strategy "
            "ddp_find_unused_parameters_true, or ModelParallelStrategy (FSDP2), or train one expert "
            "(--model.adapter.init_args.train_experts high_noise / low_noise)"
        )
