"""Turn leaf rewards into one advantage per recorded edge (stochastic transition) of the tree: the
tree is flattened into (leaf, edge) path pairs, and every estimator is a few scatter reductions over
them (the softmax backup: one pass per depth level); nothing loops over nodes in Python."""

# Leaf normalisation (all but branch_fusion): per prompt, a = (r - mean) / (std + eps), population std
# (TreeGRPO) or n - 1 (std_estimator "sample": DanceGRPO's and BranchGRPO's torch.std); std_scope
# "global" takes the std over the batch's leaves (Flow-GRPO's global_std). Methods, A(e) of edge e:
# - mean (TreeGRPO code): the mean of a over the leaves below e; on chains, flat GRPO.
# - logprob_softmax (TreeGRPO paper, Alg. 1): V(leaf edge) = a, V(e) = sum_c softmax_c(old_log_prob) V(c)
#   over e's children; A = V.
# - branch_fusion (BranchGRPO eq. 7-8): F(e) = sum_l w_l r_l over the leaves below e, w = softmax(beta x
#   the old log-probs strictly below e on the path to l); A = F z-scored over the edges of one prompt
#   and depth (a group of one, or of std < 1e-6, gets 0).
# - parent_relative (the original design notes): M(e) = mean of a below e as in "mean", A(e) = M(e) - M(parent),
#   M of a root edge's missing parent = the mean of a over the prompt's leaves: the credit of the step itself,
#   so on a chain only the first recorded edge carries the trajectory's signal.
# - softmax_tb (TMPO, arXiv 2605.10983, MAIR-Lab-HUST/TMPO softmax_tb.py): per prompt, each leaf's target
#   log_softmax(beta a) minus its policy's log_softmax(P), P = the sum of the old log-probs on its path (the
#   policy matched to softmax(beta R) rather than R maximised); A(e) = the mean of that over the leaves below e.

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

from .choices import check_choice, choices

AdvantageMethod = Literal["mean", "logprob_softmax", "branch_fusion", "parent_relative", "softmax_tb"]
StdScope = Literal["group", "global"]
StdEstimator = Literal["population", "sample"]
METHODS: tuple[str, ...] = choices(AdvantageMethod)
_DEPTH_STD_FLOOR = 1e-6  # BranchGRPO: a depth group with smaller spread carries no signal


def _segment_sum(values: Tensor, index: Tensor, size: int) -> Tensor:
    """Sum ``values`` [N, ...] into ``size`` segments by ``index`` [N]."""
    out = values.new_zeros((size,) + values.shape[1:])
    return out.index_add_(0, index, values)


def _segment_softmax(logits: Tensor, index: Tensor, size: int) -> Tensor:
    """Softmax of ``logits`` [N] within each segment of ``index`` [N] (max-subtracted)."""
    seg_max = torch.full((size,), float("-inf"), dtype=logits.dtype, device=logits.device)
    seg_max = seg_max.scatter_reduce(0, index, logits, reduce="amax")  # [size]
    e = torch.exp(logits - seg_max[index])  # [N]
    return e / _segment_sum(e, index, size)[index]  # [N]


def normalize_per_group(
    values: Tensor,
    group: Tensor,
    eps: float = 1e-8,
    std_scope: StdScope = "group",
    std_estimator: StdEstimator = "population",
) -> Tensor:
    """``(v - mean) / (std + eps)`` within each group, columns independently; the population std or
    (``std_estimator="sample"``) the n - 1 one."""
    _, g = torch.unique(group, return_inverse=True)  # [L] contiguous ids
    G = int(g.max()) + 1 if g.numel() else 0
    v = values.double()  # float64: leaf counts are small, and cancellation in var would hurt
    count = _segment_sum(torch.ones_like(v), g, G)  # [G, (K)]
    mean = _segment_sum(v, g, G) / count  # [G, (K)]
    ddof = 1 if std_estimator == "sample" else 0
    var = _segment_sum((v - mean[g]).square(), g, G) / (count - ddof).clamp(min=1)  # [G, (K)]
    index = g.reshape(-1, *([1] * (v.ndim - 1))).expand_as(v)  # [L, (K)]
    hi = v.new_full((G, *v.shape[1:]), float("-inf")).scatter_reduce(0, index, v, reduce="amax")
    lo = v.new_full((G, *v.shape[1:]), float("inf")).scatter_reduce(0, index, v, reduce="amin")
    constant = (hi == lo)[g]  # [L, (K)]
    if std_scope == "global":
        std = v.std(dim=0, correction=ddof).expand_as(v)  # [L, (K)] one std per column
    else:
        std = var.sqrt()[g]  # [L, (K)]
    a = (v - mean[g]) / (std + eps)  # [L, (K)]
    return torch.where(constant, torch.zeros_like(a), a).to(values.dtype)


def combine_rewards(
    leaf_rewards: Tensor, leaf_prompt: Tensor, weights: Tensor | None = None, eps: float = 1e-8
) -> Tensor:
    """One score per leaf: a [L] reward as is; [L, K] rewards normalised per prompt and column,
    then weighted (``weights`` [K], default all ones). Integer or bool rewards count as floats."""
    if not leaf_rewards.is_floating_point():
        leaf_rewards = leaf_rewards.double()  # pass/fail checks must not be rounded after scaling
    if leaf_rewards.ndim == 1:
        if weights is not None:
            raise ValueError("reward weights need [L, K] rewards, got a single reward column")
        return leaf_rewards
    K = leaf_rewards.shape[1]
    w = torch.ones(K, dtype=leaf_rewards.dtype, device=leaf_rewards.device)
    if weights is not None:
        w = torch.as_tensor(weights, dtype=leaf_rewards.dtype, device=leaf_rewards.device)
        if w.shape != (K,):
            raise ValueError(f"reward weights have shape {tuple(w.shape)}, expected [{K}]")
    return normalize_per_group(leaf_rewards, leaf_prompt, eps) @ w  # [L]


class PathPairs(NamedTuple):
    """The tree flattened into one (leaf, edge) pair per edge on each leaf's path."""

    leaf: Tensor  # [Q] leaf index of the pair
    edge: Tensor  # [Q] edge index of the pair
    edges_below: Tensor  # [Q] recorded edges strictly below `edge` on the path to `leaf`
    log_prob_below: Tensor  # [Q] sum of old log-probs of those edges (0 if not given)


def path_pairs(edge_parent: Tensor, leaf_edge: Tensor, edge_old_log_prob: Tensor | None = None) -> PathPairs:
    """Walk every leaf's path upward, one vectorised step per depth level."""
    cols = [leaf_edge]  # column j: the ancestor j recorded edges above the leaf edge
    cur = leaf_edge
    while True:
        cur = torch.where(cur >= 0, edge_parent[cur.clamp(min=0)], cur)  # [L]
        if not bool((cur >= 0).any()):
            break
        cols.append(cur)
    path = torch.stack(cols, dim=1)  # [L, D]
    valid = path >= 0  # [L, D]
    lp = torch.zeros(path.shape, dtype=torch.float64, device=path.device)  # [L, D]
    if edge_old_log_prob is not None:
        lp = torch.where(valid, edge_old_log_prob.double()[path.clamp(min=0)], lp)
    lp_below = torch.cumsum(lp, dim=1) - lp  # [L, D] exclusive: edges strictly below column j
    leaf_idx, col = valid.nonzero(as_tuple=True)  # [Q]
    return PathPairs(leaf_idx, path[leaf_idx, col], col, lp_below[leaf_idx, col])


def check_advantage_options(method: str, std_scope: str, prefix: str = "") -> None:
    """The method and std scope are choices of their ``Literal``s, and ``std_scope`` ``global`` does
    not combine with ``branch_fusion`` (which normalises per depth): the one statement of these
    rules, for :func:`tree_advantages` and the module's advantage settings."""
    check_choice(f"{prefix}method", method, AdvantageMethod)
    check_choice(f"{prefix}std_scope", std_scope, StdScope)
    if std_scope == "global" and method == "branch_fusion":
        raise ValueError(
            f"{prefix}std_scope 'global' does not apply to branch_fusion, which normalises per depth; "
            f"use {prefix}std_scope 'group'"
        )


def tree_advantages(
    leaf_rewards: Tensor,
    edge_parent: Tensor,
    leaf_edge: Tensor,
    leaf_prompt: Tensor,
    *,
    method: AdvantageMethod = "mean",
    edge_old_log_prob: Tensor | None = None,
    beta: float = 1.0,
    eps: float = 1e-8,
    clip: float | None = None,
    std_scope: StdScope = "group",
    std_estimator: StdEstimator = "population",
) -> Tensor:
    """[E] float32 advantages in edge order from the leaf rewards [L] (one score per leaf; several rewards are combined
    beforehand by :func:`combine_rewards`); see the module docstring for the methods."""
    needs_lp = _check_inputs(leaf_rewards, edge_parent, leaf_edge, leaf_prompt, method, edge_old_log_prob, beta)
    check_advantage_options(method, std_scope, prefix="advantage ")
    check_choice("advantage std_estimator", std_estimator, StdEstimator)
    E = edge_parent.shape[0]
    if E == 0:
        return torch.zeros(0, dtype=torch.float32, device=edge_parent.device)

    score = leaf_rewards.double()  # [L]; pass/fail (bool/int) rewards count as floats
    pairs = path_pairs(edge_parent, leaf_edge, edge_old_log_prob if needs_lp else None)
    leaves_below = _segment_sum(torch.ones_like(pairs.edge, dtype=torch.float64), pairs.edge, E)
    if bool((leaves_below == 0).any()):
        orphan = (leaves_below == 0).nonzero().squeeze(1)[:8].tolist()
        raise ValueError(f"edges {orphan} have no leaf below them; the tree description is broken")

    if method == "branch_fusion":
        edge_prompt = torch.zeros(E, dtype=torch.long, device=edge_parent.device)
        edge_prompt[pairs.edge] = leaf_prompt[pairs.leaf]  # [E]
        weights = _segment_softmax(beta * pairs.log_prob_below, pairs.edge, E)  # [Q]
        fused = _segment_sum(weights * score[pairs.leaf], pairs.edge, E)  # [E]
        adv = _normalize_depthwise(fused, edge_prompt, _depth_from_pairs(pairs, E), eps, std_estimator)
    else:
        a = normalize_per_group(score, leaf_prompt, eps, std_scope, std_estimator)  # [L]
        if method == "softmax_tb":
            assert edge_old_log_prob is not None  # checked by _check_inputs
            a = _trajectory_balance_targets(a, leaf_prompt, edge_old_log_prob, pairs, beta)  # [L]
        if method in ("mean", "parent_relative", "softmax_tb"):
            adv = _segment_sum(a[pairs.leaf], pairs.edge, E) / leaves_below  # [E] M(e)
            if method == "parent_relative":
                adv = adv - _parent_value(adv, a, leaf_prompt, edge_parent, pairs)
        else:
            adv = _softmax_backup(a, leaf_edge, edge_parent, edge_old_log_prob, pairs, E)
    adv = adv.float()
    if clip is not None:
        adv = adv.clamp(-clip, clip)
    return adv


def _check_inputs(
    leaf_rewards: Tensor,
    edge_parent: Tensor,
    leaf_edge: Tensor,
    leaf_prompt: Tensor,
    method: str,
    edge_old_log_prob: Tensor | None,
    beta: float,
) -> bool:
    """Refuse inconsistent shapes and non-finite rewards; returns whether the method needs the log-probs."""
    E, L = edge_parent.shape[0], leaf_edge.shape[0]
    if leaf_rewards.ndim != 1:
        raise ValueError(
            f"leaf_rewards must be [L], got {tuple(leaf_rewards.shape)}; combine reward columns "
            "into one score first (MultiReward, or core.combine_rewards)"
        )
    if leaf_rewards.shape[0] != L or leaf_prompt.shape != (L,):
        raise ValueError(
            f"leaf_rewards {tuple(leaf_rewards.shape)}, leaf_edge {tuple(leaf_edge.shape)} and "
            f"leaf_prompt {tuple(leaf_prompt.shape)} must agree on the number of leaves"
        )
    bad = ~torch.isfinite(leaf_rewards)  # [L]
    if bool(bad.any()):
        leaves = bad.nonzero().squeeze(1)
        raise ValueError(
            f"non-finite rewards for {leaves.numel()} of {L} leaves (leaves "
            f"{leaves[:8].tolist()}, prompts {sorted(set(leaf_prompt[leaves].tolist()))[:8]})"
        )
    needs_lp = method in ("logprob_softmax", "softmax_tb") or (method == "branch_fusion" and beta != 0)
    if needs_lp and (edge_old_log_prob is None or edge_old_log_prob.shape != (E,)):
        raise ValueError(f"method {method!r} needs edge_old_log_prob of shape [{E}]")
    return needs_lp


def _depth_from_pairs(pairs: PathPairs, num_edges: int) -> Tensor:
    """[E] number of recorded ancestors of each edge (path length above it)."""
    path_len = _segment_sum(torch.ones_like(pairs.leaf), pairs.leaf, int(pairs.leaf.max()) + 1)
    depth = path_len[pairs.leaf] - 1 - pairs.edges_below  # [Q]
    out = torch.zeros(num_edges, dtype=torch.long, device=depth.device)
    out[pairs.edge] = depth
    return out


def _normalize_depthwise(
    values: Tensor, prompt: Tensor, depth: Tensor, eps: float, std_estimator: StdEstimator = "population"
) -> Tensor:
    """BranchGRPO's depth-wise normalisation over edges of the same (prompt, depth)."""
    group = prompt * (int(depth.max()) + 1) + depth  # [E]
    _, g = torch.unique(group, return_inverse=True)
    G = int(g.max()) + 1
    count = _segment_sum(torch.ones_like(values), g, G)  # [G]
    mean = _segment_sum(values, g, G) / count
    ddof = 1 if std_estimator == "sample" else 0
    std = (_segment_sum((values - mean[g]).square(), g, G) / (count - ddof).clamp(min=1)).sqrt()  # [G]
    degenerate = (count < 2) | (std < _DEPTH_STD_FLOOR)  # [G]
    out = (values - mean[g]) / (std[g] + eps)
    return torch.where(degenerate[g], torch.zeros_like(out), out)


def _segment_log_softmax(logits: Tensor, index: Tensor, size: int) -> Tensor:
    """Log-softmax of ``logits`` [N] within each segment of ``index`` [N] (max-subtracted)."""
    seg_max = torch.full((size,), float("-inf"), dtype=logits.dtype, device=logits.device)
    seg_max = seg_max.scatter_reduce(0, index, logits, reduce="amax")  # [size]
    shifted = logits - seg_max[index]  # [N]
    return shifted - _segment_sum(torch.exp(shifted), index, size).log()[index]


def _trajectory_balance_targets(
    a: Tensor, leaf_prompt: Tensor, edge_old_log_prob: Tensor, pairs: PathPairs, beta: float
) -> Tensor:
    """[L] TMPO's leaf advantage: per prompt, log_softmax(beta a) - log_softmax(P), P [L] the sum of the old
    log-probs of the edges on each leaf's path (a shared prefix counts in every leaf below it)."""
    L = a.shape[0]
    _, g = torch.unique(leaf_prompt, return_inverse=True)  # [L] contiguous prompt ids
    G = int(g.max()) + 1
    path = _segment_sum(edge_old_log_prob.double()[pairs.edge], pairs.leaf, L)  # [L]
    return _segment_log_softmax(beta * a, g, G) - _segment_log_softmax(path, g, G)


def _parent_value(value: Tensor, a: Tensor, leaf_prompt: Tensor, edge_parent: Tensor, pairs: PathPairs) -> Tensor:
    """[E] each edge's parent's ``value``, and for an edge without a recorded parent the mean of ``a`` [L] over
    its prompt's leaves (the value before any recorded step)."""
    E = edge_parent.shape[0]
    _, g = torch.unique(leaf_prompt, return_inverse=True)  # [L] contiguous prompt ids
    G = int(g.max()) + 1
    root = _segment_sum(a, g, G) / _segment_sum(torch.ones_like(a), g, G)  # [G]
    edge_group = torch.zeros(E, dtype=torch.long, device=edge_parent.device)
    edge_group[pairs.edge] = g[pairs.leaf]  # [E]
    has_parent = edge_parent >= 0
    return torch.where(has_parent, value[edge_parent.clamp(min=0)], root[edge_group])


def _softmax_backup(
    a: Tensor,
    leaf_edge: Tensor,
    edge_parent: Tensor,
    edge_old_log_prob: Tensor | None,
    pairs: PathPairs,
    E: int,
) -> Tensor:
    """TreeGRPO's post-order backup, one vectorised pass per depth level (deepest first)."""
    assert edge_old_log_prob is not None  # checked by the caller
    depth = _depth_from_pairs(pairs, E)  # [E]
    ends = leaf_edge >= 0  # [L] leaves below at least one edge
    a_end, end_edge = a[ends], leaf_edge[ends]
    has_leaf = _segment_sum(torch.ones_like(a_end), end_edge, E)  # [E] leaves ending on the edge
    value = _segment_sum(a_end, end_edge, E) / has_leaf.clamp(min=1)  # [E] leaf edges: mean a
    lp = edge_old_log_prob.double()
    has_parent = edge_parent >= 0
    for d in range(int(depth.max()), 0, -1):
        child = ((depth == d) & has_parent).nonzero().squeeze(1)  # [C] edges at depth d
        parent = edge_parent[child]  # [C]
        w = _segment_softmax(lp[child], parent, E)  # [C] softmax over siblings
        backed = _segment_sum(w * value[child], parent, E)  # [E], nonzero at parents only
        is_parent = torch.zeros(E, dtype=torch.bool, device=a.device)
        is_parent[parent] = True
        value = torch.where(is_parent, backed, value)
    return value
