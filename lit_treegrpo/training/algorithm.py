"""TreeGRPO, the training step as one plain object: grow trees from prompts (roll out, decode, score, back up, prune)
and update the policy from a grown tree."""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from torch import Tensor

from ..core.compute import Compute
from ..core.loss import ClippedPolicyLoss, LossOutput, check_kl_reference, edge_loss
from ..core.pruning import PruningConfig, prune
from ..core.rollout import (
    Parents,
    RolloutTree,
    distinct_sources,
    num_parents,
    rollout,
    root_noise,
    source_minibatches,
    split_by_parent,
)
from ..core.samples import GrownTree
from ..core.seeding import generator
from ..core.spec import RolloutLimits, TreeSpec
from ..models.base import Cond
from ..models.flow import FlowMatchingAdapter
from .faults import FaultLedger, StepPlan
from .health import grad_norm
from .memory_guard import MemoryCheck
from .prompt_cache import PromptCache
from .settings import UpdateSettings
from .step_log import NO_UPDATE, PhaseTimer, Update
from .work import StopCheck, StoppedUpdate, stoppable

#: loss statistics that combine over micro-batches by their maximum (the others: by their mean)
BY_MAX = frozenset({"ratio_dev_max"})
#: the ``generator`` stream of the training rollouts (validation seeds by prompt text instead)
TRAIN_STREAM = 0


class Ranks(Protocol):
    """Reductions over the data-parallel ranks, so that every rank decides alike."""

    world_size: int

    def sum(self, values: list[int | bool]) -> list[int]: ...

    def any(self, decision: bool) -> bool: ...

    def max(self, values: list[int]) -> list[int]: ...


class Optimization(Protocol):
    """The optimizer steps of an update (Lightning's manual optimization, in the module)."""

    def toggle(self, sync: bool) -> AbstractContextManager[Any]:
        """Around a micro-batch's backward; gradients are synchronised over ranks only when ``sync``."""
        ...

    def backward(self, loss: Tensor) -> None: ...

    def clip(self, max_norm: float) -> None: ...

    def step(self) -> None: ...

    def zero_grad(self) -> None: ...

    def scheduler_step(self) -> None: ...


AdvantageEstimator = Callable[[RolloutTree, Tensor], Tensor]
BeforeRollout = Callable[[TreeSpec, Cond, Tensor], None]


class TreeGRPO:
    """Tree-structured GRPO on a diffusion adapter (see the module docstring).

    Args:
        adapter: the policy (``lit_treegrpo.models``).
        reward: the reward model (``lit_treegrpo.rewards``).
        tree: the rollout tree per prompt; its ``num_steps`` is the adapter's.
        advantage: the estimator, ``(tree, rewards [L]) -> advantages [E]`` (``AdvantageSettings``).
        loss: the clipped policy loss.
        update: how kept edges become optimizer steps.
        faults: the fault policy's ledger (its counters are the run's).
        memory: the memory guard of this fit.
        rollout: nodes per model call.
        seed: seeds every rollout with the iteration and the prompt's position.
        prompt_cache: each prompt encoded once, when it has a size.
    """

    def __init__(
        self,
        adapter: Any,
        reward: Any,
        tree: TreeSpec,
        *,
        advantage: AdvantageEstimator,
        loss: ClippedPolicyLoss,
        update: UpdateSettings,
        faults: FaultLedger,
        memory: MemoryCheck,
        rollout: RolloutLimits = RolloutLimits(),
        seed: int = 0,
        prompt_cache: PromptCache | None = None,
    ) -> None:
        tree = tree.with_num_steps(adapter.num_steps)  # the adapter owns the number of steps
        tree.check_trains()
        check_kl_reference(loss.kl_beta, has_lora=adapter.lora is not None)
        if loss.kl_beta > 0 and loss.kl_form == "flow_grpo" and not isinstance(adapter, FlowMatchingAdapter):
            raise ValueError(
                f"loss.kl_form flow_grpo needs a flow-matching adapter (its step size |dt|); "
                f"{type(adapter).__name__} is not one: use kl_form exact"
            )
        self.adapter, self.reward, self.tree = adapter, reward, tree
        self.advantages, self.loss, self.update_settings = advantage, loss, update
        self.faults, self.memory, self.rollout_limits, self.seed = faults, memory, rollout, seed
        self.prompt_cache = prompt_cache
        self.stop_requested: StopCheck | None = None  # the module sets it; None: nothing stops a phase early
        self._warned_nothing_kept = False

    # ------------------------------------------------------------------------ the tree
    def tree_at(self, iteration: int) -> TreeSpec:
        """The tree of ``iteration`` (a window schedule moves it)."""
        return self.tree.at(iteration, self.seed)

    def generators(self, iteration: int, first_position: int, count: int) -> list[torch.Generator]:
        """One generator per prompt, seeded by (seed, stream, iteration, global position)."""
        device = self.adapter.device
        return [generator(self.seed, TRAIN_STREAM, iteration, first_position + i, device=device) for i in range(count)]

    def encode(self, prompts: list[str]) -> Cond:
        """The text conditioning of ``prompts`` (P rows), through the prompt cache."""
        if self.prompt_cache is None:
            return self.adapter.encode_prompts(prompts)
        return self.prompt_cache.encode(self.adapter, prompts)

    def score(self, images: Tensor, prompts: list[str], *, check: bool = True) -> tuple[Tensor, dict[str, Tensor]]:
        """Total reward [L] float32 and its components (empty for a single reward); with ``check`` a
        NaN / inf score raises naming the reward and the prompts."""
        scores = self.reward.score(images, prompts, check=check)
        return scores.total.float(), {k: v.float() for k, v in scores.components.items()}

    def grow(
        self,
        prompts: list[str],
        generators: list[torch.Generator],
        *,
        iteration: int,
        pruning: PruningConfig,
        timer: PhaseTimer | None = None,
        before_rollout: BeforeRollout | None = None,
    ) -> GrownTree:
        """Grow ``iteration``'s trees for ``prompts`` [P] with the current weights, one generator per prompt (its root
        noise and every SDE draw); decode and score the leaves, screen the rewards through the fault ledger, back
        them up into advantages and prune with ``pruning``."""
        spec = self.tree_at(iteration)
        cond = self.encode(prompts)
        noise = root_noise(self.adapter.initial_noise, generators, spec)  # [P * num_trees, *S]
        if before_rollout is not None:
            before_rollout(spec, cond, noise)
        tree = rollout(
            stoppable(self.adapter.predict, self.stop_requested),
            self.adapter.step,
            spec,
            cond,
            noise,
            generator=generators,
            max_batch=self.rollout_limits.max_batch,
        )
        _lap(timer, "rollout")

        leaf_prompts = [prompts[i] for i in tree.leaf_prompt.tolist()]
        images = self.adapter.decode(tree.leaf_latents)  # [L, 3, H, W]
        check = self.faults.policy.nonfinite == "error"
        scored = self.faults.score(lambda x, p: self.score(x, p, check=check), images, leaf_prompts, iteration)
        _lap(timer, "reward")

        screened = self.faults.screen(scored.rewards, tree.leaf_prompt, len(prompts))
        advantages = self.advantages(tree, screened.rewards)  # [E]
        keep = prune(tree, advantages, pruning) & ~screened.dropped[tree.edge_prompt]  # [E]
        _lap(timer, "advantages")
        return GrownTree(spec, cond, tree, leaf_prompts, images, scored, screened, advantages, pruning, keep)

    @torch.no_grad()
    def sample(self, prompts: list[str], seed: int) -> Tensor:
        """Deterministic (ODE) samples [P, 3, H, W] in [0, 1], one per prompt, each prompt's noise
        from ``seed`` and its text only (the same in any batch and on any number of processes)."""
        device = self.adapter.device
        gens = [generator(seed, zlib.crc32(p.encode()), device=device) for p in prompts]
        cond = self.encode(prompts)
        noise = torch.cat([self.adapter.initial_noise(1, g) for g in gens])  # [P, *S]
        spec = TreeSpec(self.adapter.num_steps)
        tree = rollout(
            stoppable(self.adapter.predict, self.stop_requested),
            self.adapter.step,
            spec,
            cond,
            noise,
            max_batch=self.rollout_limits.max_batch,
        )
        return self.adapter.decode(tree.leaf_latents)

    # ------------------------------------------------------------------------ the step
    def step(
        self,
        prompts: list[str],
        *,
        iteration: int,
        first_position: int,
        pruning: PruningConfig,
        optimization: Callable[[], Optimization],
        ranks: Ranks,
        timer: PhaseTimer,
        before_rollout: BeforeRollout | None = None,
    ) -> tuple[GrownTree, StepPlan, Update]:
        """One training iteration on this rank's ``prompts``: grow, decide with every rank whether
        to train (faults), and update on the kept edges. ``optimization()`` gives the optimizer steps."""
        generators = self.generators(iteration, first_position, len(prompts))
        grown = self.grow(
            prompts, generators, iteration=iteration, pruning=pruning, timer=timer, before_rollout=before_rollout
        )
        tree = grown.tree
        plan = self.faults.tally(
            grown.scored,
            grown.screened,
            grown.keep,
            prompts,
            tree.leaf_prompt,
            iteration=iteration,
            sum_over_ranks=ranks.sum,
        )
        self._warn_if_nothing_kept(plan, tree, pruning, iteration)
        update = NO_UPDATE
        if plan.train:
            update = self.update(grown, optimization(), ranks, iteration=iteration, first_position=first_position)
        return grown, plan, update

    def _warn_if_nothing_kept(self, plan: StepPlan, tree: RolloutTree, pruning: PruningConfig, iteration: int) -> None:
        """Warn (once) when pruning, not a fault, left nothing to train on any rank."""
        if plan.kept or plan.faulty or self._warned_nothing_kept:
            return
        self._warned_nothing_kept = True
        warnings.warn(
            f"iteration {iteration}: pruning kept none of the {tree.num_edges} edges, so this step trains "
            f"nothing ({pruning}); check the PruningSchedule callback's options (warned once)",
            UserWarning,
            stacklevel=3,
        )

    # ------------------------------------------------------------------------ the update
    def update(
        self, grown: GrownTree, optimization: Optimization, ranks: Ranks, *, iteration: int, first_position: int
    ) -> Update:
        """Clipped policy-gradient updates over the kept edges: ``inner_epochs`` passes, each shuffled
        into micro-batches of whole parents, one optimizer step per ``accumulate`` of them; a step
        whose loss or gradient is not finite is refused through the fault ledger."""
        tree, cond, advantages, keep = grown.tree, grown.cond, grown.advantages, grown.keep
        settings = self.update_settings
        shuffle = generator(self.seed, iteration, first_position + 1)
        totals: list[Any] = [0.0] * len(LossOutput._fields)
        micro = steps = 0
        forwards, fault = Compute(), None
        window: list[Tensor] = []  # the losses of this accumulation window, checked at its step
        num_updates = self._updates_per_epoch(keep, ranks)
        at_start: Tensor | None = None  # the on-policy check: the first micro-batch, before any update
        norms: list[Tensor] = []  # the gradient norm before clipping, per optimizer step
        stop, stopped = self.stop_requested, False
        for _ in range(settings.inner_epochs):
            if stopped:
                break
            batches = source_minibatches(tree, keep, num_batches=num_updates * settings.accumulate, generator=shuffle)
            parents = distinct_sources(tree, batches)  # sized on the host once, not per forward
            chunks = self._forwards_per_micro_batch(parents, ranks)
            for i, edges in enumerate(batches):
                last = (i + 1) % settings.accumulate == 0
                if chunks[i] > 1:
                    loss, stats, n = self._split_backward(optimization, tree, cond, advantages, edges, chunks[i], last)
                else:
                    with optimization.toggle(last):
                        loss, stats, n = self._edge_loss(tree, cond, advantages, edges, parents[i])
                        optimization.backward(loss / settings.accumulate)
                # backpropagated even when it is not finite: every rank must run the same
                # backward passes; the optimizer step below is what the check refuses
                window.append(loss.detach())
                if at_start is None and edges.numel():
                    at_start = stats.ratio_dev_max
                forwards, micro = forwards + n, micro + 1
                totals = [combine(name, total, value) for name, total, value in zip(LossOutput._fields, totals, stats)]
                if not last:
                    continue
                norm, refused = self._optimizer_step(optimization, ranks, window, i + 1 - len(window), iteration)
                norms.append(norm)
                window = []
                if refused is not None:
                    fault = refused
                else:
                    steps += 1
                # between optimizer steps the weights are whole: a stop keeps the steps taken, skips the rest
                stopped = stop is not None and stop()
                if stopped:
                    break
        planned = num_updates * settings.inner_epochs
        early = StoppedUpdate(iteration, len(norms), planned) if stopped and len(norms) < planned else None
        if steps:
            optimization.scheduler_step()
        means = (total if name in BY_MAX else total / max(micro, 1) for name, total in zip(LossOutput._fields, totals))
        mean_norm = torch.stack(norms).mean() if norms else None
        return Update(LossOutput(*means), forwards, steps, fault, at_start, mean_norm, early)

    def _optimizer_step(
        self, optimization: Optimization, ranks: Ranks, losses: list[Tensor], first_micro_batch: int, iteration: int
    ) -> tuple[Tensor, str | None]:
        """Close an accumulation window: measure the gradient norm (before clipping), clip, and step unless a loss or
        the gradient is not finite on any rank (the step's one host sync)."""
        norm = grad_norm(self.adapter.trainable_parameters())  # [] non-finite iff a gradient is
        if self.update_settings.grad_clip is not None:
            optimization.clip(self.update_settings.grad_clip)
        problem = step_problem(losses, norm, iteration, first_micro_batch)
        fault = None
        if ranks.any(problem is not None):
            fault = self.faults.refuse_update(problem, iteration)
        else:
            optimization.step()
        optimization.zero_grad()
        return norm, fault

    def _forwards_per_micro_batch(self, batch_parents: list[Parents], ranks: Ranks) -> list[int]:
        """How many forwards each micro-batch runs as (the memory guard's split), the most any rank
        needs, so that every rank runs the same forwards and backward passes."""
        if not self.memory.active:
            return [1] * len(batch_parents)
        parents = [p.sources.shape[0] for p in batch_parents]
        chunks = self.memory.chunks(parents)
        if ranks.world_size > 1:
            chunks = ranks.max(chunks)
        if max(chunks, default=1) > 1:
            self.memory.announce(max(parents))
        return chunks

    def _split_backward(
        self,
        optimization: Optimization,
        tree: RolloutTree,
        cond: Cond,
        advantages: Tensor,
        edges: Tensor,
        chunks: int,
        last: bool,
    ) -> tuple[Tensor, LossOutput, Compute]:
        """One micro-batch as ``chunks`` forwards and backward passes of whole parents, gradients
        accumulated: the same gradient up to float rounding, since the loss is a mean over parents
        (over edges with aggregation ``"edge"``), so a part weighs its share of them."""
        parts = split_by_parent(tree, edges, chunks)
        parents = [num_parents(tree, part) if part.numel() else 0 for part in parts]
        total_parents, total_edges = max(sum(parents), 1), max(edges.numel(), 1)
        by_parent = {"loss", "policy_loss", "kl"}  # the other statistics are means over edges
        combined: list[Tensor | float] = [0.0] * len(LossOutput._fields)
        forwards = Compute()
        for j, part in enumerate(parts):
            with optimization.toggle(last and j == len(parts) - 1):
                loss, stats, n = self._edge_loss(tree, cond, advantages, part)
                by_edge = self.loss.aggregation == "edge"
                share = part.numel() / total_edges if by_edge else parents[j] / total_parents
                optimization.backward(loss * share / self.update_settings.accumulate)
            weights = {name: share if name in by_parent else part.numel() / total_edges for name in LossOutput._fields}
            combined = [
                combine(name, total, value if name in BY_MAX else weights[name] * value)
                for total, name, value in zip(combined, LossOutput._fields, stats)
            ]
            forwards = forwards + n
        stats = LossOutput(*(torch.as_tensor(value, device=advantages.device) for value in combined))
        return stats.loss, stats, forwards

    def _updates_per_epoch(self, keep: Tensor, ranks: Ranks) -> int:
        """Optimizer steps per pass over the kept edges: ``minibatches``, or one per
        ``edges_per_update`` kept edges over all ranks (the same count on every rank)."""
        per = self.update_settings.edges_per_update
        if per is None:
            return self.update_settings.minibatches
        (kept,) = ranks.sum([int(keep.sum())])
        per_rank = kept / max(ranks.world_size, 1)
        return max(1, math.ceil(per_rank / per))

    def _edge_loss(
        self, tree: RolloutTree, cond: Cond, advantages: Tensor, edges: Tensor, parents: Parents | None = None
    ) -> tuple[Tensor, LossOutput, Compute]:
        """Loss of one micro-batch of edges, its detached statistics and its counted forwards (a zero
        loss on the parameters when it is empty, so every rank runs the same backward passes)."""
        if edges.numel() == 0:
            zero = sum(p.sum() for p in self.adapter.trainable_parameters()) * 0.0
            return zero, LossOutput(*(torch.zeros((), device=zero.device) for _ in LossOutput._fields)), Compute()
        kl = self.loss.kl_beta > 0
        # [B] |dt| of each edge's step, which only Flow-GRPO's KL form uses (a flow adapter: checked in __init__)
        step_size = self.adapter.step_size(tree.edge_step[edges]) if kl and self.loss.kl_form == "flow_grpo" else None
        out, forwards = edge_loss(
            self.loss,
            self.adapter.predict,
            self.adapter.step,
            tree,
            edges,
            cond,
            advantages,
            reference=self.adapter.reference if kl else None,
            step_size=step_size,
            parents=parents,
        )
        return out.loss, LossOutput(*(value.detach() for value in out)), forwards


def combine(name: str, total: Any, value: Any) -> Any:
    """``total`` with one more micro-batch's ``value`` of the statistic ``name`` (:data:`BY_MAX`)."""
    if name not in BY_MAX:
        return total + value
    return value if isinstance(total, float) else torch.maximum(total, value)  # the first: 0.0


def step_problem(losses: list[Tensor], norm: Tensor, iteration: int, first_micro_batch: int) -> str | None:
    """Why an optimizer step must be refused, or None: a non-finite loss among its micro-batches'
    ``losses`` (the first is micro-batch ``first_micro_batch``) or a non-finite gradient (its
    ``norm`` is non-finite exactly when a gradient element is). One host sync when all is finite."""
    values = torch.stack([loss.float() for loss in losses] + [norm.float().to(losses[0].device)])  # [M + 1]
    if bool(torch.isfinite(values).all()):
        return None
    for j, loss in enumerate(losses):
        if not torch.isfinite(loss):
            return f"non-finite loss {loss.item()} at iteration {iteration}, micro-batch {first_micro_batch + j}"
    return f"non-finite gradient at iteration {iteration}"


def _lap(timer: PhaseTimer | None, phase: str) -> None:
    if timer is not None:
        timer.lap(phase)
