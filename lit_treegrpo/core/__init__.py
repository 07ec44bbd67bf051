"""The TreeGRPO engine in pure torch: no Lightning, no diffusers (a test enforces it).

- :mod:`.steps`: one denoising transition as a Gaussian policy (flow SDE / ODE, DDIM).
- :mod:`.spec`: :class:`TreeSpec`, which steps branch, and window schedules; :class:`RolloutLimits`.
- :mod:`.seeding`: :func:`seed_of`, the one way a (seed, position in the run) becomes a generator.
- :mod:`.rollout`: grow the tree, one batched model call per depth; recompute edge log-probs.
- :mod:`.advantages`: leaf rewards -> per-edge advantages (TreeGRPO, BranchGRPO, flat GRPO).
- :mod:`.pruning`: width / depth pruning -> edge masks; :class:`PruningSchedule` per iteration;
  :class:`PruningSource`, the one owner of a fit's pruning (the ``PruningSchedule`` callback).
- :mod:`.loss`: :class:`ClippedPolicyLoss`, and :func:`edge_loss` of a minibatch of recorded edges.
- :mod:`.choices`: :func:`check_choice`, an option checked against its ``Literal`` (choices read
  from the type, never re-typed).
- :mod:`.compute`: :class:`Compute` (counted model work of a step) and :class:`ComputeCost` (units).
- :mod:`.samples`: :class:`ScoredSamples`, the samples and rewards a step hands the callbacks.
- :mod:`.memory`: the memory a rollout and a training pass need, counted from shapes (arithmetic;
  the memory guard of :mod:`lit_treegrpo.training` measures what is available).

May import: torch only. Not Lightning, diffusers, transformers or peft, nothing else of the package,
and nothing that probes the machine (environment variables, ``/proc``, CUDA device queries): the
engine computes from its arguments alone, the same everywhere (tests/test_layering.py).
"""

from .advantages import METHODS, combine_rewards, normalize_per_group, tree_advantages
from .compute import Compute, ComputeCost
from .loss import ClippedPolicyLoss, LossOutput, edge_loss
from .pruning import PruningConfig, PruningSchedule, PruningSource, prune
from .rollout import (
    EdgeLogProbs,
    RolloutTree,
    index_cond,
    recompute_log_probs,
    rollout,
    root_noise,
    source_minibatches,
)
from .samples import ScoredSamples
from .seeding import generator, seed_of
from .spec import RolloutLimits, TreeSpec, WindowSchedule
from .steps import StepOutput, ddim_step, flow_sde_step, gaussian_log_prob

__all__ = [
    "METHODS",
    "ClippedPolicyLoss",
    "Compute",
    "ComputeCost",
    "EdgeLogProbs",
    "LossOutput",
    "PruningConfig",
    "PruningSchedule",
    "PruningSource",
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
