"""tree_advantages: hand-derived trees, a slow per-node reference on real rollouts, edge cases.

The reference below follows the module docstring of ``lit_treegrpo.core.advantages`` (and the
estimators' summary in docs/concepts.md) node by node, with Python lists,
recursion and ``statistics``; the implementation under test is vectorised over (leaf, edge) pairs.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import defaultdict

import pytest
import torch
from torch import Tensor

from lit_treegrpo.core.advantages import METHODS, check_advantage_options, combine_rewards, tree_advantages
from lit_treegrpo.core.rollout import RolloutTree, rollout
from lit_treegrpo.core.spec import TreeSpec
from lit_treegrpo.core.steps import StepOutput, flow_sde_step

SQ5 = math.sqrt(5.0)
LN2, LN3, LN4 = math.log(2.0), math.log(3.0), math.log(4.0)


def _t(values, dtype=torch.float32) -> Tensor:
    return torch.tensor(values, dtype=dtype)


def _long(values) -> Tensor:
    return torch.tensor(values, dtype=torch.long)


def _close(actual: Tensor, expected, atol: float = 1e-6) -> None:
    expected = torch.as_tensor(expected, dtype=torch.float32)
    assert actual.dtype == torch.float32
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0.0)


# ----------------------------------------------------------------------------- a cheap model
class _Toy:
    """``v = 0.1 x + cond`` on a linear sigma schedule; Flow-GRPO SDE when stochastic, else ODE."""

    def __init__(self, num_steps: int) -> None:
        self.sigmas = torch.linspace(1.0, 0.0, num_steps + 1)  # [T+1]

    def predict(self, x: Tensor, step_index, cond: Tensor) -> Tensor:
        return 0.1 * x + cond  # [N, D]

    def step(self, model_output, x, step_index, *, stochastic, noise=None, prev_sample=None) -> StepOutput:
        t = torch.as_tensor(step_index)
        return flow_sde_step(
            model_output,
            x,
            self.sigmas[t],
            self.sigmas[t + 1],
            dynamics="flow_sde" if stochastic else "ode",
            noise=noise,
            prev_sample=prev_sample,
        )


def _grow(spec: TreeSpec, num_prompts: int, gen: torch.Generator, dim: int = 4) -> RolloutTree:
    toy = _Toy(spec.num_steps)
    cond = torch.randn(num_prompts, dim, generator=gen)  # [P, D]
    noise = torch.randn(num_prompts * spec.num_trees, dim, generator=gen)  # [P*G, D]
    return rollout(toy.predict, toy.step, spec, cond, noise, generator=gen, max_batch=4096)


# ----------------------------------------------------------------------------- slow reference
def _normalise(values: list[float], prompts: list[int], eps: float) -> list[float]:
    """(v - mean) / (pstdev + eps) within each prompt."""
    out = [0.0] * len(values)
    for p in set(prompts):
        idx = [i for i, q in enumerate(prompts) if q == p]
        vals = [values[i] for i in idx]
        mu, sd = statistics.fmean(vals), statistics.pstdev(vals)
        for i in idx:
            out[i] = (values[i] - mu) / (sd + eps)
    return out


def _softmax(logits: list[float]) -> list[float]:
    m = max(logits)
    ex = [math.exp(z - m) for z in logits]
    total = sum(ex)
    return [v / total for v in ex]


def reference_advantages(
    rewards,
    edge_parent: list[int],
    leaf_edge: list[int],
    leaf_prompt: list[int],
    method: str,
    old_log_prob: list[float] | None = None,
    beta: float = 1.0,
    eps: float = 1e-8,
    weights: list[float] | None = None,
) -> list[float]:
    """Per-node implementation of the contract, for small trees."""
    E, L = len(edge_parent), len(leaf_edge)
    children: list[list[int]] = [[] for _ in range(E)]
    for e, p in enumerate(edge_parent):
        if p >= 0:
            children[p].append(e)
    ending: list[list[int]] = [[] for _ in range(E)]  # leaves whose last recorded edge is e
    for leaf, e in enumerate(leaf_edge):
        if e >= 0:
            ending[e].append(leaf)

    def leaves_below(e: int) -> list[int]:
        out = list(ending[e])
        for c in children[e]:
            out += leaves_below(c)
        return out

    def strictly_below(leaf: int, e: int) -> list[int]:
        """Edges on the path of ``leaf`` that lie below ``e`` (e excluded)."""
        out, cur = [], leaf_edge[leaf]
        while cur != e:
            out.append(cur)
            cur = edge_parent[cur]
            assert cur >= 0, "e is not on the leaf's path"
        return out

    def depth(e: int) -> int:
        d, cur = 0, edge_parent[e]
        while cur >= 0:
            d, cur = d + 1, edge_parent[cur]
        return d

    if isinstance(rewards[0], list):  # [L, K]: each column per prompt, then the weighted sum
        K = len(rewards[0])
        w = weights if weights is not None else [1.0] * K
        cols = [_normalise([row[k] for row in rewards], leaf_prompt, eps) for k in range(K)]
        score = [sum(w[k] * cols[k][leaf] for k in range(K)) for leaf in range(L)]
    else:
        score = list(rewards)
    below = [leaves_below(e) for e in range(E)]
    prompt_of = [leaf_prompt[below[e][0]] for e in range(E)]

    if method == "branch_fusion":
        fused = []
        for e in range(E):
            logits = [
                beta * sum(old_log_prob[x] for x in strictly_below(leaf, e)) if beta != 0 else 0.0 for leaf in below[e]
            ]
            w = _softmax(logits)
            fused.append(sum(wi * score[leaf] for wi, leaf in zip(w, below[e])))
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for e in range(E):
            groups[(prompt_of[e], depth(e))].append(e)
        adv = [0.0] * E
        for members in groups.values():
            vals = [fused[e] for e in members]
            if len(vals) < 2:
                continue
            mu, sd = statistics.fmean(vals), statistics.pstdev(vals)
            if sd < 1e-6:
                continue
            for e in members:
                adv[e] = (fused[e] - mu) / (sd + eps)
        return adv

    a = _normalise(score, leaf_prompt, eps)
    if method == "softmax_tb":  # TMPO: per prompt, log_softmax(beta a) - log_softmax(path log-prob), then "mean"
        path = []
        for leaf in range(L):
            total, cur = 0.0, leaf_edge[leaf]
            while cur >= 0:
                total, cur = total + old_log_prob[cur], edge_parent[cur]
            path.append(total)

        def log_softmax(values: list[float], leaf: int) -> float:
            group = [values[j] for j in range(L) if leaf_prompt[j] == leaf_prompt[leaf]]
            return values[leaf] - math.log(sum(math.exp(v) for v in group))

        scaled = [beta * v for v in a]
        a = [log_softmax(scaled, leaf) - log_softmax(path, leaf) for leaf in range(L)]
        method = "mean"
    M = [statistics.fmean(a[leaf] for leaf in below[e]) for e in range(E)]
    if method == "mean":
        return M
    if method == "parent_relative":
        root = {p: statistics.fmean(a[leaf] for leaf in range(L) if leaf_prompt[leaf] == p) for p in set(leaf_prompt)}
        return [M[e] - (M[edge_parent[e]] if edge_parent[e] >= 0 else root[prompt_of[e]]) for e in range(E)]
    assert method == "logprob_softmax"
    memo: dict[int, float] = {}

    def value(e: int) -> float:
        if e not in memo:
            if not children[e]:
                assert len(ending[e]) == 1
                memo[e] = a[ending[e][0]]
            else:
                w = _softmax([old_log_prob[c] for c in children[e]])
                memo[e] = sum(wi * value(c) for wi, c in zip(w, children[e]))
        return memo[e]

    return [value(e) for e in range(E)]


# ----------------------------------------------------------------------------- hand-derived trees
# Depth-2 tree, one prompt. The root splits into e0, e1 (no recorded parent); e0 splits into the
# leaf edges e2, e3 and e1 into e4, e5. It is exactly what rollout() records for
# TreeSpec(3, branch_steps=(0, 1), branching=2) (checked below).
#
#   leaf rewards r = [1, 3, 2, 4] on e2, e3, e4, e5
#   mean 2.5, deviations [-1.5, 0.5, -0.5, 1.5], population var (2.25+0.25+0.25+2.25)/4 = 5/4,
#   std sqrt(5)/2, so a = dev / std = [-3, 1, -1, 3] / sqrt(5)
#
#   old log-probs: e0 = ln2, e1 = ln3 (root edges: no method may use them for this tree),
#   e2 = 0, e3 = ln4  -> softmax over {e2, e3} = [1/5, 4/5]
#   e4 = ln4, e5 = 0  -> softmax over {e4, e5} = [4/5, 1/5]
EP = [-1, -1, 0, 0, 1, 1]
LEAF_EDGE = [2, 3, 4, 5]
R = [1.0, 3.0, 2.0, 4.0]
LP = [LN2, LN3, 0.0, LN4, LN4, 0.0]
A = [-3 / SQ5, 1 / SQ5, -1 / SQ5, 3 / SQ5]  # normalised leaf rewards

EXPECTED = {
    # mean: leaf edges carry a; e0 = (a0 + a1)/2 = (-3 + 1)/2/sqrt5 = -1/sqrt5,
    # e1 = (a2 + a3)/2 = (-1 + 3)/2/sqrt5 = 1/sqrt5.
    "mean": [-1 / SQ5, 1 / SQ5, *A],
    # logprob_softmax: V(e0) = 1/5 a0 + 4/5 a1 = (-3/5 + 4/5)/sqrt5 = 1/(5 sqrt5);
    # V(e1) = 4/5 a2 + 1/5 a3 = (-4/5 + 3/5)/sqrt5 = -1/(5 sqrt5); leaf edges V = a.
    "logprob_softmax": [1 / (5 * SQ5), -1 / (5 * SQ5), *A],
    # parent_relative: root edges minus the prompt's mean a (0): e0 = -1/sqrt5, e1 = 1/sqrt5; leaf
    # edges minus their parent's mean: e2 = (-3 + 1)/sqrt5 = -2/sqrt5, e3 = (1 + 1)/sqrt5 = 2/sqrt5,
    # e4 = (-1 - 1)/sqrt5 = -2/sqrt5, e5 = (3 - 1)/sqrt5 = 2/sqrt5.
    "parent_relative": [-1 / SQ5, 1 / SQ5, -2 / SQ5, 2 / SQ5, -2 / SQ5, 2 / SQ5],
}
# branch_fusion, depth 1 (leaf edges): nothing strictly below, one leaf each, F = raw r =
# [1, 3, 2, 4]; over the group {e2..e5}: mean 2.5, pstd sqrt5/2 -> A = a. Depth 0 {e0, e1}, weights
# softmax(beta * lp of the leaf edge):
#   beta = 0: uniform, F(e0) = (1 + 3)/2 = 2, F(e1) = (2 + 4)/2 = 3; mean 2.5, pstd 0.5 -> [-1, 1].
#   beta = 1: [1/5, 4/5] and [4/5, 1/5]: F(e0) = 1/5 + 12/5 = 2.6, F(e1) = 8/5 + 4/5 = 2.4;
#             mean 2.5, pstd 0.1 -> [1, -1] (the path weighting flips the order).
#   beta = ln3/ln4: 4**beta = 3, weights [1/4, 3/4] and [3/4, 1/4]: F(e0) = 1/4 + 9/4 = 2.5,
#             F(e1) = 6/4 + 4/4 = 2.5; sigma = 0 (< 1e-6) -> both 0.
BRANCH_FUSION = {
    0.0: [-1.0, 1.0, *A],
    1.0: [1.0, -1.0, *A],
    LN3 / LN4: [0.0, 0.0, *A],
}


def _hand(method: str, rewards=R, lp=LP, **kw) -> Tensor:
    return tree_advantages(
        _t(rewards),
        _long(EP),
        _long(LEAF_EDGE),
        _long([0, 0, 0, 0]),
        method=method,
        edge_old_log_prob=_t(lp),
        **kw,
    )


def test_hand_tree_is_what_rollout_records():
    tree = _grow(TreeSpec(3, branch_steps=(0, 1), branching=2), 1, torch.Generator().manual_seed(0))
    assert tree.edge_parent.tolist() == EP
    assert tree.leaf_edge.tolist() == LEAF_EDGE
    assert tree.edge_depth.tolist() == [0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("method", ["mean", "logprob_softmax", "parent_relative"])
def test_hand_depth2(method):
    out = _hand(method)
    assert out.shape == (6,)
    _close(out, EXPECTED[method])


# softmax_tb, beta = 0 (a uniform target): path log-probs P = [ln2 + 0, ln2 + ln4, ln3 + ln4, ln3 + 0] =
# ln[2, 8, 12, 3], so softmax(P) = [2, 8, 12, 3]/25 and a leaf's advantage is ln(1/4) - ln(p) = ln(25/(4 [2, 8,
# 12, 3])) = ln[25/8, 25/32, 25/48, 25/12]; e0 the mean of the first two, ln(25/16); e1 of the last two, ln(25/24).
SOFTMAX_TB_BETA0 = [math.log(25 / 16), math.log(25 / 24), *(math.log(25 / x) for x in (8, 32, 48, 12))]


def test_hand_depth2_softmax_tb():
    _close(_hand("softmax_tb", beta=0.0), SOFTMAX_TB_BETA0)
    # beta = 1: the target log_softmax(a) adds a - ln(sum e^a) to each leaf, the same P term
    u = 1 / SQ5
    log_z = math.log(math.exp(-3 * u) + math.exp(u) + math.exp(-u) + math.exp(3 * u))
    leaves = [a - log_z + math.log(4) + b for a, b in zip(A, SOFTMAX_TB_BETA0[2:])]
    _close(_hand("softmax_tb", beta=1.0), [(leaves[0] + leaves[1]) / 2, (leaves[2] + leaves[3]) / 2, *leaves])


def test_softmax_tb_matches_its_target_when_the_policy_does():
    # a policy whose path probabilities already are softmax(beta a) gets no advantage anywhere
    a, beta = torch.tensor(A, dtype=torch.float64), 0.7
    lp = list(LP)
    target = torch.log_softmax(beta * a, 0).tolist()  # put each leaf's path log-prob on its leaf edge
    for leaf, edge in enumerate(LEAF_EDGE):
        lp[edge] = target[leaf] - lp[EP[edge]]
    _close(_hand("softmax_tb", lp=lp, beta=beta), [0.0] * 6)


@pytest.mark.parametrize("beta", sorted(BRANCH_FUSION))
def test_hand_depth2_branch_fusion(beta):
    _close(_hand("branch_fusion", beta=beta), BRANCH_FUSION[beta])


def test_branch_fusion_std_floor_is_on_the_raw_reward_scale():
    # Raw rewards R * 1e-7: depth 1 has pstd sqrt5/2 * 1e-7 and depth 0 (beta = 1) 0.1 * 1e-7, both
    # below the 1e-6 floor, so every edge gets 0 (without the floor: the BRANCH_FUSION[1.0] signs).
    _close(_hand("branch_fusion", rewards=[r * 1e-7 for r in R], beta=1.0), [0.0] * 6, atol=0.0)
    # At 1e-4 both spreads are above the floor: the numbers of R, up to eps / sigma ~ 1e-4 relative.
    out = _hand("branch_fusion", rewards=[r * 1e-4 for r in R], beta=1.0)
    _close(out, BRANCH_FUSION[1.0], atol=2e-3)


def test_branch_fusion_beta0_needs_no_log_probs():
    out = tree_advantages(_t(R), _long(EP), _long(LEAF_EDGE), _long([0, 0, 0, 0]), method="branch_fusion", beta=0.0)
    _close(out, BRANCH_FUSION[0.0])


def test_hand_two_prompts_normalised_separately():
    # Two copies of the depth-2 tree in rollout order: the 4 root edges first (prompt 0's e0, e1,
    # then prompt 1's), then the 8 leaf edges. Prompt 1's rewards are 10 r + 100: per-prompt
    # normalisation (and BranchGRPO's per-prompt depth groups) are invariant to that, so both
    # prompts get exactly the one-prompt numbers. Pooling the prompts would not: the pooled mean
    # is ~63 and prompt 0's leaves would all sit near -1.
    edge_parent = [-1, -1, -1, -1, 0, 0, 1, 1, 2, 2, 3, 3]
    leaf_edge = [4, 5, 6, 7, 8, 9, 10, 11]
    leaf_prompt = [0, 0, 0, 0, 1, 1, 1, 1]
    rewards = R + [10 * r + 100 for r in R]
    lp = LP[:2] + LP[:2] + LP[2:] + LP[2:]

    def two(per_prompt: list[float]) -> list[float]:
        return per_prompt[:2] * 2 + per_prompt[2:] * 2

    args = (_t(rewards), _long(edge_parent), _long(leaf_edge), _long(leaf_prompt))
    for method in ("mean", "logprob_softmax", "parent_relative"):
        out = tree_advantages(*args, method=method, edge_old_log_prob=_t(lp))
        _close(out, two(EXPECTED[method]))
    for beta, expected in BRANCH_FUSION.items():
        out = tree_advantages(*args, method="branch_fusion", edge_old_log_prob=_t(lp), beta=beta)
        _close(out, two(expected))


# Chain tree: a non-branching SDE edge between the two splits. TreeSpec(4, branch_steps=(0, 2),
# sde_steps=(1,)) records: depth 0 e0, e1 (root split); depth 1 e2 (only child of e0), e3 (only
# child of e1); depth 2 the leaf edges e4, e5 under e2 and e6, e7 under e3.
#   rewards [1, 3, 2, 4] on e4..e7, so a = [-3, 1, -1, 3]/sqrt5 as before.
#   old log-probs: e0 = ln3, e1 = 0, e2 = ln2, e3 = 3 ln2 (chain edges), e4 = 0, e5 = ln4,
#   e6 = ln4, e7 = 0.
CHAIN_EP = [-1, -1, 0, 1, 2, 2, 3, 3]
CHAIN_LEAF_EDGE = [4, 5, 6, 7]
CHAIN_LP = [LN3, 0.0, LN2, 3 * LN2, 0.0, LN4, LN4, 0.0]
CHAIN_EXPECTED = {
    # mean: a chain edge has the same leaves below as its parent: M(e0) = M(e2) = -1/sqrt5,
    # M(e1) = M(e3) = 1/sqrt5.
    "mean": [-1 / SQ5, 1 / SQ5, -1 / SQ5, 1 / SQ5, *A],
    # logprob_softmax: V(e2) = 1/5 a0 + 4/5 a1 = 1/(5 sqrt5), V(e3) = -1/(5 sqrt5) as before;
    # e0 has one child, and a softmax over one is 1 whatever its log-prob, so V(e0) = V(e2) and
    # V(e1) = V(e3).
    "logprob_softmax": [1 / (5 * SQ5), -1 / (5 * SQ5), 1 / (5 * SQ5), -1 / (5 * SQ5), *A],
    # branch_fusion, beta = 1: for e0 the path weights are
    # softmax(lp(e2) + lp(e4), lp(e2) + lp(e5)): the shared chain edge e2 cancels, [1/5, 4/5]
    # again, so F(e0) = F(e2) = 2.6 and F(e1) = F(e3) = 2.4 (e3's 3 ln2 cancels the same way).
    # Depth 0 {e0, e1} -> [1, -1], depth 1 {e2, e3} -> [1, -1], depth 2: raw rewards normalised, a.
    "branch_fusion": [1.0, -1.0, 1.0, -1.0, *A],
    # parent_relative: e0, e1 minus the prompt's mean a (0): -1/sqrt5, 1/sqrt5; the chain edges e2, e3
    # have their parent's leaves, so 0; the leaf edges minus M(e2) = -1/sqrt5 or M(e3) = 1/sqrt5:
    # e4 = -2/sqrt5, e5 = 2/sqrt5, e6 = -2/sqrt5, e7 = 2/sqrt5.
    "parent_relative": [-1 / SQ5, 1 / SQ5, 0.0, 0.0, -2 / SQ5, 2 / SQ5, -2 / SQ5, 2 / SQ5],
}
# softmax_tb, beta = 1: the paths' log-probs sum the chain edges too, P = ln[3*2*1, 3*2*4, 1*8*4, 1*8*1] =
# ln[6, 24, 32, 8], softmax(P) = [6, 24, 32, 8]/70; a leaf's advantage a - ln(sum e^a) - ln(p); e0 and its chain
# edge e2 the mean of leaves 0-1, e1 and e3 of leaves 2-3.
_LOG_Z = math.log(sum(math.exp(a) for a in A))
_CHAIN_TB = [a - _LOG_Z - math.log(p / 70) for a, p in zip(A, (6, 24, 32, 8))]
CHAIN_EXPECTED["softmax_tb"] = [
    *([(_CHAIN_TB[0] + _CHAIN_TB[1]) / 2, (_CHAIN_TB[2] + _CHAIN_TB[3]) / 2] * 2),
    *_CHAIN_TB,
]


def test_chain_tree_is_what_rollout_records():
    spec = TreeSpec(4, branch_steps=(0, 2), sde_steps=(1,), branching=2)
    tree = _grow(spec, 1, torch.Generator().manual_seed(0))
    assert tree.edge_parent.tolist() == CHAIN_EP
    assert tree.leaf_edge.tolist() == CHAIN_LEAF_EDGE


@pytest.mark.parametrize("method", METHODS)
def test_hand_chain_edge_between_splits(method):
    out = tree_advantages(
        _t(R),
        _long(CHAIN_EP),
        _long(CHAIN_LEAF_EDGE),
        _long([0, 0, 0, 0]),
        method=method,
        edge_old_log_prob=_t(CHAIN_LP),
        beta=1.0,
    )
    _close(out, CHAIN_EXPECTED[method])


# ----------------------------------------------------------------------------- random rollouts
@functools.cache
def _random_case(seed: int):
    """A rollout of a random TreeSpec (T = 8), random rewards and beta, all from one generator."""
    gen = torch.Generator().manual_seed(seed)

    def randint(lo: int, hi: int) -> int:  # inclusive
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    T = 8
    k = randint(2, 3)
    num_split = randint(2, 4)
    steps = torch.randperm(T - 1, generator=gen).tolist()  # every step but the last
    branch = sorted(steps[:num_split])
    sde = sorted(steps[num_split : num_split + randint(0, 2)])
    spec = TreeSpec(T, branch_steps=tuple(branch), branching=k, sde_steps=tuple(sde), num_trees=randint(1, 2))
    tree = _grow(spec, randint(1, 3), gen)
    rewards = torch.randn(tree.num_leaves, generator=gen) * 2.0 + 0.5  # [L]
    rewards_k = torch.randn(tree.num_leaves, 3, generator=gen) * _t([1.0, 10.0, 0.1])  # [L, 3]
    weights = torch.rand(3, generator=gen) * 2.0 - 0.5  # [3]
    beta = float(torch.rand((), generator=gen)) * 2.0
    return spec, tree, rewards, rewards_k, weights, beta


def _tree_args(tree: RolloutTree, rewards: Tensor):
    return rewards, tree.edge_parent, tree.leaf_edge, tree.leaf_prompt


def _tree_lists(tree: RolloutTree):
    return tree.edge_parent.tolist(), tree.leaf_edge.tolist(), tree.leaf_prompt.tolist()


SEEDS = range(16)


def test_random_cases_cover_the_grid():
    # The parametrised comparison below is only as good as the trees it sees.
    cases = [_random_case(s) for s in SEEDS]
    specs = [c[0] for c in cases]
    assert {s.per_split_branching[0] for s in specs} == {2, 3}
    assert {len(s.branch_steps) for s in specs} == {2, 3, 4}
    assert {s.num_trees for s in specs} == {1, 2}
    assert {c[1].num_prompts for c in cases} == {1, 2, 3}
    assert any(s.sde_steps for s in specs) and any(not s.sde_steps for s in specs)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("method", METHODS)
def test_matches_reference_on_rollouts(seed, method):
    _, tree, rewards, _, _, beta = _random_case(seed)
    out = tree_advantages(
        *_tree_args(tree, rewards),
        method=method,
        edge_old_log_prob=tree.edge_old_log_prob,
        beta=beta,
    )
    expected = reference_advantages(
        rewards.tolist(), *_tree_lists(tree), method, tree.edge_old_log_prob.tolist(), beta=beta
    )
    assert out.shape == (tree.num_edges,)
    _close(out, expected, atol=1e-5)


@pytest.mark.parametrize("seed", [1, 6, 11])
@pytest.mark.parametrize("method", METHODS)
def test_matches_reference_multi_reward(seed, method):
    _, tree, _, rewards_k, weights, beta = _random_case(seed)
    score = combine_rewards(rewards_k, tree.leaf_prompt, weights)  # what MultiReward hands over
    out = tree_advantages(
        *_tree_args(tree, score),
        method=method,
        edge_old_log_prob=tree.edge_old_log_prob,
        beta=beta,
    )
    expected = reference_advantages(
        rewards_k.tolist(),
        *_tree_lists(tree),
        method,
        tree.edge_old_log_prob.tolist(),
        beta=beta,
        weights=weights.tolist(),
    )
    _close(out, expected, atol=1e-5)


# ----------------------------------------------------------------------------- degenerate rewards
# TMPO's target is a distribution: equal rewards ask for equal path probabilities (tested below), not for nothing
REWARD_ONLY = [m for m in METHODS if m != "softmax_tb"]


@pytest.mark.parametrize("method", REWARD_ONLY)
def test_equal_rewards_per_prompt_give_exact_zeros(method):
    spec = TreeSpec(6, branch_steps=(0, 2, 3), branching=3, sde_steps=(1,), num_trees=2)
    tree = _grow(spec, 3, torch.Generator().manual_seed(1))
    per_prompt = _t([0.1, 1 / 3, -7.3])  # [P], each prompt's leaves all equal
    rewards = per_prompt[tree.leaf_prompt]  # [L]
    for beta in (0.0, 1.0):
        out = tree_advantages(
            *_tree_args(tree, rewards),
            method=method,
            edge_old_log_prob=tree.edge_old_log_prob,
            beta=beta,
        )
        assert not out.isnan().any()
        assert torch.equal(out, torch.zeros(tree.num_edges)), out.abs().max()


@pytest.mark.parametrize("method", REWARD_ONLY)
def test_equal_float64_rewards_give_exact_zeros_despite_rounding(method):
    # 27 leaves of 0.7 in float64: their computed mean is 0.7 + 2.2e-16, which / (std 0 + eps)
    # gave 2.2e-8 instead of 0 before all-equal groups were special-cased
    spec = TreeSpec(6, branch_steps=(0, 1, 2), branching=3)
    tree = _grow(spec, 2, torch.Generator().manual_seed(2))
    rewards = torch.tensor([0.7, 2.2], dtype=torch.float64)[tree.leaf_prompt]  # [L]
    out = tree_advantages(*_tree_args(tree, rewards), method=method, edge_old_log_prob=tree.edge_old_log_prob)
    assert torch.equal(out, torch.zeros(tree.num_edges)), out.abs().max()


@pytest.mark.parametrize("method", ["mean", "logprob_softmax", "branch_fusion"])
def test_flat_tree_is_flat_grpo(method):
    # G chains per prompt, every step but the last stochastic: each edge carries its trajectory's
    # per-prompt normalised reward (for branch_fusion: each depth group is the G chains of a
    # prompt).
    T, G, P = 5, 6, 2
    spec = TreeSpec(T, sde_steps=tuple(range(T - 1)), num_trees=G)
    gen = torch.Generator().manual_seed(2)
    tree = _grow(spec, P, gen)
    rewards = torch.randn(P * G, generator=gen) * 3.0 + 1.0  # [L]
    a = _normalise(rewards.tolist(), tree.leaf_prompt.tolist(), 1e-8)
    expected = [float("nan")] * tree.num_edges
    for leaf, e in enumerate(tree.leaf_edge.tolist()):
        n = 0
        while e >= 0:
            assert math.isnan(expected[e]), "chains share no edge"
            expected[e], e, n = a[leaf], tree.edge_parent[e].item(), n + 1
        assert n == T - 1
    out = tree_advantages(*_tree_args(tree, rewards), method=method, edge_old_log_prob=tree.edge_old_log_prob)
    _close(out, expected, atol=1e-5)


def test_softmax_tb_with_equal_rewards_pulls_the_paths_towards_uniform():
    # beta a = 0 for every leaf: the target is uniform, each leaf gets -ln K - log_softmax(P)
    out = _hand("softmax_tb", rewards=[2.0] * 4, beta=1.0)
    _close(out, SOFTMAX_TB_BETA0)


def test_parent_relative_on_chains_credits_only_the_first_step():
    # flat GRPO's chains: the first recorded edge carries the trajectory's normalised reward, every
    # later edge has its parent's leaves below it and so no credit of its own
    T, G, P = 5, 4, 2
    spec = TreeSpec(T, sde_steps=tuple(range(T - 1)), num_trees=G)
    gen = torch.Generator().manual_seed(3)
    tree = _grow(spec, P, gen)
    rewards = torch.randn(P * G, generator=gen)  # [L]
    out = tree_advantages(*_tree_args(tree, rewards), method="parent_relative")
    a = _normalise(rewards.tolist(), tree.leaf_prompt.tolist(), 1e-8)
    first = tree.edge_parent < 0  # [E]
    assert torch.equal(out[~first], torch.zeros(int((~first).sum())))
    root_of = {}
    for leaf, e in enumerate(tree.leaf_edge.tolist()):
        while tree.edge_parent[e] >= 0:
            e = int(tree.edge_parent[e])
        root_of[e] = a[leaf]
    _close(out[first], [root_of[e] for e in first.nonzero().squeeze(1).tolist()])


def test_no_recorded_edges_gives_empty():
    tree = _grow(TreeSpec(3), 2, torch.Generator().manual_seed(0))  # ODE only: nothing recorded
    assert tree.leaf_edge.tolist() == [-1, -1]
    for method in METHODS:
        out = tree_advantages(
            *_tree_args(tree, _t([1.0, 2.0])),
            method=method,
            edge_old_log_prob=tree.edge_old_log_prob,
        )
        assert out.shape == (0,) and out.dtype == torch.float32


# ----------------------------------------------------------------------------- several rewards
def test_multi_reward_normalises_each_column_then_the_sum():
    # Two prompts of the depth-2 tree; column 1 is on a 1000x scale and orders the leaves
    # differently, so skipping the per-column normalisation changes the ranking.
    edge_parent = [-1, -1, -1, -1, 0, 0, 1, 1, 2, 2, 3, 3]
    leaf_edge = [4, 5, 6, 7, 8, 9, 10, 11]
    leaf_prompt = [0, 0, 0, 0, 1, 1, 1, 1]
    col0 = [1.0, 3.0, 2.0, 4.0, 0.5, 0.0, 1.0, 0.25]
    col1 = [4000.0, 1000.0, 2000.0, 2500.0, -10.0, 30.0, 20.0, 0.0]
    w = [0.5, 2.0]
    # Manual: z_k = per-prompt (col_k - mean)/pstd; s = 0.5 z_0 + 2 z_1;
    # a = per-prompt (s - mean)/pstd.
    a = []
    for p in (0, 1):
        rows = range(4 * p, 4 * p + 4)
        z = []
        for col in (col0, col1):
            vals = [col[i] for i in rows]
            z.append([(v - statistics.fmean(vals)) / statistics.pstdev(vals) for v in vals])
        s = [w[0] * z0 + w[1] * z1 for z0, z1 in zip(*z)]
        a += [(v - statistics.fmean(s)) / statistics.pstdev(s) for v in s]
    rewards = torch.stack([_t(col0), _t(col1)], dim=1)  # [8, 2]
    score = combine_rewards(rewards, _long(leaf_prompt), _t(w))  # [8]
    args = (score, _long(edge_parent), _long(leaf_edge), _long(leaf_prompt))
    out = tree_advantages(*args, method="mean")
    # root edges: mean over their two leaves; leaf edges: a.
    roots = [(a[0] + a[1]) / 2, (a[2] + a[3]) / 2, (a[4] + a[5]) / 2, (a[6] + a[7]) / 2]
    _close(out, roots + a, atol=1e-5)
    # branch_fusion fuses s itself; the leaf-edge depth group of a prompt normalises s again -> a.
    bf = tree_advantages(*args, method="branch_fusion", beta=0.0)
    _close(bf[4:], a, atol=1e-5)
    # The raw first column alone ranks prompt 1's leaves differently (sanity of the data above).
    assert torch.argsort(out[8:]).tolist() != torch.argsort(_t(col0[4:])).tolist()


def test_multi_reward_default_and_zero_weights():
    _, tree, rewards, rewards_k, _, beta = _random_case(5)
    args = (tree.edge_parent, tree.leaf_edge, tree.leaf_prompt)
    kw = dict(edge_old_log_prob=tree.edge_old_log_prob, beta=beta)
    lp = tree.leaf_prompt
    for method in METHODS:
        default = tree_advantages(combine_rewards(rewards_k, lp), *args, method=method, **kw)
        ones = tree_advantages(combine_rewards(rewards_k, lp, torch.ones(3)), *args, method=method, **kw)
        torch.testing.assert_close(default, ones, atol=1e-6, rtol=0.0)
        # weight only column 1 (scale 10): the same as that column alone, normalised.
        only1 = tree_advantages(combine_rewards(rewards_k, lp, _t([0.0, 1.0, 0.0])), *args, method=method, **kw)
        single = tree_advantages(rewards_k[:, 1], *args, method=method, **kw)
        torch.testing.assert_close(only1, single, atol=1e-5, rtol=0.0)
        assert not torch.allclose(default, single, atol=1e-3)


@pytest.mark.parametrize("method", METHODS)
def test_single_column_equals_one_dim(method):
    _, tree, rewards, _, _, beta = _random_case(3)
    kw = dict(method=method, edge_old_log_prob=tree.edge_old_log_prob, beta=beta)
    one_dim = tree_advantages(*_tree_args(tree, rewards), **kw)
    combined = combine_rewards(rewards[:, None], tree.leaf_prompt)  # one column, normalised
    column = tree_advantages(*_tree_args(tree, combined), **kw)
    torch.testing.assert_close(column, one_dim, atol=1e-5, rtol=0.0)


def test_columns_are_refused_so_weighting_has_one_place():
    with pytest.raises(ValueError, match="combine reward columns"):
        tree_advantages(torch.ones(4, 2), *_hand_args()[1:])


@pytest.mark.parametrize("dtype", [torch.long, torch.bool])
def test_integer_multi_rewards_are_not_truncated(dtype):
    rewards = _long([[0, 1], [1, 0], [1, 1], [0, 0]])  # e.g. two pass/fail checks per image
    args = (_long(EP), _long(LEAF_EDGE), _long([0, 0, 0, 0]))
    lp = args[2]
    expected = tree_advantages(combine_rewards(rewards.float(), lp), *args[:2], lp)
    assert expected.abs().max() > 1.0  # leaves 2 and 3 differ: +-sqrt(2) on their edges
    got = tree_advantages(combine_rewards(rewards.to(dtype), lp), *args[:2], lp)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0.0)
    flags = _long([0, 1, 1, 0]).to(dtype)  # one pass/fail column, given as is
    torch.testing.assert_close(tree_advantages(flags, *args), tree_advantages(flags.float(), *args), atol=0.0, rtol=0.0)


# ----------------------------------------------------------------------------- errors and clip
def _hand_args(rewards=R):
    return _t(rewards), _long(EP), _long(LEAF_EDGE), _long([0, 0, 0, 0])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_reward_names_the_leaves(bad):
    with pytest.raises(ValueError, match=r"leaves \[1, 3\]"):
        tree_advantages(*_hand_args([1.0, bad, 2.0, bad]))


def test_unknown_method_is_named():
    with pytest.raises(ValueError, match="'median'"):
        tree_advantages(*_hand_args(), method="median")


def test_missing_or_misshapen_log_probs_raise():
    with pytest.raises(ValueError, match="edge_old_log_prob"):
        tree_advantages(*_hand_args(), method="logprob_softmax")
    with pytest.raises(ValueError, match="edge_old_log_prob"):
        tree_advantages(*_hand_args(), method="branch_fusion", beta=1.0)
    with pytest.raises(ValueError, match="edge_old_log_prob"):
        tree_advantages(*_hand_args(), method="logprob_softmax", edge_old_log_prob=torch.zeros(5))


def test_mismatched_shapes_raise():
    rewards, ep, le, lp = _hand_args()
    with pytest.raises(ValueError, match="number of leaves"):
        tree_advantages(torch.ones(5), ep, le, lp)
    with pytest.raises(ValueError, match="number of leaves"):
        tree_advantages(rewards, ep, le, _long([0, 0, 0]))
    with pytest.raises(ValueError, match="number of leaves"):
        tree_advantages(rewards, ep, _long([2, 3, 4]), lp)
    with pytest.raises(ValueError, match="reward weights"):
        combine_rewards(torch.ones(4, 2), lp, torch.ones(3))
    with pytest.raises(ValueError, match="reward weights"):
        combine_rewards(rewards, lp, torch.ones(1))


def test_edge_without_leaf_raises():
    # e1 is a root edge that no leaf's path goes through.
    with pytest.raises(ValueError, match=r"edges \[1\]"):
        tree_advantages(_t([1.0, 2.0]), _long([-1, -1, 0, 0]), _long([2, 3]), _long([0, 0]))


@pytest.mark.parametrize("method", METHODS)
def test_clip(method):
    kw = dict(beta=1.0)
    full = _hand(method, **kw)
    clipped = _hand(method, clip=0.5, **kw)
    assert full.abs().max() > 0.5  # the clip has something to do
    torch.testing.assert_close(clipped, full.clamp(-0.5, 0.5), atol=0.0, rtol=0.0)


# ----------------------------------------------------------------------------- scale
def _restrict_to_prompt(tree: RolloutTree, p: int):
    """The sub-description of prompt ``p`` alone, with edges renumbered."""
    keep = (tree.edge_prompt == p).nonzero().squeeze(1)  # [E_p]
    new_id = torch.full((tree.num_edges,), -1, dtype=torch.long)
    new_id[keep] = torch.arange(keep.numel())
    parent = tree.edge_parent[keep]
    parent = torch.where(parent >= 0, new_id[parent.clamp(min=0)], parent)
    leaves = (tree.leaf_prompt == p).nonzero().squeeze(1)  # [L_p]
    return keep, leaves, parent, new_id[tree.leaf_edge[leaves]]


def test_ten_thousand_edges():
    # 100 prompts x 27 leaves: 3 + 9 + 27 branch edges and 2 x 27 chain edges per prompt = 9300.
    spec = TreeSpec(8, branch_steps=(0, 1, 2), branching=3, sde_steps=(3, 5))
    gen = torch.Generator().manual_seed(3)
    tree = _grow(spec, 100, gen, dim=1)
    assert tree.num_edges == 9300 and tree.num_leaves == 2700
    rewards = torch.rand(tree.num_leaves, generator=gen)  # [L]
    for method in METHODS:
        kw = dict(method=method, edge_old_log_prob=tree.edge_old_log_prob, beta=0.7)
        out = tree_advantages(*_tree_args(tree, rewards), **kw)
        assert out.shape == (9300,) and out.dtype == torch.float32
        assert torch.isfinite(out).all()
        # One prompt's advantages do not depend on the other 99 prompts in the batch.
        for p in (0, 57):
            keep, leaves, parent, leaf_edge = _restrict_to_prompt(tree, p)
            alone = tree_advantages(
                rewards[leaves],
                parent,
                leaf_edge,
                torch.zeros_like(leaves),
                method=method,
                edge_old_log_prob=tree.edge_old_log_prob[keep],
                beta=0.7,
            )
            torch.testing.assert_close(out[keep], alone, atol=1e-5, rtol=0.0)


def test_global_std_scope_keeps_the_prompt_mean_and_takes_the_batch_std() -> None:
    # four one-edge chains, prompts 0 and 1: rewards [0, 2 | 4, 8]; prompt means 1 and 6.
    # Batch population std: mean 3.5, deviations -3.5, -1.5, 0.5, 4.5 -> var (12.25 + 2.25 + 0.25
    # + 20.25) / 4 = 8.75. Global: a = [-1, 1, -2, 2] / sqrt(8.75); per group: [-1, 1, -1, 1].
    rewards = torch.tensor([0.0, 2.0, 4.0, 8.0])
    parent, leaf_edge, prompt = torch.full((4,), -1), torch.arange(4), torch.tensor([0, 0, 1, 1])
    glob = tree_advantages(rewards, parent, leaf_edge, prompt, std_scope="global")
    expected = torch.tensor([-1.0, 1.0, -2.0, 2.0]) / math.sqrt(8.75)
    torch.testing.assert_close(glob, expected, rtol=1e-6, atol=1e-7)
    group = tree_advantages(rewards, parent, leaf_edge, prompt)
    torch.testing.assert_close(group, torch.tensor([-1.0, 1.0, -1.0, 1.0]), rtol=1e-6, atol=1e-7)
    # a prompt whose leaves all scored alike still gets exactly 0
    same = tree_advantages(torch.tensor([3.0, 3.0, 4.0, 8.0]), parent, leaf_edge, prompt, std_scope="global")
    assert same[:2].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="std_scope 'global' does not apply to branch_fusion"):
        tree_advantages(rewards, parent, leaf_edge, prompt, method="branch_fusion", beta=0.0, std_scope="global")
    with pytest.raises(ValueError, match="std_scope must be 'group' or 'global'"):
        tree_advantages(rewards, parent, leaf_edge, prompt, std_scope="batch")  # type: ignore[arg-type]


def test_std_scope_and_method_rule_is_stated_once() -> None:
    check_advantage_options("branch_fusion", "group")
    with pytest.raises(
        ValueError,
        match=r"^advantage.std_scope 'global' does not apply to branch_fusion, .*; use advantage.std_scope 'group'$",
    ):
        check_advantage_options("branch_fusion", "global", prefix="advantage.")
    with pytest.raises(
        ValueError,
        match=r"^method must be 'mean', 'logprob_softmax', 'branch_fusion', 'parent_relative' or 'softmax_tb', got 'x'$",
    ):
        check_advantage_options("x", "group")


def test_sample_std_estimator_hand_numbers():
    # R = 1, 3, 2, 4 on the depth-2 tree. The n - 1 std (torch.std's default, which BranchGRPO's and
    # DanceGRPO's code use): leaves mean 2.5, deviations -1.5, 0.5, -0.5, 1.5, sample variance
    # (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3, so a = (r - 2.5) * sqrt(3/5) instead of / (sqrt5 / 2).
    s = math.sqrt(3 / 5)
    leaves = [-1.5 * s, 0.5 * s, -0.5 * s, 1.5 * s]
    args = (_t(R), _long(EP), _long(LEAF_EDGE), _long([0, 0, 0, 0]))
    # mean: e0 = (a0 + a1) / 2 = -0.5 s, e1 = 0.5 s
    _close(tree_advantages(*args, method="mean", std_estimator="sample"), [-0.5 * s, 0.5 * s, *leaves])
    # branch_fusion (beta 0): depth 0 fuses to 2 and 3, deviations -0.5, 0.5, sample std sqrt(0.5),
    # so -1/sqrt2 and 1/sqrt2 (population: -1 and 1); depth 1 is the leaves' normalisation above
    out = tree_advantages(*args, method="branch_fusion", beta=0.0, std_estimator="sample")
    _close(out, [-1 / math.sqrt(2), 1 / math.sqrt(2), *leaves])
    with pytest.raises(ValueError, match="std_estimator must be 'population' or 'sample'"):
        tree_advantages(*args, std_estimator="unbiased")
