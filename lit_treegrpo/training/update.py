"""The policy update of a training step: clipped policy-gradient steps over the kept edges.

:class:`PolicyUpdate` is a part of :class:`~lit_treegrpo.training.module.TreeGRPOModule` (mixed
into it, so its methods are the module's): ``inner_epochs`` passes over the kept edges, each
shuffled into micro-batches of whole parents (one forward per parent serves all its children), one
optimizer step per ``accumulate`` of them, through Lightning's manual optimization. A micro-batch
too large for memory runs as several forwards with gradients accumulated
(:class:`~lit_treegrpo.training.memory_guard.TrainingGuard`); a step whose loss or gradient is not
finite is refused through the fault ledger (:class:`~lit_treegrpo.training.faults.FaultLedger`),
alike on every data-parallel rank.

It reads the module's options (``minibatches``, ``edges_per_update``, ``accumulate``,
``inner_epochs``, ``grad_clip``, ``loss_fn``, ``seed``) and state (``adapter``, ``iteration``,
``training_guard``, ``fault_ledger``), and its rank helpers (``_sum_over_ranks``, ``_any_rank``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..core.compute import Compute
from ..core.loss import LossOutput, edge_loss
from ..core.rollout import Parents, RolloutTree, distinct_sources, num_parents, source_minibatches, split_by_parent
from ..core.seeding import generator
from ..models.base import Cond
from .health import grad_norm
from .step_log import NO_UPDATE, Update

#: loss statistics that combine over micro-batches by their maximum (the others: by their mean)
BY_MAX = frozenset({"ratio_dev_max"})


def combine(name: str, total: Any, value: Any) -> Any:
    """``total`` with one more micro-batch's ``value`` of the statistic ``name`` (:data:`BY_MAX`)."""
    if name not in BY_MAX:
        return total + value
    return value if isinstance(total, float) else torch.maximum(total, value)  # the first: 0.0


def step_problem(losses: list[Tensor], norm: Tensor, iteration: int, first_micro_batch: int) -> str | None:
    """Why an optimizer step must be refused, or None: a non-finite loss among its micro-batches'
    ``losses`` (each []; the first is micro-batch ``first_micro_batch``), or a non-finite gradient
    (its norm ``norm`` [] is non-finite exactly when a gradient element is). One host sync when all
    is finite; the messages read the values only on the way to a refusal."""
    values = torch.stack([loss.float() for loss in losses] + [norm.float().to(losses[0].device)])  # [M + 1]
    if bool(torch.isfinite(values).all()):
        return None
    for j, loss in enumerate(losses):
        if not torch.isfinite(loss):
            return f"non-finite loss {loss.item()} at iteration {iteration}, micro-batch {first_micro_batch + j}"
    return f"non-finite gradient at iteration {iteration}"


class PolicyUpdate:
    """The training step's update (see the module docstring); a base class of ``TreeGRPOModule``."""

    def _update(self, tree: RolloutTree, cond: Cond, advantages: Tensor, keep: Tensor, first_position: int) -> Update:
        """Clipped policy-gradient updates over the kept edges: ``inner_epochs`` passes, each
        shuffled into micro-batches of whole parents, one optimizer step per ``accumulate`` of
        them (a micro-batch too large for memory runs as several forwards: :attr:`training_guard`);
        a step whose loss or gradient is not finite is refused through the fault ledger."""
        optimizer = self.optimizers()
        if tree.edge_log_prob_graph is not None:
            return self._update_on_rollout_forward(optimizer, tree, advantages, keep)
        shuffle = generator(self.seed, self.iteration, first_position + 1)
        totals: list[Any] = [0.0] * len(LossOutput._fields)
        micro = steps = 0
        forwards = Compute()
        fault = None
        window: list[Tensor] = []  # the losses of this accumulation window, checked at its step
        num_updates = self._updates_per_epoch(keep)
        at_start: Tensor | None = None  # the on-policy check: the first micro-batch, before any update
        norms: list[Tensor] = []  # the gradient norm before clipping, per optimizer step
        for _ in range(self.inner_epochs):
            batches = source_minibatches(tree, keep, num_batches=num_updates * self.accumulate, generator=shuffle)
            parents = distinct_sources(tree, batches)  # sized on the host once, not per forward
            chunks = self._forwards_per_micro_batch(parents)
            for i, edges in enumerate(batches):
                last = (i + 1) % self.accumulate == 0
                if chunks[i] > 1:
                    loss, stats, n = self._split_backward(optimizer, tree, cond, advantages, edges, chunks[i], last)
                else:
                    with optimizer.toggle_model(sync_grad=last):
                        loss, stats, n = self._edge_loss(tree, cond, advantages, edges, parents[i])
                        self.manual_backward(loss / self.accumulate)
                # backpropagated even when it is not finite: every rank must run the same
                # backward passes; the optimizer step below is what the check refuses
                window.append(loss.detach())
                if at_start is None and edges.numel():
                    at_start = stats.ratio_dev_max
                forwards, micro = forwards + n, micro + 1
                totals = [combine(name, total, value) for name, total, value in zip(LossOutput._fields, totals, stats)]
                if not last:
                    continue
                norm, refused = self._optimizer_step(optimizer, window, i + 1 - len(window))
                norms.append(norm)
                window = []
                if refused is not None:
                    fault = refused
                else:
                    steps += 1
        scheduler = self.lr_schedulers()
        if scheduler is not None and steps:
            scheduler.step()
        means = (total if name in BY_MAX else total / max(micro, 1) for name, total in zip(LossOutput._fields, totals))
        mean_norm = torch.stack(norms).mean() if norms else None
        return Update(LossOutput(*means), forwards, steps, fault, at_start, mean_norm)

    def _optimizer_step(
        self, optimizer: Any, losses: list[Tensor], first_micro_batch: int
    ) -> tuple[Tensor, str | None]:
        """Close an accumulation window whose micro-batches' ``losses`` are backpropagated: measure
        the gradient norm (before clipping), clip, and step unless a loss or the gradient is not
        finite on any rank (the step's one host sync), which the fault ledger refuses. Returns the
        norm and the refusal's cause (``None``: stepped)."""
        norm = grad_norm(self.adapter.trainable_parameters())  # [] non-finite iff a gradient is
        if self.grad_clip is not None:
            self.clip_gradients(optimizer, gradient_clip_val=self.grad_clip, gradient_clip_algorithm="norm")
        problem = step_problem(losses, norm, self.iteration, first_micro_batch)
        fault = None
        if self._any_rank(problem is not None):
            fault = self.fault_ledger.refuse_update(problem, self.iteration)
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm, fault

    def _update_on_rollout_forward(self, optimizer: Any, tree: RolloutTree, advantages: Tensor, keep: Tensor) -> Update:
        """``reuse_rollout_forward``: one update on the kept edges' log-probs as the rollout
        computed them, with their graphs (no second forward). Exactly the recomputing path's
        update with one minibatch and one inner epoch: the weights have not moved since sampling,
        so the recomputed log-probs would be these (ratio 1)."""
        (edges,) = source_minibatches(tree, keep, num_batches=1)  # [K] the kept edges, by parent
        if edges.numel() == 0:
            return NO_UPDATE
        (parents,) = distinct_sources(tree, [edges])
        new_log_prob = tree.edge_log_prob_graph[edges]  # [K] with grad
        out = self.loss_fn(new_log_prob, tree.edge_old_log_prob[edges], advantages[edges], group=parents.group)
        self.manual_backward(out.loss)
        stats = LossOutput(*(value.detach() for value in out))
        norm, fault = self._optimizer_step(optimizer, [stats.loss], 0)
        steps = int(fault is None)
        scheduler = self.lr_schedulers()
        if scheduler is not None and steps:
            scheduler.step()
        # counted as the recomputing path counts them (a trained forward per parent, its backward
        # included), so compute units compare across the two; the forward itself was the rollout's
        trained = Compute(trained=int(parents.sources.shape[0]))
        return Update(stats, trained, steps, fault, stats.ratio_dev_max, norm)

    def _forwards_per_micro_batch(self, batch_parents: list[Parents]) -> list[int]:
        """How many forwards each micro-batch runs as (the training guard's split: one each while
        they fit), the most any data-parallel rank needs, so that every rank runs the same forwards
        and backward passes (a sharded model gathers its weights in each)."""
        if not self.training_guard.active:
            return [1] * len(batch_parents)
        parents = [p.sources.shape[0] for p in batch_parents]
        chunks = self.training_guard.chunks(parents)
        if self.trainer.world_size > 1:
            most = self.trainer.strategy.reduce(torch.tensor(chunks, device=self.device), reduce_op="max")
            chunks = [int(c) for c in most.tolist()]
        if max(chunks, default=1) > 1:
            self.training_guard.announce(max(parents))
        return chunks

    def _split_backward(
        self, optimizer: Any, tree: RolloutTree, cond: Cond, advantages: Tensor, edges: Tensor, chunks: int, last: bool
    ) -> tuple[Tensor, LossOutput, Compute]:
        """One micro-batch as ``chunks`` forwards and backward passes of whole parents (gradients
        accumulated, synchronised after the last one only when ``last``): the same gradient as one
        pass up to float rounding, because the loss is a mean over parents (each parent's children
        summed or averaged first: :class:`~lit_treegrpo.core.loss.ClippedPolicyLoss`), so a part of
        ``U_j`` of the ``U`` parents weighs ``U_j / U`` (of ``B_j`` of ``B`` edges, ``B_j / B``, with
        aggregation ``"edge"``). Returns the micro-batch's loss (detached),
        its statistics combined alike (per-edge means weighted by edges) and its forwards."""
        parts = split_by_parent(tree, edges, chunks)
        parents = [num_parents(tree, part) if part.numel() else 0 for part in parts]
        total_parents, total_edges = max(sum(parents), 1), max(edges.numel(), 1)
        by_parent = {"loss", "policy_loss", "kl"}  # the other statistics are means over edges
        combined: list[Tensor | float] = [0.0] * len(LossOutput._fields)
        forwards = Compute()
        for j, part in enumerate(parts):
            with optimizer.toggle_model(sync_grad=last and j == len(parts) - 1):
                loss, stats, n = self._edge_loss(tree, cond, advantages, part)
                # the loss is a mean over parents, or over edges with aggregation "edge"
                by_edge = self.loss_fn.aggregation == "edge"
                share = part.numel() / total_edges if by_edge else parents[j] / total_parents
                self.manual_backward(loss * share / self.accumulate)
            weights = {name: share if name in by_parent else part.numel() / total_edges for name in LossOutput._fields}
            combined = [
                combine(name, total, value if name in BY_MAX else weights[name] * value)
                for total, name, value in zip(combined, LossOutput._fields, stats)
            ]
            forwards = forwards + n
        stats = LossOutput(*(torch.as_tensor(value, device=advantages.device) for value in combined))
        return stats.loss, stats, forwards

    @property
    def optimizer_steps_per_iteration(self) -> int | None:
        """Optimizer steps a training iteration takes when that is fixed (``minibatches x
        inner_epochs``; a skipped step takes none); ``None`` with ``edges_per_update``, where it
        follows the edges pruning keeps."""
        return None if self.edges_per_update is not None else self.minibatches * self.inner_epochs

    def _updates_per_epoch(self, keep: Tensor) -> int:
        """Optimizer steps per pass over the kept edges: ``minibatches``, or one per
        ``edges_per_update`` kept edges (the same count on every rank)."""
        if self.edges_per_update is None:
            return self.minibatches
        (kept,) = self._sum_over_ranks([int(keep.sum())])
        per_rank = kept / max(self.trainer.world_size, 1)
        return max(1, math.ceil(per_rank / self.edges_per_update))

    def _edge_loss(
        self, tree: RolloutTree, cond: Cond, advantages: Tensor, edges: Tensor, parents: Parents | None = None
    ) -> tuple[Tensor, LossOutput, Compute]:
        """Loss of one micro-batch of edges, its detached statistics and its counted forwards (a
        zero loss on the parameters if it is empty, so every data-parallel rank runs the same
        backward passes). ``parents``: its distinct sources, found ahead for the whole epoch
        (:func:`~lit_treegrpo.core.rollout.distinct_sources`); ``None`` finds them here."""
        if edges.numel() == 0:
            zero = sum(p.sum() for p in self.adapter.trainable_parameters()) * 0.0
            return zero, LossOutput(*(torch.zeros((), device=zero.device) for _ in LossOutput._fields)), Compute()
        kl = self.loss_fn.kl_beta > 0
        # [B] |dt| of each edge's step, which only Flow-GRPO's KL form uses (a flow adapter: checked in __init__)
        step_size = (
            self.adapter.step_size(tree.edge_step[edges]) if kl and self.loss_fn.kl_form == "flow_grpo" else None
        )
        out, forwards = edge_loss(
            self.loss_fn,
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
