"""Width and depth pruning masks, checked against per-leaf brute force on real rollout trees."""

from __future__ import annotations

import pytest
import torch

from lit_treegrpo.core.pruning import PruningConfig, depth_mask, prune
from lit_treegrpo.core.rollout import RolloutTree, rollout
from lit_treegrpo.core.spec import TreeSpec

from .helpers import ToyFlow


def grow(spec: TreeSpec, num_prompts: int = 2, seed: int = 0) -> RolloutTree:
    model = ToyFlow(spec.num_steps)
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn((num_prompts * spec.num_trees, 1, 2, 2), generator=gen)
    return rollout(model.predict, model.step, spec, torch.zeros(num_prompts), noise, generator=gen)


def leaf_paths(tree: RolloutTree) -> list[list[int]]:
    paths = []
    for leaf in range(tree.num_leaves):
        e, path = int(tree.leaf_edge[leaf]), []
        while e >= 0:
            path.append(e)
            e = int(tree.edge_parent[e])
        paths.append(path)
    return paths


def edges_of(tree: RolloutTree, leaves: set[int]) -> torch.Tensor:
    keep = torch.zeros(tree.num_edges, dtype=torch.bool)
    for leaf, path in enumerate(leaf_paths(tree)):
        if leaf in leaves:
            keep[path] = True
    return keep


def test_no_pruning_keeps_everything() -> None:
    tree = grow(TreeSpec(6, branch_steps=(0, 2), branching=2))
    assert bool(prune(tree, torch.randn(tree.num_edges), PruningConfig()).all())


def test_parent_top1_hand_example() -> None:
    # one prompt, split 2 at step 0 (edges 0, 1) and at step 2 (edges 2, 3 under 0; 4, 5 under 1)
    tree = grow(TreeSpec(5, branch_steps=(0, 2), branching=2), num_prompts=1)
    assert tree.edge_parent.tolist() == [-1, -1, 0, 0, 1, 1]
    adv = torch.tensor([0.0, 0.0, -1.0, 2.0, 0.5, 0.5])  # tie under edge 1: first child wins
    keep = prune(tree, adv, PruningConfig(width="parent_top1"))
    assert keep.tolist() == [True, True, False, True, True, False]


@pytest.mark.parametrize("seed", range(5))
def test_parent_top1_matches_brute_force(seed: int) -> None:
    spec = TreeSpec(8, branch_steps=(0, 2), branching=(2, 3), sde_steps=(3, 5), num_trees=2)
    tree = grow(spec, seed=seed)
    adv = torch.randn(tree.num_edges, generator=torch.Generator().manual_seed(seed))
    last_split_edges = [e for e in range(tree.num_edges) if int(tree.edge_step[e]) == 2]
    by_parent: dict[int, list[int]] = {}
    for e in last_split_edges:
        by_parent.setdefault(int(tree.edge_source[e]), []).append(e)
    dropped = {e for kids in by_parent.values() for e in kids if e != max(kids, key=lambda c: float(adv[c]))}
    kept_leaves = {leaf for leaf, path in enumerate(leaf_paths(tree)) if not dropped & set(path)}
    assert torch.equal(prune(tree, adv, PruningConfig(width="parent_top1")), edges_of(tree, kept_leaves))
    # the sequential SDE edges below a dropped child are dropped too; above the split all are kept
    assert bool(prune(tree, adv, PruningConfig(width="parent_top1"))[tree.edge_step == 0].all())


def test_extreme_keeps_best_and_worst_paths_per_prompt() -> None:
    n = 1
    tree = grow(TreeSpec(6, branch_steps=(0, 1, 2), branching=2), num_prompts=3)
    adv = torch.randn(tree.num_edges, generator=torch.Generator().manual_seed(n))
    keep_leaves: set[int] = set()
    for p in range(3):
        leaves = [i for i in range(tree.num_leaves) if int(tree.leaf_prompt[i]) == p]
        ranked = sorted(leaves, key=lambda i: float(adv[tree.leaf_edge[i]]))
        keep_leaves |= set(ranked[:n]) | set(ranked[-n:])
    keep = prune(tree, adv, PruningConfig(width="extreme"))
    assert torch.equal(keep, edges_of(tree, keep_leaves))


@pytest.mark.parametrize("ratio", [0.25, 0.5, 1.0])
def test_ratio_keeps_top_fraction_by_magnitude_per_prompt(ratio: float) -> None:
    tree = grow(TreeSpec(6, branch_steps=(0, 2), branching=3, sde_steps=(3,)), num_prompts=2)
    adv = torch.randn(tree.num_edges, generator=torch.Generator().manual_seed(0))
    keep = prune(tree, adv, PruningConfig(width="ratio", ratio=ratio))
    for p in range(2):
        edges = (tree.edge_prompt == p).nonzero().squeeze(1).tolist()
        quota = -(-len(edges) * ratio // 1)  # ceil
        top = sorted(edges, key=lambda e: -abs(float(adv[e])))[: int(quota)]
        assert sorted((keep & (tree.edge_prompt == p)).nonzero().squeeze(1).tolist()) == sorted(top)


def test_depth_window_and_combination() -> None:
    spec = TreeSpec(8, branch_steps=(0, 1, 2), branching=2, sde_steps=(3, 4))
    tree = grow(spec)
    assert tree.edge_depth.max() == 4
    keep = prune(tree, torch.randn(tree.num_edges), PruningConfig(depth_window=(1, 3), depth_mode="keep"))
    assert torch.equal(keep, (tree.edge_depth >= 1) & (tree.edge_depth < 3))
    assert torch.equal(depth_mask(tree.edge_depth, 0, 1), tree.edge_depth == 0)
    # the default drops the window's depths (BranchGRPO's code): depths 0 and 3, 4 train
    dropped = prune(tree, torch.randn(tree.num_edges), PruningConfig(depth_window=(1, 3)))
    assert torch.equal(dropped, (tree.edge_depth < 1) | (tree.edge_depth >= 3))
    assert int(dropped.sum()) + int(keep.sum()) == tree.num_edges
    adv = torch.randn(tree.num_edges)
    both = prune(tree, adv, PruningConfig(width="parent_top1", depth_window=(2, 5), depth_mode="keep"))
    width = prune(tree, adv, PruningConfig(width="parent_top1"))
    assert torch.equal(both, width & (tree.edge_depth >= 2))


def test_flat_tree_parent_top1_keeps_all() -> None:
    tree = grow(TreeSpec(5, sde_steps=(0, 1, 2), num_trees=4))
    assert bool(prune(tree, torch.randn(tree.num_edges), PruningConfig(width="parent_top1")).all())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(width="top"), "pruning.width"),
        (dict(ratio=1.5), "pruning.ratio"),
        (dict(depth_window=(3, 3)), "pruning.depth_window"),
        (dict(depth_mode="only"), "pruning.depth_mode must be 'drop' or 'keep'"),
    ],
)
def test_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PruningConfig(**kwargs)


def test_advantage_shape_is_checked() -> None:
    tree = grow(TreeSpec(4, branch_steps=(0,)))
    with pytest.raises(ValueError, match="advantages have shape"):
        prune(tree, torch.zeros(tree.num_edges + 1), PruningConfig())


def test_step_pruning_keeps_exactly_the_edges_of_the_given_steps() -> None:
    tree = grow(TreeSpec(6, branch_steps=(1,), branching=2, sde_steps=(0, 2, 3, 4)))
    keep = prune(tree, torch.randn(tree.num_edges), PruningConfig(steps=(0, 3)))
    steps = tree.edge_step
    assert torch.equal(keep, (steps == 0) | (steps == 3))
    both = prune(tree, torch.randn(tree.num_edges), PruningConfig(steps=[2], depth_window=(0, 2), depth_mode="keep"))
    assert torch.equal(both, (steps == 2) & (tree.edge_depth < 2))
    with pytest.raises(ValueError, match="pruning.steps must be denoising step indices"):
        PruningConfig(steps=(-1,))
