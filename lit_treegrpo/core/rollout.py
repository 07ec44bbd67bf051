"""Grow the tree of denoising trajectories, batching a whole depth into one model call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from .spec import TreeSpec
from .steps import StepOutput

PredictFn = Callable[[Tensor, "int | Tensor", Any], Tensor]


class StepFn(Protocol):
    def __call__(
        self,
        model_output: Tensor,
        x: Tensor,
        step_index: int | Tensor,
        *,
        stochastic: bool,
        noise: Tensor | None = None,
        prev_sample: Tensor | None = None,
    ) -> StepOutput: ...


def index_cond(cond: Any, index: Tensor) -> Any:
    """Rows ``index`` of every tensor in the pytree ``cond`` (prompt dimension first)."""
    return pytree.tree_map(lambda t: t[index] if isinstance(t, Tensor) else t, cond)


def _num_cond_rows(cond: Any) -> int:
    sizes = {t.shape[0] for t in pytree.tree_leaves(cond) if isinstance(t, Tensor)}
    if len(sizes) != 1:
        raise ValueError(f"cond must be a pytree of tensors sharing their first (prompt) dimension, got sizes {sizes}")
    return sizes.pop()


@dataclass(frozen=True)
class RolloutTree:
    """Everything one rollout recorded, as flat tensors (the plain-tensor tree description)."""

    source_x: Tensor  # [Ns, *S] state when the stochastic step starts (model dtype)
    source_step: Tensor  # [Ns] long, denoising step index
    source_prompt: Tensor  # [Ns] long, prompt index
    edge_source: Tensor  # [E] long, index into source_*
    edge_parent: Tensor  # [E] long, previous recorded edge on the path, -1 if none
    edge_depth: Tensor  # [E] long, number of recorded ancestors
    edge_x_next: Tensor  # [E, *S] sampled next state
    edge_old_log_prob: Tensor  # [E] float32, log-prob at sampling time
    leaf_latents: Tensor  # [L, *S] final latents
    leaf_edge: Tensor  # [L] long, last recorded edge above the leaf, -1 if none
    leaf_prompt: Tensor  # [L] long
    num_prompts: int
    nfe: int  # model evaluations (batch elements, CFG doubling excluded)
    num_model_calls: int  # predict() invocations

    @property
    def num_edges(self) -> int:
        return self.edge_parent.shape[0]

    @property
    def num_leaves(self) -> int:
        return self.leaf_edge.shape[0]

    @property
    def edge_step(self) -> Tensor:  # [E]
        return self.source_step[self.edge_source]

    @property
    def edge_prompt(self) -> Tensor:  # [E]
        return self.source_prompt[self.edge_source]

    @property
    def edge_x_t(self) -> Tensor:  # [E, *S] (materialised; sources are stored once per parent)
        return self.source_x[self.edge_source]


def _chunked_predict(predict: PredictFn, x: Tensor, step_index: int, cond: Any, max_batch: int) -> tuple[Tensor, int]:
    """``predict`` over ``x`` in chunks of at most ``max_batch`` rows; returns (output, calls)."""
    n = x.shape[0]
    if n <= max_batch:
        return predict(x, step_index, cond), 1
    outs = []
    for lo in range(0, n, max_batch):
        rows = torch.arange(lo, min(lo + max_batch, n), device=x.device)
        outs.append(predict(x[lo : lo + max_batch], step_index, index_cond(cond, rows)))
    return torch.cat(outs), len(outs)


def _step_noise(
    shape: torch.Size,
    rows_per_prompt: int,
    generator: torch.Generator | Sequence[torch.Generator] | None,
    device: torch.device,
) -> Tensor:
    """Standard normal noise [N, *S] for one stochastic step, per prompt when given a list."""
    if not isinstance(generator, Sequence):
        return torch.randn(shape, generator=generator, device=device)
    rows = (rows_per_prompt, *shape[1:])
    return torch.cat([torch.randn(rows, generator=g, device=device) for g in generator])


def root_noise(
    draw: Callable[[int, torch.Generator], Tensor], generators: Sequence[torch.Generator], spec: TreeSpec
) -> Tensor:
    """Root latents [P * spec.num_trees, *S] for ``rollout``, prompt-major: ``draw(n, generator)``
    (an adapter's ``initial_noise``) gives each prompt's roots from its own generator; with
    ``spec.shared_noise`` one noise per prompt, repeated for its ``num_trees`` roots (DanceGRPO)."""
    per_prompt = 1 if spec.shared_noise else spec.num_trees
    noise = torch.cat([draw(per_prompt, g) for g in generators])  # [P * per_prompt, *S]
    return noise.repeat_interleave(spec.num_trees, dim=0) if spec.shared_noise else noise


class _Recorder:
    """What a rollout records step by step (sources, edges, counts), joined into a :class:`RolloutTree`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sources_x: list[Tensor] = []
        self.sources_step: list[Tensor] = []
        self.sources_prompt: list[Tensor] = []
        self.edges: dict[str, list[Tensor]] = {k: [] for k in ("source", "parent", "depth", "x_next", "lp")}
        self.num_sources = self.num_edges = self.nfe = self.calls = 0

    def stochastic(
        self,
        step: StepFn,
        t: int,
        k: int,
        x: Tensor,
        model_output: Tensor,
        node: tuple[Tensor, Tensor, Tensor],
        eps: Callable[[torch.Size], Tensor],
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Record step ``t``'s sources and its ``k`` children per node; ``node``: (prompt, edge, depth)
        of the frontier [N]; ``eps(shape)`` draws the step's noise. Returns the children's states,
        edges and depths [N*k]."""
        node_prompt, node_edge, node_depth = node
        n, device = x.shape[0], self.device
        self.sources_x.append(x)
        self.sources_step.append(torch.full((n,), t, dtype=torch.long, device=device))
        self.sources_prompt.append(node_prompt)
        source_ids = torch.arange(self.num_sources, self.num_sources + n, device=device)  # [N]
        self.num_sources += n
        if k > 1:
            model_output = model_output.repeat_interleave(k, dim=0)  # [N*k, *S]
            x = x.repeat_interleave(k, dim=0)  # [N*k, *S]
        out = step(model_output, x, t, stochastic=True, noise=eps(x.shape))
        edge_ids = torch.arange(self.num_edges, self.num_edges + n * k, device=device)  # [N*k]
        self.num_edges += n * k
        self.edges["source"].append(source_ids.repeat_interleave(k))
        self.edges["parent"].append(node_edge.repeat_interleave(k))
        self.edges["depth"].append(node_depth.repeat_interleave(k))
        self.edges["x_next"].append(out.prev_sample)
        self.edges["lp"].append(out.log_prob.float())
        return out.prev_sample, edge_ids, (node_depth + 1).repeat_interleave(k)

    def tree(
        self, leaves: Tensor, leaf_edge: Tensor, leaf_prompt: Tensor, num_prompts: int, noise: Tensor
    ) -> RolloutTree:
        shape = tuple(noise.shape[1:])

        def cat(parts: list[Tensor], dtype: torch.dtype, tail: tuple[int, ...] = ()) -> Tensor:
            if parts:
                return torch.cat(parts)
            return torch.empty((0, *tail), dtype=dtype, device=self.device)

        edges = self.edges
        return RolloutTree(
            source_x=cat(self.sources_x, noise.dtype, shape),
            source_step=cat(self.sources_step, torch.long),
            source_prompt=cat(self.sources_prompt, torch.long),
            edge_source=cat(edges["source"], torch.long),
            edge_parent=cat(edges["parent"], torch.long),
            edge_depth=cat(edges["depth"], torch.long),
            edge_x_next=cat(edges["x_next"], noise.dtype, shape),
            edge_old_log_prob=cat(edges["lp"], torch.float32),
            leaf_latents=leaves,
            leaf_edge=leaf_edge,
            leaf_prompt=leaf_prompt,
            num_prompts=num_prompts,
            nfe=self.nfe,
            num_model_calls=self.calls,
        )


def _check_rollout(cond: Any, noise: Tensor, spec: TreeSpec, generator: Any, max_batch: int) -> int:
    """The number of prompts P of ``cond``, checked against the noise rows and generators."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    P = _num_cond_rows(cond)
    if noise.shape[0] != P * spec.num_trees:
        raise ValueError(
            f"noise has {noise.shape[0]} rows, expected num_prompts * num_trees = "
            f"{P} * {spec.num_trees} = {P * spec.num_trees}"
        )
    if isinstance(generator, Sequence) and len(generator) != P:
        raise ValueError(f"got {len(generator)} generators for {P} prompts; give one per prompt")
    return P


@torch.no_grad()
def rollout(
    predict: PredictFn,
    step: StepFn,
    spec: TreeSpec,
    cond: Any,
    noise: Tensor,
    *,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    max_batch: int = 64,
) -> RolloutTree:
    """Grow ``spec``'s tree for every prompt of ``cond`` (P rows) from the root ``noise``
    [P * num_trees, *S], prompt-major; ``generator``: one, one per prompt, or None (global RNG)."""
    P = _check_rollout(cond, noise, spec, generator, max_batch)
    device = noise.device
    x = noise  # [N, *S] frontier states
    node_prompt = torch.arange(P, device=device).repeat_interleave(spec.num_trees)  # [N]
    node_edge = torch.full((x.shape[0],), -1, dtype=torch.long, device=device)  # [N]
    node_depth = torch.zeros_like(node_edge)  # [N] recorded edges above the node
    node_cond = index_cond(cond, node_prompt)  # cond rows per node; changes only at splits
    record = _Recorder(device)
    for t in range(spec.num_steps):
        model_output, c = _chunked_predict(predict, x, t, node_cond, max_batch)  # [N, *S]
        record.nfe += x.shape[0]
        record.calls += c
        if not spec.is_stochastic(t):
            x = step(model_output, x, t, stochastic=False).prev_sample  # [N, *S]
            continue
        k = spec.children_at(t)
        rows_per_prompt = spec.nodes_at(t) * k  # frontier rows of each prompt, contiguous

        def eps(shape: torch.Size) -> Tensor:  # [N*k, *S] float32
            drawn = _step_noise(shape, rows_per_prompt, generator, device)  # noqa: B023 (called at once)
            if k > 1 and spec.split_noise_scale != 1.0:  # noqa: B023
                return drawn * spec.split_noise_scale  # wider draws, scored with the step's own std
            return drawn

        x, node_edge, node_depth = record.stochastic(
            step, t, k, x, model_output, (node_prompt, node_edge, node_depth), eps
        )
        if k > 1:
            node_prompt = node_prompt.repeat_interleave(k)
            node_cond = index_cond(cond, node_prompt)
    return record.tree(x, node_edge, node_prompt, P, noise)


class Parents(NamedTuple):
    """The distinct sources (parents) of a micro-batch of edges, as ``torch.unique`` with
    ``return_inverse`` gives them (ascending), found ahead of the training pass."""

    sources: Tensor  # [U] long, ascending source indices
    group: Tensor  # [B] long, each edge's position in ``sources``


def dense_ids(values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.unique(values, return_inverse=True)`` without asking the device how many distinct values there are (no
    host sync): ``(ids, ordered, first)``, each [B]: every value's position among the distinct values in ascending
    order, the values sorted, and where in ``ordered`` each distinct value first appears (``ordered[first]`` are the
    distinct values; ``first.sum()`` of them)."""
    ordered, order = torch.sort(values, stable=True)  # [B]
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[1:] = ordered[1:] != ordered[:-1]  # [B]
    ids = torch.empty_like(order).scatter_(0, order, torch.cumsum(first.long(), 0) - 1)  # [B] 0 .. U-1
    return ids, ordered, first


def distinct_sources(tree: RolloutTree, batches: Sequence[Tensor]) -> list[Parents]:
    """:class:`Parents` of every micro-batch of edges in ``batches`` with one host read for all of
    them (how many parents each has), so that the training pass that follows never waits on the
    device to size a forward (``torch.unique`` does, once per call, on an accelerator)."""
    ranked = [dense_ids(tree.edge_source[edges]) for edges in batches]  # per batch: [B] each
    sizes = torch.stack([first.sum() for _, _, first in ranked]).tolist() if ranked else []  # the one host read
    return [
        Parents(ordered[torch.nonzero_static(first, size=int(size)).squeeze(1)], group)  # [U], [B]
        for (group, ordered, first), size in zip(ranked, sizes)
    ]


class EdgeLogProbs(NamedTuple):
    """Log-probs of a minibatch of edges recomputed by the current policy (with grad)."""

    step: StepOutput  # fields [B] / [B, *S] for the B requested edges, in request order
    group: Tensor  # [B] long, index of each edge's source within the minibatch (0 .. U-1)
    num_forwards: int  # U: model evaluations spent (one per distinct source)


def recompute_log_probs(
    predict: PredictFn, step: StepFn, tree: RolloutTree, edge_ids: Tensor, cond: Any, parents: Parents | None = None
) -> EdgeLogProbs:
    """Re-evaluate the recorded transitions ``edge_ids`` [B] under the current model."""
    if parents is None:
        parents = Parents(*torch.unique(tree.edge_source[edge_ids], return_inverse=True))
    sources, group = parents  # [U], [B]
    x = tree.source_x[sources]  # [U, *S]
    steps = tree.source_step[sources]  # [U]
    model_output = predict(x, steps, index_cond(cond, tree.source_prompt[sources]))  # [U, *S]
    out = step(
        model_output[group],
        x[group],
        steps[group],
        stochastic=True,
        prev_sample=tree.edge_x_next[edge_ids],
    )
    return EdgeLogProbs(out, group, int(sources.shape[0]))


def source_minibatches(
    tree: RolloutTree,
    keep: Tensor,
    sources_per_batch: int | None = None,
    *,
    num_batches: int | None = None,
    generator: torch.Generator | None = None,
) -> list[Tensor]:
    """Shuffle the kept edges into minibatches that never split a parent's children."""
    if (sources_per_batch is None) == (num_batches is None):
        raise ValueError("give exactly one of sources_per_batch and num_batches")
    if sources_per_batch is not None and sources_per_batch < 1:
        raise ValueError(f"sources_per_batch must be >= 1, got {sources_per_batch}")
    if num_batches is not None and num_batches < 1:
        raise ValueError(f"num_batches must be >= 1, got {num_batches}")
    if keep.shape != tree.edge_parent.shape:
        raise ValueError(f"keep mask has shape {tuple(keep.shape)}, expected [{tree.num_edges}]")
    kept = keep.nonzero().squeeze(1)  # [K]
    sources, which = torch.unique(tree.edge_source[kept], return_inverse=True)  # [U], [K]
    U = sources.shape[0]
    perm = torch.randperm(U, generator=generator).to(kept.device)  # [U]
    rank = torch.empty_like(perm)
    rank[perm] = torch.arange(U, device=perm.device)  # [U] position after shuffle
    if num_batches is not None:
        batch_of_source = rank * num_batches // max(U, 1)  # [U] contiguous near-equal chunks
        total = num_batches
    else:
        batch_of_source = rank // sources_per_batch  # [U]
        total = -(-U // sources_per_batch)  # ceil
    order = torch.argsort(rank[which] * max(tree.num_edges, 1) + kept)  # shuffled sources, edges in order
    kept = kept[order]
    counts = torch.bincount(batch_of_source[which[order]], minlength=total).tolist()
    return list(torch.split(kept, counts))


def split_by_parent(tree: RolloutTree, edges: Tensor, chunks: int) -> list[Tensor]:
    """Split a minibatch of edges [B] into ``chunks`` parts of near-equal parent (source) counts that never split a
    parent's children: the forwards of a micro-batch too large for one (some parts empty when it has fewer parents)."""
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    _, parent = torch.unique(tree.edge_source[edges], return_inverse=True)  # [B] 0 .. U-1
    U = int(parent.max()) + 1 if edges.numel() else 0
    part = parent * chunks // max(U, 1)  # [B] contiguous near-equal runs of parents
    return [edges[part == j] for j in range(chunks)]


def num_parents(tree: RolloutTree, edges: Tensor) -> int:
    """Distinct sources of the edges [B]: the rows of their training forward."""
    return int(torch.unique(tree.edge_source[edges]).numel())


__all__ = [
    "EdgeLogProbs",
    "Parents",
    "PredictFn",
    "RolloutTree",
    "StepFn",
    "dense_ids",
    "distinct_sources",
    "index_cond",
    "num_parents",
    "recompute_log_probs",
    "rollout",
    "source_minibatches",
    "split_by_parent",
]
