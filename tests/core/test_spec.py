"""TreeSpec structure counts (hand-derived) and validation, window schedules."""

from __future__ import annotations

import math

import pytest

from lit_treegrpo.core.spec import RolloutLimits, TreeSpec, WindowSchedule


def test_treegrpo_k3_d3_counts() -> None:
    spec = TreeSpec(10, branch_steps=(0, 1, 2), branching=3)
    assert spec.num_leaves == 27
    # nodes entering steps 0..9: 1, 3, 9, then 27 for the 7 remaining steps
    assert [spec.nodes_at(t) for t in range(10)] == [1, 3, 9] + [27] * 7
    assert spec.nfe() == 1 + 3 + 9 + 27 * 7 == 202
    # edges: 3 + 9 + 27 children; forwards to recompute them: the 1 + 3 + 9 parents
    assert spec.num_edges() == 39
    assert spec.train_nfe() == 13


def test_treegrpo_paper_nfe_formula_with_window_offset() -> None:
    # TreeGRPO (arXiv 2512.08153): NFE per tree = i + sum_{j<w} k^j + k^w (T - i - w)
    T, k, w = 10, 3, 3
    for i in range(T - w):
        spec = TreeSpec(T, branch_steps=tuple(range(i, i + w)), branching=k)
        assert spec.nfe() == i + sum(k**j for j in range(w)) + k**w * (T - i - w)


def test_per_split_branching_and_sde_steps() -> None:
    # BranchGRPO-Mix-like: splits 2x at 0 and 3x at 4, extra SDE steps 1, 2
    spec = TreeSpec(8, branch_steps=(0, 4), branching=(2, 3), sde_steps=(1, 2), num_trees=2)
    assert spec.per_split_branching == (2, 3)
    assert spec.num_leaves == 2 * 3 * 2
    # nodes: step0: 2, steps 1-4: 4, steps 5-7: 12  -> 2 + 4*4 + 12*3
    assert spec.nfe() == 2 + 16 + 36
    # edges: step0: 2*2, step1: 4, step2: 4, step4: 4*3
    assert spec.num_edges() == 4 + 4 + 4 + 12
    assert spec.train_nfe() == 2 + 4 + 4 + 4
    assert spec.children_at(4) == 3 and spec.children_at(1) == 1
    assert spec.is_stochastic(2) and not spec.is_stochastic(3)


def test_flat_grpo_spec() -> None:
    G, T = 12, 10
    spec = TreeSpec(T, sde_steps=tuple(range(T - 1)), num_trees=G)
    assert spec.num_leaves == G
    assert spec.nfe() == G * T
    assert spec.num_edges() == G * (T - 1) == spec.train_nfe()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_steps=0), "num_steps"),
        (dict(num_steps=10, branch_steps=(9,)), "last denoising step 9"),
        (dict(num_steps=10, sde_steps=(3, 9)), "sde_steps contains the last"),
        (dict(num_steps=10, branch_steps=(12,)), "out of range"),
        (dict(num_steps=10, branch_steps=(-1,)), "out of range"),
        (dict(num_steps=10, branch_steps=(1, 1)), "duplicates"),
        (dict(num_steps=10, branch_steps=(2, 1)), "ascending"),
        (dict(num_steps=10, branch_steps=(1,), sde_steps=(1, 2)), "both branch_steps and sde_steps"),
        (dict(num_steps=10, branch_steps=(1, 2), branching=(2,)), "one entry per branch step"),
        (dict(num_steps=10, branch_steps=(1,), branching=0), "branching must be >= 1"),
        (dict(num_steps=10, num_trees=0), "num_trees"),
    ],
)
def test_validation_names_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TreeSpec(**kwargs)


def test_a_large_tree_is_a_tree_like_any_and_the_rollout_limit_is_checked() -> None:
    spec = TreeSpec(10, branch_steps=(0, 1, 2, 3, 4, 5), branching=3)  # 729 leaves: the memory guard's to judge
    assert spec.num_leaves == 729
    with pytest.raises(ValueError, match="rollout.max_batch must be >= 1"):
        RolloutLimits(max_batch=0)


def test_shared_noise_is_part_of_the_tree() -> None:
    assert TreeSpec(4, sde_steps=(0,), num_trees=3, shared_noise=True) != TreeSpec(4, sde_steps=(0,), num_trees=3)
    assert TreeSpec.from_dict({"num_steps": 4, "sde_steps": [0], "shared_noise": True}).shared_noise


def test_lists_become_tuples_and_spec_is_hashable() -> None:
    spec = TreeSpec(10, branch_steps=[0, 1], branching=[2, 3], sde_steps=[4])  # type: ignore[arg-type]
    assert spec.branch_steps == (0, 1) and spec.branching == (2, 3) and spec.sde_steps == (4,)
    hash(spec)


# ------------------------------------------------------------------------------- windows
def test_no_window_at_returns_self() -> None:
    spec = TreeSpec(10, branch_steps=(0, 1, 2), branching=3)
    assert spec.at(123) is spec


def test_shifting_window_moves_and_wraps() -> None:
    # window of 3 in T=10: offsets 0 .. 10-2-2 = 6 (7 positions); moves by 1 every 50 steps
    win = WindowSchedule("shifting", shift=1, every=50)
    spec = TreeSpec(10, branch_steps=(0, 1, 2), branching=3, window=win)
    assert spec.at(0).branch_steps == (0, 1, 2)
    assert spec.at(49).branch_steps == (0, 1, 2)
    assert spec.at(50).branch_steps == (1, 2, 3)
    assert spec.at(6 * 50).branch_steps == (6, 7, 8)  # last step 9 stays deterministic
    assert spec.at(7 * 50).branch_steps == (0, 1, 2)  # wrapped
    assert spec.at(50).window is None and spec.at(50).num_leaves == 27


def test_progressive_window_stops_at_the_end() -> None:
    win = WindowSchedule("progressive", target="sde", start=1, shift=2, every=10)
    spec = TreeSpec(10, sde_steps=(0, 1, 2, 3), num_trees=4, window=win)
    # max offset = 10 - 2 - 3 = 5; offsets 1, 3, 5, 5, ...
    assert spec.at(0).sde_steps == (1, 2, 3, 4)
    assert spec.at(10).sde_steps == (3, 4, 5, 6)
    assert spec.at(20).sde_steps == (5, 6, 7, 8)
    assert spec.at(1000).sde_steps == (5, 6, 7, 8)


def test_sde_window_skips_branch_steps() -> None:
    # BranchGRPO-Mix: fixed splits, sliding SDE window; a window step on a split stays a split
    win = WindowSchedule("shifting", target="sde", every=1)
    spec = TreeSpec(10, branch_steps=(2,), branching=2, sde_steps=(0, 1), window=win)
    assert spec.at(1).sde_steps == (1,)  # (1, 2) minus the split at 2
    assert spec.at(1).branch_steps == (2,)
    assert spec.at(3).sde_steps == (3, 4)


def test_branch_window_takes_over_sde_steps() -> None:
    win = WindowSchedule("fixed", start=2)
    spec = TreeSpec(10, branch_steps=(0, 1), branching=2, sde_steps=(3,), window=win)
    assert spec.at(0).branch_steps == (2, 3)
    assert spec.at(0).sde_steps == ()


def test_geometric_window_is_deterministic_and_truncated_geometric() -> None:
    win = WindowSchedule("geometric", ratio=0.5, seed=7)
    spec = TreeSpec(10, branch_steps=(0, 1, 2), branching=3, window=win)
    offsets = [spec.at(s).branch_steps[0] for s in range(4000)]
    assert offsets == [spec.at(s).branch_steps[0] for s in range(4000)]  # pure function of step
    other = WindowSchedule("geometric", ratio=0.5, seed=8)
    assert offsets != [other.offset(s, 6) for s in range(4000)]
    # P(i) = (1 - r) r^i / (1 - r^7) over i = 0..6; standard error of a frequency <= 0.008 here
    n = 7
    for i in range(n):
        expected = 0.5 * 0.5**i / (1 - 0.5**n)
        assert abs(offsets.count(i) / len(offsets) - expected) < 0.03, i
    assert set(offsets) <= set(range(n))


def test_geometric_ratio_one_is_uniform() -> None:
    win = WindowSchedule("geometric", ratio=1.0)
    counts = [0] * 4
    for s in range(4000):
        counts[win.offset(s, 3)] += 1
    assert all(abs(c / 4000 - 0.25) < 0.03 for c in counts)


@pytest.mark.parametrize(
    ("window", "spec_kwargs", "message"),
    [
        (dict(kind="sliding"), {}, "window.kind"),
        (dict(target="ode"), {}, "window.target"),
        (dict(every=0), {}, "window.every"),
        (dict(ratio=0.0), {}, "window.ratio"),
        (dict(shift=-1), {}, "window.shift"),
        (dict(kind="fixed", start=7), dict(branch_steps=(0, 1, 2)), "window.start=7"),
        (dict(target="sde"), dict(branch_steps=(0,)), "sde_steps is empty"),
    ],
)
def test_window_validation(window: dict, spec_kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TreeSpec(10, **{"branching": 2, **spec_kwargs}, window=WindowSchedule(**window))


def test_nfe_is_exact_over_random_specs() -> None:
    # brute force: simulate node counts step by step
    import random

    rng = random.Random(0)
    for _ in range(200):
        T = rng.randint(2, 12)
        branch = tuple(sorted(rng.sample(range(T - 1), rng.randint(0, min(3, T - 1)))))
        rest = [s for s in range(T - 1) if s not in branch]
        sde = tuple(sorted(rng.sample(rest, rng.randint(0, len(rest)))))
        ks = tuple(rng.randint(1, 3) for _ in branch)
        trees = rng.randint(1, 3)
        spec = TreeSpec(T, branch_steps=branch, branching=ks, sde_steps=sde, num_trees=trees)
        nodes, nfe, edges, parents = trees, 0, 0, 0
        for t in range(T):
            nfe += nodes
            if t in branch:
                parents += nodes
                nodes *= ks[branch.index(t)]
                edges += nodes
            elif t in sde:
                parents += nodes
                edges += nodes
        assert (spec.nfe(), spec.num_edges(), spec.train_nfe()) == (nfe, edges, parents)
        assert spec.num_leaves == nodes == trees * math.prod(ks)


def test_ode_tail_refuses_stochastic_steps_in_the_tail_and_keeps_windows_off_it() -> None:
    # T = 10, ode_tail = 2: steps 8 and 9 are deterministic
    with pytest.raises(ValueError, match=r"sde_steps \[8\] lie in the deterministic tail \(ode_tail=2: steps 8 .. 9\)"):
        TreeSpec(10, sde_steps=tuple(range(9)), ode_tail=2)
    flat = TreeSpec(10, sde_steps=tuple(range(8)), num_trees=4, ode_tail=2)
    assert flat.num_edges() == 4 * 8
    # a window of 4 SDE steps (0..3): offsets 0 .. 10 - 1 - 2 - 3 = 4, so the window ends at step 7
    spec = TreeSpec(
        10, sde_steps=(0, 1, 2, 3), ode_tail=2, window=WindowSchedule(kind="progressive", target="sde", every=1)
    )
    assert [spec.at(i).sde_steps for i in (0, 4, 5, 100)] == [(0, 1, 2, 3), (4, 5, 6, 7), (4, 5, 6, 7), (4, 5, 6, 7)]
    # with the default ode_tail = 1 the same window reaches step 8
    assert TreeSpec(10, sde_steps=(0, 1, 2, 3), window=spec.window).at(100).sde_steps == (5, 6, 7, 8)
    for bad in (0, 11):
        with pytest.raises(ValueError, match="ode_tail must be in 1 .. num_steps=10"):
            TreeSpec(10, ode_tail=bad)


def test_progressive_window_rolls_back_to_its_start() -> None:
    # MixGRPO's roll_back: positions start, start + shift, ... <= max_offset, then start again
    w = WindowSchedule(kind="progressive", shift=1, every=2, roll_back=True)
    assert [w.offset(s, 3) for s in range(10)] == [0, 0, 1, 1, 2, 2, 3, 3, 0, 0]
    # start 1, shift 2, max_offset 6: positions 1, 3, 5 (7 would pass 6), then 1 again
    w = WindowSchedule(kind="progressive", start=1, shift=2, every=1, roll_back=True)
    assert [w.offset(s, 6) for s in range(7)] == [1, 3, 5, 1, 3, 5, 1]
    # without roll_back the window stays at the end
    assert WindowSchedule(kind="progressive", start=1, shift=2, every=1).offset(6, 6) == 6
    with pytest.raises(ValueError, match="window.roll_back applies to kind 'progressive' only"):
        WindowSchedule(kind="shifting", roll_back=True)


def test_the_adapter_owns_num_steps_the_tree_takes_it_or_refuses_another() -> None:
    tree = TreeSpec(branch_steps=[0, 1], branching=2)  # no num_steps: the adapter's
    assert tree.num_steps is None and tree.branch_steps == (0, 1)
    filled = tree.with_num_steps(4)
    assert filled == TreeSpec(4, branch_steps=(0, 1), branching=2) and filled.num_edges() == 6
    assert filled.with_num_steps(4) is filled
    with pytest.raises(
        ValueError,
        match=r"^--model.tree.num_steps=4 but the adapter samples with num_steps=6; leave "
        r"--model.tree.num_steps out \(the tree takes the adapter's\) or give the same value$",
    ):
        filled.with_num_steps(6, prefix="--model.")
    with pytest.raises(ValueError, match="out of range"):  # validated once the number is known
        TreeSpec(branch_steps=(0, 5)).with_num_steps(4)
