"""The TreeGRPO engine in pure torch: no Lightning, no diffusers (a test enforces it).

May import: torch only. Not Lightning, diffusers, transformers or peft, nothing else of the package,
and nothing that probes the machine (environment variables, ``/proc``, CUDA device queries): the
engine computes from its arguments alone, the same everywhere (tests/test_layering.py).
"""

from .advantages import METHODS, combine_rewards, normalize_per_group, tree_advantages
from .compute import Compute, ComputeCost
from .loss import ClippedPolicyLoss, LossOutput, edge_loss
from .pruning import PruningConfig, PruningPlan, prune
from .rollout import (
    EdgeLogProbs,
    RolloutTree,
    index_cond,
    recompute_log_probs,
    rollout,
    root_noise,
    source_minibatches,
)
from .samples import GrownTree, ScoredSamples
from .seeding import generator, seed_of
from .spec import RolloutLimits, TreeSpec, WindowSchedule
from .steps import StepOutput, ddim_step, flow_sde_step, gaussian_log_prob

__all__ = [
    "METHODS",
    "ClippedPolicyLoss",
    "Compute",
    "ComputeCost",
    "EdgeLogProbs",
    "GrownTree",
    "LossOutput",
    "PruningConfig",
    "PruningPlan",
    "RolloutTree",
    "ScoredSamples",
    "StepOutput",
    "RolloutLimits",
    "TreeSpec",
    "WindowSchedule",
    "combine_rewards",
    "ddim_step",
    "edge_loss",
    "flow_sde_step",
    "gaussian_log_prob",
    "generator",
    "index_cond",
    "normalize_per_group",
    "prune",
    "recompute_log_probs",
    "rollout",
    "root_noise",
    "seed_of",
    "source_minibatches",
    "tree_advantages",
]
