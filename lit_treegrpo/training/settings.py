"""The training step's settings, each validated once where it is defined (``__post_init__``, the message naming the
option): :class:`AdvantageSettings` (also the advantage estimator) and :class:`UpdateSettings`."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from torch import Tensor

from ..core.advantages import AdvantageMethod, StdEstimator, StdScope, check_advantage_options, tree_advantages
from ..core.choices import check_choice
from ..core.rollout import RolloutTree
from ..core.spec import TreeSpec


@dataclass(frozen=True)
class AdvantageSettings:
    """How leaf rewards become per-edge advantages (``lit_treegrpo.core.advantages``); called on a tree and its
    rewards, it is the estimator."""

    method: AdvantageMethod = "mean"
    """``mean`` (TreeGRPO code), ``logprob_softmax`` (TreeGRPO paper) or ``branch_fusion`` (BranchGRPO)."""
    beta: float = 1.0
    """Path-probability temperature of ``branch_fusion`` (0: uniform mean of leaf rewards)."""
    clip: float | None = None
    """Clamp advantages to ``[-clip, clip]`` before pruning (the loss clamps again at adv_clip)."""
    std_scope: StdScope = "group"
    """Std of the leaf normalisation: ``group`` (per prompt) or ``global`` (over the batch's leaves,
    the mean still per prompt: Flow-GRPO's ``global_std``). Not for ``branch_fusion``."""
    std_estimator: StdEstimator = "population"
    """``population`` (TreeGRPO's code) or ``sample`` (n - 1, as DanceGRPO's and BranchGRPO's code)."""

    def __post_init__(self) -> None:
        check_advantage_options(self.method, self.std_scope, prefix="advantage.")
        check_choice("advantage.std_estimator", self.std_estimator, StdEstimator)
        if self.clip is not None and self.clip <= 0:
            raise ValueError(f"advantage.clip must be > 0 or null, got {self.clip}")

    def __call__(self, tree: RolloutTree, rewards: Tensor) -> Tensor:
        """[E] one advantage per recorded edge of ``tree`` from its leaves' finite ``rewards`` [L]."""
        return tree_advantages(
            rewards,
            tree.edge_parent,
            tree.leaf_edge,
            tree.leaf_prompt,
            method=self.method,
            edge_old_log_prob=tree.edge_old_log_prob,
            beta=self.beta,
            clip=self.clip,
            std_scope=self.std_scope,
            std_estimator=self.std_estimator,
        )


@dataclass(frozen=True)
class UpdateSettings:
    """How a step's kept edges become optimizer steps (the module's options of the same names)."""

    minibatches: int = 1
    """Optimizer steps per inner epoch: the kept edges shuffled into this many minibatches of whole parents."""
    edges_per_update: int | None = None
    """Instead of ``minibatches``, one optimizer step per this many kept edges over all ranks."""
    accumulate: int = 1
    """Micro-batches per optimizer step (gradient accumulation)."""
    inner_epochs: int = 1
    """Passes over the kept edges per rollout (PPO epochs)."""
    grad_clip: float | None = 1.0
    """Clip the gradient norm to this value; null disables."""

    def __post_init__(self) -> None:
        for name in ("minibatches", "accumulate", "inner_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"grad_clip must be > 0 or null, got {self.grad_clip}")
        if self.edges_per_update is not None:
            if self.edges_per_update < 1:
                raise ValueError(f"edges_per_update must be >= 1 or null, got {self.edges_per_update}")
            if self.minibatches != 1:
                raise ValueError(
                    f"edges_per_update={self.edges_per_update} sets the number of optimizer steps from "
                    f"the kept edges, so minibatches={self.minibatches} would be ignored; keep minibatches 1"
                )

    @classmethod
    def of(cls, options: Any) -> UpdateSettings:
        """Built from a mapping that holds the module's options (the CLI's parsed ``model``)."""
        return cls(**{f.name: options[f.name] for f in fields(cls)})

    @property
    def steps_per_iteration(self) -> int | None:
        """Optimizer steps of an iteration when fixed (``None`` with ``edges_per_update``)."""
        return None if self.edges_per_update is not None else self.minibatches * self.inner_epochs

    def micro_batches(self, spec: TreeSpec, num_prompts: int) -> int:
        """Micro-batches of one inner epoch when every edge of ``num_prompts`` prompts' trees is kept."""
        if self.edges_per_update is None:
            return self.minibatches * self.accumulate
        return max(1, math.ceil(num_prompts * spec.num_edges() / self.edges_per_update)) * self.accumulate


def check_val_samples(val_samples: int, prefix: str = "") -> None:
    if val_samples < 1:
        raise ValueError(f"{prefix}val_samples must be >= 1, got {val_samples}")


def check_unused_parameters(adapter: Any, wrapped: Any) -> None:
    """Refuse DDP without unused-parameter detection for an adapter with several trained denoisers (Wan2.2 A14B's two
    experts): a micro-batch on one expert's steps leaves the other without a gradient, and DDP stops the next step."""
    from torch.nn.parallel import DistributedDataParallel

    trained = list(adapter.trained_denoisers())
    if len(trained) > 1 and isinstance(wrapped, DistributedDataParallel) and not wrapped.find_unused_parameters:
        raise ValueError(
            f"--trainer.strategy ddp: the adapter trains {' and '.join(trained)}, and a micro-batch on one expert's "
            "steps leaves the other without a gradient, which DDP refuses; use --trainer.strategy "
            "ddp_find_unused_parameters_true, or ModelParallelStrategy (FSDP2), or train one expert "
            "(--model.adapter.init_args.train_experts high_noise / low_noise)"
        )
