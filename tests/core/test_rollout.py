"""rollout(): batching by depth, exact prefix sharing, counts, recompute and minibatches."""

from __future__ import annotations

import math

import pytest
import torch

from lit_treegrpo.core.rollout import (
    RolloutTree,
    distinct_sources,
    index_cond,
    num_parents,
    recompute_log_probs,
    rollout,
    root_noise,
    source_minibatches,
    split_by_parent,
)
from lit_treegrpo.core.spec import TreeSpec

from .helpers import ToyFlow

SHAPE = (2, 3, 3)


def grow(spec: TreeSpec, num_prompts: int = 2, seed: int = 0, model: ToyFlow | None = None, max_batch: int = 64):
    model = model or ToyFlow(spec.num_steps)
    gen = torch.Generator().manual_seed(seed)
    cond = torch.arange(num_prompts, dtype=torch.float32) * 0.5  # [P]
    noise = torch.randn((num_prompts * spec.num_trees, *SHAPE), generator=gen)
    tree = rollout(model.predict, model.step, spec, cond, noise, generator=gen, max_batch=max_batch)
    return tree, model, cond, noise


def linear_loop(model: ToyFlow, spec: TreeSpec, cond: torch.Tensor, noise: torch.Tensor, gen):
    """Plain sampling loop, one trajectory per row, drawing SDE noise in the rollout's order."""
    node_cond = cond.repeat_interleave(spec.num_trees)
    x, log_probs = noise, []
    for t in range(spec.num_steps):
        v = model.predict(x, t, node_cond)
        if spec.is_stochastic(t):
            out = model.step(v, x, t, stochastic=True, noise=torch.randn(x.shape, generator=gen))
            log_probs.append(out.log_prob)
        else:
            out = model.step(v, x, t, stochastic=False)
        x = out.prev_sample
    return x, log_probs


@pytest.mark.parametrize(
    "spec",
    [
        TreeSpec(8, branch_steps=(1, 3), branching=1, num_trees=3),
        TreeSpec(8, sde_steps=tuple(range(7)), num_trees=4),  # flat GRPO
        TreeSpec(8, branch_steps=(2,), branching=1, sde_steps=(4, 5)),
    ],
)
def test_branching_one_equals_a_linear_sampling_loop(spec: TreeSpec) -> None:
    tree, model, cond, noise = grow(spec, seed=3)
    gen = torch.Generator().manual_seed(3)
    torch.randn((2 * spec.num_trees, *SHAPE), generator=gen)  # the root noise draw
    x, log_probs = linear_loop(ToyFlow(spec.num_steps), spec, cond, noise, gen)
    assert torch.equal(tree.leaf_latents, x)
    # edges are numbered step by step, frontier order within a step
    assert torch.equal(tree.edge_old_log_prob, torch.cat(log_probs))
    assert tree.num_leaves == 2 * spec.num_trees
    assert torch.equal(tree.leaf_prompt, torch.arange(2).repeat_interleave(spec.num_trees))


def replay_leaf(tree: RolloutTree, model: ToyFlow, spec: TreeSpec, cond, noise, leaf: int):
    """Re-run one leaf's trajectory on its own, taking each recorded SDE sample on its path."""
    path = []
    e = int(tree.leaf_edge[leaf])
    while e >= 0:
        path.append(e)
        e = int(tree.edge_parent[e])
    path.reverse()
    prompt = int(tree.leaf_prompt[leaf])
    first_source = int(tree.edge_source[path[0]])
    x = tree.source_x[first_source : first_source + 1]
    start = int(tree.source_step[first_source])
    # the prefix before the first stochastic step is deterministic: check it from the root noise
    roots = noise[prompt * spec.num_trees : (prompt + 1) * spec.num_trees]
    y = roots
    for t in range(start):
        y = model.step(model.predict(y, t, cond[[prompt] * y.shape[0]]), y, t, stochastic=False).prev_sample
    assert any(torch.equal(x[0], r) for r in y), "first source is not on a root's ODE prefix"
    edges = iter(path)
    for t in range(start, spec.num_steps):
        c = cond[[prompt]]
        if spec.is_stochastic(t):
            edge = next(edges)
            src = int(tree.edge_source[edge])
            assert int(tree.source_step[src]) == t
            assert torch.equal(tree.source_x[src : src + 1], x), f"prefix differs at step {t}"
            x = tree.edge_x_next[edge : edge + 1]
        else:
            x = model.step(model.predict(x, t, c), x, t, stochastic=False).prev_sample
    return x


def test_children_share_the_parent_prefix_exactly() -> None:
    spec = TreeSpec(10, branch_steps=(0, 1, 2), branching=3, sde_steps=(5,), num_trees=2)
    tree, model, cond, noise = grow(spec)
    for leaf in range(tree.num_leaves):
        assert torch.equal(replay_leaf(tree, model, spec, cond, noise, leaf), tree.leaf_latents[leaf : leaf + 1])
    # siblings share one stored source state, and their samples differ (independent noise)
    src = tree.edge_source
    for s in range(tree.source_x.shape[0]):
        kids = (src == s).nonzero().squeeze(1)
        if kids.numel() > 1:
            assert not torch.equal(tree.edge_x_next[kids[0]], tree.edge_x_next[kids[1]])


def test_counts_match_the_spec() -> None:
    spec = TreeSpec(10, branch_steps=(0, 1, 2), branching=3)
    tree, model, _, _ = grow(spec, num_prompts=1)
    assert tree.num_leaves == 27 == math.prod(spec.per_split_branching) * spec.num_trees
    assert sum(model.calls) == tree.nfe == spec.nfe() == 202
    assert len(model.calls) == tree.num_model_calls == spec.num_steps  # one call per depth
    assert model.calls == [1, 3, 9] + [27] * 7
    assert tree.num_edges == spec.num_edges() and tree.source_x.shape[0] == spec.train_nfe()
    # depth and parents: a child edge is one recorded step deeper and later than its parent
    has_parent = tree.edge_parent >= 0
    parent = tree.edge_parent[has_parent]
    assert torch.equal(tree.edge_depth[has_parent], tree.edge_depth[parent] + 1)
    assert bool((tree.edge_step[has_parent] > tree.edge_step[parent]).all())
    assert bool((tree.edge_parent < torch.arange(tree.num_edges)).all())


@pytest.mark.parametrize("num_prompts,num_trees", [(1, 1), (3, 2)])
def test_leaf_count_and_prompt_grouping(num_prompts: int, num_trees: int) -> None:
    spec = TreeSpec(6, branch_steps=(0, 2), branching=(2, 3), num_trees=num_trees)
    tree, model, _, _ = grow(spec, num_prompts=num_prompts)
    assert tree.num_leaves == num_prompts * spec.num_leaves
    assert torch.equal(tree.leaf_prompt, torch.arange(num_prompts).repeat_interleave(spec.num_leaves))
    assert tree.nfe == num_prompts * spec.nfe()
    assert tree.edge_old_log_prob.dtype == torch.float32
    assert bool(torch.isfinite(tree.edge_old_log_prob).all())


def test_max_batch_chunks_calls_without_changing_results() -> None:
    spec = TreeSpec(6, branch_steps=(0, 1), branching=3, num_trees=2)
    a, model_a, _, _ = grow(spec, num_prompts=2)
    b, model_b, _, _ = grow(spec, num_prompts=2, max_batch=4)
    assert torch.equal(a.leaf_latents, b.leaf_latents)
    assert torch.equal(a.edge_old_log_prob, b.edge_old_log_prob)
    assert max(model_b.calls) == 4 and sum(model_b.calls) == sum(model_a.calls)
    # nodes per step 4, 12, 36, 36, 36, 36 in chunks of 4
    assert b.num_model_calls == len(model_b.calls) == 1 + 3 + 9 * 4


def test_old_log_probs_recompute_to_ratio_one_with_one_forward_per_parent() -> None:
    spec = TreeSpec(8, branch_steps=(0, 2), branching=3, sde_steps=(3,))
    tree, model, cond, _ = grow(spec)
    model.calls.clear()
    edges = torch.arange(tree.num_edges)
    out = recompute_log_probs(model.predict, model.step, tree, edges, cond)
    assert torch.equal(out.step.log_prob, tree.edge_old_log_prob)
    assert model.calls == [tree.source_x.shape[0]] and out.num_forwards == spec.train_nfe() * 2
    assert torch.equal(tree.edge_source, torch.unique(tree.edge_source)[out.group])
    # a subset: three children of one parent cost one forward
    model.calls.clear()
    kids = (tree.edge_source == tree.edge_source[5]).nonzero().squeeze(1)
    sub = recompute_log_probs(model.predict, model.step, tree, kids, cond)
    assert model.calls == [1] and torch.equal(sub.group, torch.zeros(3, dtype=torch.long))


def test_recompute_carries_gradients() -> None:
    spec = TreeSpec(5, branch_steps=(1,), branching=2)
    tree, model, cond, _ = grow(spec)
    a = torch.tensor(0.1, requires_grad=True)

    def predict(x, t, c):
        return a * x + c.reshape(-1, 1, 1, 1)

    out = recompute_log_probs(predict, model.step, tree, torch.arange(tree.num_edges), cond)
    out.step.log_prob.sum().backward()
    assert a.grad is not None and torch.isfinite(a.grad) and a.grad != 0


def test_pytree_conditioning() -> None:
    spec = TreeSpec(4, branch_steps=(0,), branching=2)
    model = ToyFlow(4)
    cond = {"emb": torch.tensor([0.0, 1.0, 2.0]), "pooled": (torch.ones(3, 5),)}
    seen = []

    def predict(x, t, c):
        seen.append(c["pooled"][0].shape[0])
        return model.predict(x, t, c["emb"])

    noise = torch.randn(3, *SHAPE, generator=torch.Generator().manual_seed(0))
    tree = rollout(predict, model.step, spec, cond, noise, generator=torch.Generator().manual_seed(1))
    assert tree.num_leaves == 6 and seen == [3, 6, 6, 6]
    picked = index_cond(cond, torch.tensor([2, 2, 0]))
    assert torch.equal(picked["emb"], torch.tensor([2.0, 2.0, 0.0]))


def test_all_ode_records_nothing() -> None:
    tree, model, _, _ = grow(TreeSpec(5, num_trees=2))
    assert tree.num_edges == 0 and tree.source_x.shape == (0, *SHAPE)
    assert bool((tree.leaf_edge == -1).all()) and tree.num_leaves == 4


def test_bad_inputs() -> None:
    model = ToyFlow(4)
    spec = TreeSpec(4, branch_steps=(0,), num_trees=2)
    with pytest.raises(ValueError, match="num_prompts \\* num_trees"):
        rollout(model.predict, model.step, spec, torch.zeros(3), torch.zeros(5, *SHAPE))
    with pytest.raises(ValueError, match="first \\(prompt\\) dimension"):
        rollout(model.predict, model.step, spec, (torch.zeros(3), torch.zeros(2)), torch.zeros(6, *SHAPE))


def test_source_minibatches_partition_kept_edges_by_whole_parents() -> None:
    spec = TreeSpec(8, branch_steps=(0, 1, 2), branching=2, sde_steps=(4,))
    tree, _, _, _ = grow(spec)
    keep = torch.rand(tree.num_edges, generator=torch.Generator().manual_seed(0)) > 0.3
    batches = source_minibatches(tree, keep, 3, generator=torch.Generator().manual_seed(1))
    flat = torch.cat(batches)
    assert torch.equal(torch.sort(flat).values, keep.nonzero().squeeze(1))  # each kept edge once
    seen_sources: set[int] = set()
    for b in batches:
        sources = set(tree.edge_source[b].tolist())
        assert len(sources) <= 3
        assert not sources & seen_sources  # a parent's kept children are never split
        seen_sources |= sources
    assert all(len(set(tree.edge_source[b].tolist())) == 3 for b in batches[:-1])
    again = source_minibatches(tree, keep, 3, generator=torch.Generator().manual_seed(1))
    assert all(torch.equal(x, y) for x, y in zip(batches, again))
    other = source_minibatches(tree, keep, 3, generator=torch.Generator().manual_seed(2))
    assert not all(torch.equal(x, y) for x, y in zip(batches, other))
    assert source_minibatches(tree, torch.zeros_like(keep), 3) == []
    with pytest.raises(ValueError, match="sources_per_batch"):
        source_minibatches(tree, keep, 0)
    with pytest.raises(ValueError, match="exactly one"):
        source_minibatches(tree, keep, 3, num_batches=2)


def test_distinct_sources_are_what_unique_gives_and_recompute_the_same() -> None:
    spec = TreeSpec(8, branch_steps=(0, 1, 2), branching=2, sde_steps=(4,))
    tree, model, cond, _ = grow(spec)
    keep = torch.rand(tree.num_edges, generator=torch.Generator().manual_seed(0)) > 0.3
    batches = source_minibatches(tree, keep, num_batches=4, generator=torch.Generator().manual_seed(1))
    batches.append(torch.empty(0, dtype=torch.long))  # an empty micro-batch (another rank's share)
    found = distinct_sources(tree, batches)
    for edges, parents in zip(batches, found):
        sources, group = torch.unique(tree.edge_source[edges], return_inverse=True)
        assert torch.equal(parents.sources, sources) and torch.equal(parents.group, group)
    edges = batches[0]
    ahead = recompute_log_probs(model.predict, model.step, tree, edges, cond, found[0])
    here = recompute_log_probs(model.predict, model.step, tree, edges, cond)
    assert torch.equal(ahead.step.log_prob, here.step.log_prob) and ahead.num_forwards == here.num_forwards
    assert distinct_sources(tree, []) == []


@pytest.mark.parametrize("num_batches", [1, 3, 7, 40])
def test_source_minibatches_by_count_always_returns_that_many(num_batches: int) -> None:
    spec = TreeSpec(8, branch_steps=(0, 1, 2), branching=2, sde_steps=(4,))
    tree, _, _, _ = grow(spec)  # 2 prompts: 2 * (1 + 2 + 4 + 8) = 30 sources
    keep = torch.rand(tree.num_edges, generator=torch.Generator().manual_seed(0)) > 0.3
    batches = source_minibatches(tree, keep, num_batches=num_batches, generator=torch.Generator().manual_seed(1))
    assert len(batches) == num_batches
    assert torch.equal(torch.sort(torch.cat(batches)).values, keep.nonzero().squeeze(1))
    sizes = [len(set(tree.edge_source[b].tolist())) for b in batches]
    assert max(sizes) - min(sizes) <= 1  # near-equal forwards per batch
    per_source = [set(tree.edge_source[b].tolist()) for b in batches]
    assert sum(len(s) for s in per_source) == len(set().union(*per_source))  # no parent split
    empty = source_minibatches(tree, torch.zeros_like(keep), num_batches=num_batches)
    assert len(empty) == num_batches and all(b.numel() == 0 for b in empty)


@pytest.mark.parametrize("chunks", [1, 2, 4, 11])
def test_split_by_parent_keeps_parents_whole_in_near_equal_parts(chunks: int) -> None:
    # the training guard's split of one micro-batch into several forwards
    spec = TreeSpec(8, branch_steps=(0, 1, 2), branching=2, sde_steps=(4,))
    tree, _, _, _ = grow(spec)
    keep = torch.rand(tree.num_edges, generator=torch.Generator().manual_seed(0)) > 0.3
    (edges,) = source_minibatches(tree, keep, num_batches=1, generator=torch.Generator().manual_seed(1))
    U = num_parents(tree, edges)
    parts = split_by_parent(tree, edges, chunks)
    assert len(parts) == chunks
    assert torch.equal(torch.sort(torch.cat(parts)).values, torch.sort(edges).values)  # each edge once
    sources = [set(tree.edge_source[part].tolist()) for part in parts]
    assert sum(len(s) for s in sources) == U  # no parent in two parts
    sizes = [len(s) for s in sources]
    assert max(sizes) - min(sizes) <= 1 and max(sizes) == math.ceil(U / chunks)
    for part in parts:  # edges keep the micro-batch's order
        position = [edges.tolist().index(e) for e in part.tolist()]
        assert position == sorted(position)
    assert all(p.numel() == 0 for p in split_by_parent(tree, edges[:0], chunks))
    with pytest.raises(ValueError, match="chunks must be >= 1"):
        split_by_parent(tree, edges, 0)


def test_per_prompt_generators_make_each_prompt_independent_of_the_batch() -> None:
    spec = TreeSpec(6, branch_steps=(0, 2), branching=(2, 3), sde_steps=(3,), num_trees=2)
    model = ToyFlow(6)
    cond = torch.tensor([0.0, 0.5, 1.0])
    noise = torch.randn(6, *SHAPE, generator=torch.Generator().manual_seed(0))

    def gens(seeds):
        return [torch.Generator().manual_seed(s) for s in seeds]

    full = rollout(model.predict, model.step, spec, cond, noise, generator=gens([10, 11, 12]))
    # prompt 1 alone, with its own generator, grows exactly the same tree
    alone = rollout(model.predict, model.step, spec, cond[1:2], noise[2:4], generator=gens([11]))
    L = spec.num_leaves
    assert torch.equal(alone.leaf_latents, full.leaf_latents[L : 2 * L])
    mine = full.edge_prompt == 1
    assert torch.equal(alone.edge_old_log_prob, full.edge_old_log_prob[mine])
    with pytest.raises(ValueError, match="one per prompt"):
        rollout(model.predict, model.step, spec, cond, noise, generator=gens([1, 2]))


def test_every_method_draws_the_same_first_root_noise_for_a_prompt() -> None:
    # the comparison pairs methods by seed: a tree's one root, a flat method's first chain and a
    # shared-noise group's common root are the same draw of the prompt's generator. (torch draws
    # normals of fewer than 16 elements with another algorithm than larger ones, so the first of
    # five roots equals a single root only for latents of 16 elements or more: every real latent.)
    def draw(n: int, g: torch.Generator) -> torch.Tensor:
        return torch.randn((n, 2, 8), generator=g)

    def roots(spec: TreeSpec) -> torch.Tensor:
        return root_noise(draw, [torch.Generator().manual_seed(s) for s in (3, 4)], spec)

    tree = roots(TreeSpec(4, branch_steps=(0, 1), branching=3))  # [2, 2, 8]
    flat = roots(TreeSpec(4, sde_steps=(0, 1, 2), num_trees=5))  # [10, 2, 8]
    shared = roots(TreeSpec(4, sde_steps=(0, 1, 2), num_trees=5, shared_noise=True))  # [10, 2, 8]
    assert torch.equal(tree, flat[::5]) and torch.equal(tree, shared[::5])
    assert torch.equal(shared[:5], tree[:1].expand(5, 2, 8)) and not torch.equal(flat[1], flat[0])


def test_split_noise_scale_widens_the_split_children_and_scores_them_with_the_steps_own_std() -> None:
    # BranchGRPO's code (--tree_split_noise_scale 4): a split child is mean + 4 * std * eps, and its
    # log-prob is the Gaussian density under the unscaled std. ToyFlow at T=4, noise level 0.7:
    # step 0 goes sigma 1 -> 0.75, g = 0.7 * sqrt(1 / (1 - 0.75)) = 1.4, std = g * sqrt(0.25) = 0.7.
    spec = TreeSpec(4, branch_steps=(0,), branching=2, sde_steps=(1,), split_noise_scale=4.0)
    model, shape = ToyFlow(4), (1, 64, 64)
    cond = torch.tensor([0.5])
    gen = torch.Generator().manual_seed(3)
    noise = torch.randn((1, *shape), generator=gen)
    tree = rollout(model.predict, model.step, spec, cond, noise, generator=gen)
    replay = torch.Generator().manual_seed(3)
    torch.randn((1, *shape), generator=replay)  # the root noise
    eps = torch.randn((2, *shape), generator=replay)  # step 0: the two children
    mean = model.step(model.predict(noise, 0, cond), noise, 0, stochastic=True, noise=torch.zeros_like(noise)).mean
    assert torch.allclose(tree.edge_x_next[:2], mean + 4 * 0.7 * eps, atol=1e-6)
    # the children spread with 4x the step's std: 2.8 per element (8192 draws: within 3%)
    spread = (tree.edge_x_next[:2] - mean).std()
    assert abs(float(spread) / (4 * 0.7) - 1) < 0.03
    # the official log-prob: mean over elements of -(x - mean)^2 / (2 std^2) - log std - log sqrt(2 pi),
    # with x - mean = 4 std eps, i.e. -8 eps^2 - log 0.7 - log sqrt(2 pi)
    expected = (-8 * eps.square() - math.log(0.7) - 0.5 * math.log(2 * math.pi)).flatten(1).mean(1)
    assert torch.allclose(tree.edge_old_log_prob[:2], expected, atol=1e-5)
    # the non-splitting SDE step draws with its own std: step 1, sigma 0.75 -> 0.5, g = 0.7 * sqrt(3),
    # std = g * sqrt(0.25)
    eps1 = torch.randn((2, *shape), generator=replay)
    x1 = tree.edge_x_next[:2]
    mean1 = model.step(model.predict(x1, 1, cond.repeat(2)), x1, 1, stochastic=True, noise=torch.zeros_like(x1)).mean
    assert torch.allclose(tree.edge_x_next[2:], mean1 + 0.7 * math.sqrt(3) * 0.5 * eps1, atol=1e-5)
    # recomputed by the same policy, the log-probs are the recorded ones: the first ratio is 1
    out = recompute_log_probs(model.predict, model.step, tree, torch.arange(tree.num_edges), cond)
    assert torch.equal(out.step.log_prob, tree.edge_old_log_prob)


@pytest.mark.parametrize("scale", [0.0, -1.0, math.inf, math.nan])
def test_split_noise_scale_must_be_a_positive_number(scale: float) -> None:
    with pytest.raises(ValueError, match="split_noise_scale must be a finite number > 0"):
        TreeSpec(4, branch_steps=(0,), branching=2, split_noise_scale=scale)
