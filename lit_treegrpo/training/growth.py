"""The first half of a training step: grow the trees, score the leaves, back up, prune.

:class:`TreeGrowth` is a part of :class:`~lit_treegrpo.training.module.TreeGRPOModule` (mixed into
it, so its methods are the module's). :meth:`~TreeGrowth.grow` is what the training step trains on
and what the ``TreeView`` callback draws, one code path for both, so that the picture shows the
tree a step of the run would grow from the same noise; :meth:`~TreeGrowth.advantages` is the
extension point for an advantage estimator of one's own (docs/extending.md).

It reads the module's options (``tree``, ``seed``, ``advantage``, ``rollout_limits``,
``reuse_rollout_forward``) and state (``adapter``, ``iteration``, ``fault_ledger``,
``prompt_cache``, ``_warned_nothing_kept``), its reward (``_score``), the iteration's pruning
(``pruning_at``) and the memory guard (``_guard_memory``). :meth:`~TreeGrowth.encode` (through the
prompt cache) serves validation too.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch
from torch import Tensor

from ..core.advantages import tree_advantages
from ..core.pruning import PruningConfig, prune
from ..core.rollout import RolloutTree, rollout, root_noise
from ..core.spec import TreeSpec
from ..models.base import Cond
from .faults import Scored, Screened, StepPlan
from .step_log import PhaseTimer


class GrownTree(NamedTuple):
    """One batch's trees, scored, backed up and pruned: what the update trains on."""

    spec: TreeSpec  # the iteration's tree (a window schedule moves it)
    cond: Cond  # the prompts' conditioning, P rows (the update's forwards take it again)
    tree: RolloutTree  # every prompt's trees, L leaves and E recorded edges
    leaf_prompts: list[str]  # [L] each leaf's prompt
    images: Tensor  # [L, 3, H, W] the decoded leaves in [0, 1] ([L, F, 3, H, W] videos)
    scored: Scored  # the rewards [L] as the reward gave them, with their components
    screened: Screened  # the rewards [L] the advantages come from, and the prompts [P] left out
    advantages: Tensor  # [E] one per recorded edge (:meth:`TreeGrowth.advantages`)
    pruning: PruningConfig  # the iteration's pruning
    keep: Tensor  # [E] bool: the edges that train (pruning kept them and their prompt was not left out)


class TreeGrowth:
    """The training step's trees (see the module docstring); a base class of ``TreeGRPOModule``."""

    def grow(
        self,
        prompts: list[str],
        generators: list[torch.Generator],
        *,
        timer: PhaseTimer | None = None,
        guard: bool = False,
    ) -> GrownTree:
        """Grow this iteration's trees for ``prompts`` [P] with the current weights, one generator
        per prompt (its root noise and every SDE draw, so the same generators grow the same trees),
        decode and score the leaves, screen the rewards through the fault ledger (which counts
        nothing here), back them up into :meth:`advantages` and prune as this iteration trains.

        Args:
            timer: laps ``rollout``, ``reward`` and ``advantages`` (the training step's phase times).
            guard: run the memory guard on these trees first, unless it has run (the training step:
                sized for ``P`` prompts per rank; a callback's one prompt must not size it).
        """
        ledger = self.fault_ledger
        spec = self.tree.at(self.iteration, self.seed)
        cond = self.encode(prompts)
        noise = root_noise(self.adapter.initial_noise, generators, spec)  # [P * num_trees, *S]
        if guard:
            self._guard_memory(spec, cond, noise, len(prompts))
        tree = rollout(
            self.adapter.predict,
            self.adapter.step,
            spec,
            cond,
            noise,
            generator=generators,
            max_batch=self.rollout_limits.max_batch,
            # the training step's tree keeps its stochastic forwards' graphs to train on them
            grad_stochastic=guard and self.reuse_rollout_forward,
        )
        _lap(timer, "rollout")

        leaf_prompts = [prompts[i] for i in tree.leaf_prompt.tolist()]
        images = self.adapter.decode(tree.leaf_latents)  # [L, 3, H, W]
        scored = ledger.score(self._score, images, leaf_prompts, self.iteration)
        _lap(timer, "reward")

        screened = ledger.screen(scored.rewards, tree.leaf_prompt, len(prompts))
        advantages = self.advantages(tree, screened.rewards)  # [E]
        pruning = self.pruning_at(spec)
        keep = prune(tree, advantages, pruning) & ~screened.dropped[tree.edge_prompt]  # [E]
        _lap(timer, "advantages")
        return GrownTree(spec, cond, tree, leaf_prompts, images, scored, screened, advantages, pruning, keep)

    def encode(self, prompts: list[str]) -> Cond:
        """The text conditioning of ``prompts`` (P rows), through the prompt cache."""
        return self.prompt_cache.encode(self.adapter, prompts)

    def _warn_if_nothing_kept(self, plan: StepPlan, tree: RolloutTree, pruning: PruningConfig) -> None:
        """Warn (once) when pruning, not a fault, left nothing to train on any rank."""
        if plan.kept or plan.faulty or self._warned_nothing_kept:
            return
        self._warned_nothing_kept = True
        message = (
            f"iteration {self.iteration}: pruning kept none of the {tree.num_edges} edges, so this step trains "
            f"nothing ({pruning}); check the PruningSchedule callback's options (warned once)"
        )
        warnings.warn(message, UserWarning, stacklevel=3)

    def advantages(self, tree: RolloutTree, rewards: Tensor) -> Tensor:
        """[E] one advantage per recorded edge of ``tree`` from its leaves' rewards [L] (finite):
        ``--model.advantage``'s estimator. Override it in a subclass for an estimator of one's own
        (docs/extending.md); the training step and ``TreeView`` both call it."""
        a = self.advantage
        return tree_advantages(
            rewards,
            tree.edge_parent,
            tree.leaf_edge,
            tree.leaf_prompt,
            method=a.method,
            edge_old_log_prob=tree.edge_old_log_prob,
            beta=a.beta,
            clip=a.clip,
            std_scope=a.std_scope,
            std_estimator=a.std_estimator,
        )


def _lap(timer: PhaseTimer | None, phase: str) -> None:
    if timer is not None:
        timer.lap(phase)
