"""The comparison's order of work (benchmarks/compare/plan.py) and its report, on run records written
by hand into a cache (the plan reads curves; which model made them does not matter to it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from compare import plan, report
from compare.methods import RunSpec, resolved_config, training_identity
from compare.runs import Protocol, RunCache

from tests.benchmarks.records import write

PROTOCOL = Protocol(budget=100.0, evaluations=4, eval_seeds=2)
DESIGN = plan.Design(
    protocol=PROTOCOL,
    sweep_seeds=(100, 101),
    report_seeds=(0, 1, 2),
    variant_seeds=(),
    grids={"treegrpo": (1e-4, 3e-4, 1e-3), "dancegrpo": (1e-4, 3e-4, 1e-3)},
    headline=("treegrpo", "dancegrpo"),
    variants=(),
)


def sweep_jobs(cache: RunCache) -> set[tuple[str, float, int]]:
    return {(s.method, s.lr, s.seed) for s in plan.jobs(cache, DESIGN) if s.seed in DESIGN.sweep_seeds}


def test_the_sweep_chooses_by_the_spread_penalised_rule_and_moves_a_grid_whose_best_is_at_an_edge(
    tmp_path: Path,
) -> None:
    cache = RunCache(tmp_path, PROTOCOL)
    assert plan.jobs(cache, DESIGN) == [
        RunSpec(m, lr, s) for m in ("treegrpo", "dancegrpo") for lr in (1e-4, 3e-4, 1e-3) for s in (100, 101)
    ]
    # dancegrpo: 3e-4 has the best mean plateau, 1e-3 the best single seed but a wide spread
    for lr, (a, b) in {1e-4: (0.60, 0.61), 3e-4: (0.70, 0.71), 1e-3: (0.80, 0.50)}.items():
        write(cache, RunSpec("dancegrpo", lr, 100), [0.5, a, a, a, a])
        write(cache, RunSpec("dancegrpo", lr, 101), [0.5, b, b, b, b])
    # treegrpo: the lowest rate is best -> the grid moves down one step of the series, 3e-5 is trained
    for lr, plateau in {1e-4: 0.75, 3e-4: 0.72, 1e-3: 0.55}.items():
        for seed in (100, 101):
            write(cache, RunSpec("treegrpo", lr, seed), [0.5, 0.6, plateau, plateau, plateau])
    sweeps = plan.sweeps_of(cache, DESIGN)
    assert sweeps["dancegrpo"].chosen == 3e-4  # 1e-3: mean 0.65 - sd 0.21 loses to 0.705 - 0.007
    assert sweeps["treegrpo"].chosen is None and sweeps["treegrpo"].grid == (3e-5, 1e-4, 3e-4)
    assert ("treegrpo", 3e-5, 100) in sweep_jobs(cache)
    assert plan.targets(sweeps) is None  # fixed only once every sweep is complete
    # reported seeds start for the method whose sweep is done, never on the sweep seeds
    assert [s for s in plan.jobs(cache, DESIGN) if s.seed not in (100, 101)] == [
        RunSpec("dancegrpo", 3e-4, k) for k in (0, 1, 2)
    ]
    for seed in (100, 101):
        write(cache, RunSpec("treegrpo", sweeps["treegrpo"].grid[0], seed), [0.5, 0.6, 0.7, 0.7, 0.7])
    sweeps = plan.sweeps_of(cache, DESIGN)
    assert sweeps["treegrpo"].chosen == 1e-4  # inside the moved grid
    goals = plan.targets(sweeps)
    # the targets are sweep-seed plateaus: dancegrpo at 3e-4, (0.70 + 0.71) / 2
    assert goals["dancegrpo"]["reward"] == pytest.approx(0.705) and goals["best_flat"]["method"] == "dancegrpo"


def test_the_variants_are_trained_after_every_reported_run_one_variant_at_a_time(tmp_path: Path) -> None:
    design = plan.Design(
        protocol=PROTOCOL,
        sweep_seeds=(100,),
        report_seeds=(0, 1),
        variant_seeds=(0, 1),
        grids={"treegrpo": (1e-4, 3e-4, 1e-3), "branchgrpo": (1e-4, 3e-4, 1e-3)},
        headline=("treegrpo", "branchgrpo"),
        variants=("treegrpo_softmax", "branchgrpo_mix"),
    )
    cache = RunCache(tmp_path, PROTOCOL)
    for m in design.headline:  # each sweep chooses 3e-4, the middle of its grid
        for lr, plateau in {1e-4: 0.6, 3e-4: 0.7, 1e-3: 0.5}.items():
            write(cache, RunSpec(m, lr, 100), [0.5, plateau, plateau, plateau, plateau])
    after_sweeps = [s for s in plan.jobs(cache, design) if s.seed != 100]
    # reported seeds seed-major (the pairs grow together), then each variant's seeds in turn (a
    # variant cut short by the machine's time is then wholly "not run", not a few seeds of each)
    assert after_sweeps == [
        RunSpec("treegrpo", 3e-4, 0),
        RunSpec("branchgrpo", 3e-4, 0),
        RunSpec("treegrpo", 3e-4, 1),
        RunSpec("branchgrpo", 3e-4, 1),
        RunSpec("treegrpo_softmax", 3e-4, 0),
        RunSpec("treegrpo_softmax", 3e-4, 1),
        RunSpec("branchgrpo_mix", 3e-4, 0),
        RunSpec("branchgrpo_mix", 3e-4, 1),
    ]


def test_grids_move_along_the_1_3_10_series() -> None:
    from compare.methods import neighbour, shifted_grid

    assert [
        neighbour(1e-4, up=True),
        neighbour(3e-4, up=True),
        neighbour(1e-4, up=False),
        neighbour(3e-5, up=False),
    ] == [3e-4, 1e-3, 3e-5, 1e-5]
    assert shifted_grid((1e-4, 3e-4, 1e-3), 1e-3) == (3e-4, 1e-3, 3e-3)
    assert shifted_grid((1e-4, 3e-4, 1e-3), 3e-4) is None
    with pytest.raises(ValueError, match="not on the 1-3-10 series"):
        neighbour(5e-4, up=True)


def test_seeds_that_tune_are_never_reported() -> None:
    with pytest.raises(ValueError, match=r"seeds \[0\] would both tune and be reported"):
        plan.Design(sweep_seeds=(0, 100))


def test_the_report_computes_cis_pairs_and_censored_speedups_from_the_runs(tmp_path: Path) -> None:
    cache = RunCache(tmp_path, PROTOCOL)
    for m in ("treegrpo", "dancegrpo"):
        for lr in (1e-4, 3e-4, 1e-3):
            for seed in (100, 101):  # both choose 3e-4: plateau 0.7 there, 0.6 elsewhere
                p = 0.7 if lr == 3e-4 else 0.6
                write(cache, RunSpec(m, lr, seed), [0.5, p, p, p, p])
    # reported seeds: treegrpo climbs faster (reaches 0.7 at 25 units), dancegrpo reaches it at 75 on
    # seeds 0 and 1 and never on seed 2
    for seed in (0, 1, 2):
        write(cache, RunSpec("treegrpo", 3e-4, seed), [0.5, 0.7, 0.72, 0.72, 0.72 + 0.01 * seed])
        dance = [0.5, 0.55, 0.6, 0.7, 0.7] if seed < 2 else [0.5, 0.55, 0.6, 0.65, 0.68]
        write(cache, RunSpec("dancegrpo", 3e-4, seed), dance)
    results = report.summarise(cache, DESIGN)
    tree, dance = results["methods"]["treegrpo"], results["methods"]["dancegrpo"]
    assert results["complete"] and results["protocol"]["budget_axis"] == "compute"
    assert tree["final"]["mean"] == pytest.approx(0.73) and dance["final"]["mean"] == pytest.approx(
        (0.7 + 0.7 + 0.68) / 3
    )
    # dancegrpo's seed 2 peaks before its end: 0.68 then; treegrpo ends at its best on every seed
    write(cache, RunSpec("dancegrpo", 3e-4, 2), [0.5, 0.55, 0.6, 0.75, 0.68])
    results = report.summarise(cache, DESIGN)
    tree, dance = results["methods"]["treegrpo"], results["methods"]["dancegrpo"]
    assert tree["drop"]["mean"] == pytest.approx(0.0) and tree["peak"]["mean"] == pytest.approx(0.73)
    assert dance["peak"]["mean"] == pytest.approx((0.7 + 0.7 + 0.75) / 3) and dance["drop"]["mean"] == pytest.approx(
        0.07 / 3
    )
    assert dance["final"]["mean"] == pytest.approx((0.7 + 0.7 + 0.68) / 3)
    write(cache, RunSpec("dancegrpo", 3e-4, 2), [0.5, 0.55, 0.6, 0.65, 0.68])
    results = report.summarise(cache, DESIGN)
    tree, dance = results["methods"]["treegrpo"], results["methods"]["dancegrpo"]
    # paired final differences 0.02, 0.03, 0.06: all positive, so resolved
    diff = results["pairs"]["treegrpo - dancegrpo"]["final"]
    assert diff["mean"] == pytest.approx((0.02 + 0.03 + 0.06) / 3) and diff["resolved"]
    to = dance["compute_to_target"]["dancegrpo"]
    assert to["target"] == pytest.approx(0.7) and to["reached"] == [True, True, False]
    assert to["units"] == pytest.approx([75.0, 75.0, 100.0])  # censored at the budget
    # treegrpo reaches 0.7 at 25 units on every seed: speed-up (75 + 75 + 100) / 75
    assert tree["compute_to_target"]["dancegrpo"]["speedup"]["mean"] == pytest.approx(250 / 75)
    text = report.tables(results)
    assert "| treegrpo - dancegrpo |" in text and "resolved" in text and results["headline"] in text
    assert "dancegrpo +0.037" in results["headline"] and "(resolved)" in results["headline"]


def test_a_variant_is_paired_with_its_headline_method_and_kept_out_of_the_headline(tmp_path: Path) -> None:
    design = plan.Design(
        protocol=PROTOCOL,
        sweep_seeds=(100, 101),
        report_seeds=(0, 1, 2),
        variant_seeds=(0, 1),
        grids=DESIGN.grids,
        headline=("treegrpo", "dancegrpo"),
        variants=("treegrpo_softmax",),
    )
    cache = RunCache(tmp_path, PROTOCOL)
    for m in ("treegrpo", "dancegrpo"):
        for lr in (1e-4, 3e-4, 1e-3):
            for seed in (100, 101):
                p = 0.7 if lr == 3e-4 else 0.6
                write(cache, RunSpec(m, lr, seed), [0.5, p, p, p, p])
    for seed in (0, 1, 2):
        write(cache, RunSpec("treegrpo", 3e-4, seed), [0.5, 0.7, 0.72, 0.72, 0.72 + 0.01 * seed])
        write(cache, RunSpec("dancegrpo", 3e-4, seed), [0.5, 0.55, 0.6, 0.7, 0.7])
    results = report.summarise(cache, design)
    assert results["variant_pairs"] == {} and "treegrpo_softmax: 2 of 2 seeds not run" in results["missing"]
    # the variant ends 0.05 and 0.03 below treegrpo on seeds 0 and 1 (treegrpo: 0.72, 0.73)
    for seed, final in ((0, 0.67), (1, 0.70)):
        write(cache, RunSpec("treegrpo_softmax", 3e-4, seed), [0.5, 0.6, 0.65, 0.66, final])
    results = report.summarise(cache, design)
    pair = results["variant_pairs"]["treegrpo_softmax - treegrpo"]
    assert pair["seeds"] == [0, 1] and pair["final"]["mean"] == pytest.approx(-0.04) and pair["final"]["resolved"]
    assert set(results["pairs"]) == {"treegrpo - dancegrpo"} and "softmax" not in results["headline"]
    assert "| treegrpo_softmax - treegrpo | 2 | -0.0400 [-0.0500, -0.0300] | resolved |" in report.tables(results)


def test_the_headline_ranks_nothing_until_two_seeds_are_trained_by_treegrpo_and_another_method(tmp_path: Path) -> None:
    cache = RunCache(tmp_path, PROTOCOL)
    for m in ("treegrpo", "dancegrpo"):
        for lr in (1e-4, 3e-4, 1e-3):
            for seed in (100, 101):
                write(cache, RunSpec(m, lr, seed), [0.5, 0.6, 0.6, 0.6, 0.7 if lr == 3e-4 else 0.6])
    # two seeds of each method, but only seed 1 shared: no pair, no ranking
    for seed in (0, 1):
        write(cache, RunSpec("treegrpo", 3e-4, seed), [0.5, 0.7, 0.72, 0.72, 0.72])
    for seed in (1, 2):
        write(cache, RunSpec("dancegrpo", 3e-4, seed), [0.5, 0.55, 0.6, 0.7, 0.7])
    results = report.summarise(cache, DESIGN)
    assert not results["complete"] and results["pairs"] == {}
    assert results["headline"].startswith("No result yet") and "both TreeGRPO and another" in results["headline"]
    write(cache, RunSpec("dancegrpo", 3e-4, 0), [0.5, 0.55, 0.6, 0.7, 0.7])
    results = report.summarise(cache, DESIGN)
    assert results["pairs"]["treegrpo - dancegrpo"]["seeds"] == [0, 1]
    assert results["headline"].startswith("Interim") and "dancegrpo +0.020" in results["headline"]


def test_a_cached_run_is_reused_only_while_the_files_train_what_it_recorded(tmp_path: Path) -> None:
    cache = RunCache(tmp_path, PROTOCOL)
    spec = RunSpec("treegrpo", 3e-4, 0)
    write(cache, spec, [0.5, 0.6, 0.7, 0.7, 0.7])
    assert cache.load(spec) is not None
    assert [s for s, _ in cache.finished()] == [spec]
    record = json.loads(cache.path(spec).read_text())
    # a record under another run's name is neither run
    cache.path(RunSpec("treegrpo", 3e-4, 1)).write_text(json.dumps(record))
    assert [s for s, _ in cache.finished()] == [spec]
    # another protocol, or a recorded configuration that trained something else, is not this run
    longer = RunCache(tmp_path, Protocol(budget=200.0))
    assert longer.load(spec) is None and not list(longer.finished())
    record["config"]["model"]["minibatches"] = 4
    cache.path(spec).write_text(json.dumps(record))
    assert cache.load(spec) is None and not list(cache.finished())
    # the tree's num_steps left to the adapter is the same run as stating it
    config = resolved_config(spec)
    stated, left = json.loads(json.dumps(config)), json.loads(json.dumps(config))
    left["model"]["tree"]["num_steps"] = None
    assert training_identity(stated) == training_identity(left)
    # options that bound memory or speed only, and runs recorded before one of them existed
    older, faster = json.loads(json.dumps(config)), json.loads(json.dumps(config))
    older["model"]["adapter"]["init_args"].pop("compile", None)
    faster["model"]["adapter"]["init_args"].update(compile=True, gradient_checkpointing=True, decode_batch_size=3)
    assert training_identity(older) == training_identity(faster) == training_identity(config)
    changed = json.loads(json.dumps(config))
    changed["model"]["adapter"]["init_args"]["noise_level"] = 0.5  # what it trains: another run
    assert training_identity(changed) != training_identity(config)
    # its rate and seed name the run; they are not part of what the files train
    other = resolved_config(RunSpec("treegrpo", 1e-3, 7))
    assert (
        training_identity(other)
        == training_identity(config)
        != training_identity(resolved_config(RunSpec("mixgrpo", 1e-3, 7)))
    )


def test_the_docs_generated_region_is_replaced_and_nothing_else() -> None:
    text = f"intro 0.5\n{report.BEGIN}\nold table\n{report.END}\noutro\n"
    new = report.replace_generated(text, "| new | table |", "doc")
    assert new == f"intro 0.5\n{report.BEGIN}\n| new | table |\n{report.END}\noutro\n"
    assert report.generated_region(new) == "| new | table |"
    with pytest.raises(ValueError, match="needs exactly one generated region"):
        report.replace_generated("no markers", "x", "README.md")


def test_an_interim_headline_gives_each_pair_its_own_seed_count_when_they_differ() -> None:
    def pair(seeds: list[int], mean: float, lo: float, hi: float) -> dict:
        return {"seeds": seeds, "final": {"mean": mean, "lo": lo, "hi": hi, "resolved": lo > 0 or hi < 0}}

    partial = {
        "complete": False,
        "protocol": {"budget": 300_000.0, "reported_seeds": list(range(10))},
        "methods": {"treegrpo": {"n": 5}, "mixgrpo": {"n": 5}, "flowgrpo": {"n": 4}},
        "pairs": {
            "treegrpo - mixgrpo": pair([0, 1, 2, 3, 4], 0.018, -0.005, 0.038),
            "treegrpo - flowgrpo": pair([0, 1, 2, 3], 0.054, 0.042, 0.070),
        },
    }
    text = report.headline_sentence(partial)
    assert text.startswith("Interim") and "(4 of 10 paired seeds trained" in text
    assert "over 4 to 5 paired seeds" in text
    assert "mixgrpo +0.018 [-0.005, +0.038] (not resolved, 5 seeds)" in text
    assert "flowgrpo +0.054 [+0.042, +0.070] (resolved, 4 seeds)" in text
    # equal counts: one count for all, as the complete report says it
    partial["pairs"]["treegrpo - flowgrpo"]["seeds"] = [0, 1, 2, 3, 4]
    partial["methods"]["flowgrpo"]["n"] = 5
    text = report.headline_sentence(partial)
    assert "over 5 paired seeds" in text and "(resolved)" in text and "seeds)" not in text


def test_the_status_counts_the_runs_left_and_prices_them_at_each_methods_seconds_per_unit(
    tmp_path: Path, capsys
) -> None:
    import hashlib

    import compare_methods

    cache = RunCache(tmp_path, PROTOCOL)
    for lr, p in {1e-4: 0.6, 3e-4: 0.7, 1e-3: 0.6}.items():  # dancegrpo's sweep chooses 3e-4
        for seed in (100, 101):
            write(cache, RunSpec("dancegrpo", lr, seed), [0.5, p, p, p, p], seconds=100.0)  # 1 s per unit
    write(cache, RunSpec("treegrpo", 1e-4, 100), [0.5, 0.6, 0.7, 0.7, 0.7], seconds=50.0)  # 0.5 s per unit
    # dancegrpo's reported seed 0 ran to 50 units under a shorter protocol and left its checkpoint
    shorter = RunCache(tmp_path, Protocol(budget=50.0, evaluations=2, eval_seeds=2))
    spec = RunSpec("dancegrpo", 3e-4, 0)
    cache.checkpoint(spec).write_bytes(b"state")
    write(shorter, spec, [0.5, 0.6, 0.65], seconds=50.0, checkpoint_sha256=hashlib.sha256(b"state").hexdigest())
    now = plan.progress(cache, DESIGN)
    assert len(now.done) == 7  # the shorter run is not this protocol's
    assert sorted((s.method, s.seed) for s in now.pending if s.seed < 100) == [("dancegrpo", k) for k in (0, 1, 2)]
    assert len(now.pending) == 5 + 3 and now.extending == [spec]
    # treegrpo: 5 sweep runs x 100 units x 0.5 s; dancegrpo: 2 reported x 100 x 1 s, and 50 units left of seed 0
    assert now.seconds_left == pytest.approx(250.0 + 200.0 + 50.0)
    # treegrpo's sweep has not chosen: its 3 reported seeds are not yet known runs, priced from scratch
    assert now.later == 3 and now.seconds_later == pytest.approx(3 * 100 * 0.5)
    text = compare_methods.status(cache, DESIGN)
    assert "0.0003: 0.700 0.700 | 0.001: 0.600 0.600; chosen 0.0003; reported 0/3" in text
    assert "0.0001: 0.700 ... | 0.0003: ... ..." in text
    assert "7 runs done, 8 known to go (1 extend a shorter run): about 0.1 h on one core" in text
    assert "; 3 more once their sweeps choose a rate (up to 0.0 h on one core, if none extends" in text


def test_official_presets_and_the_extension_are_trained_after_everything_else(tmp_path: Path) -> None:
    # one official preset with a grid of its own and an extension to seeds 3-4: the headline work
    # first, then the official preset's sweep (its seeds wait for its choice), then the extension:
    # MixGRPO's seeds at once, TreeGRPO's once the official preset's reported runs decide the rule
    design = plan.Design(
        protocol=PROTOCOL,
        sweep_seeds=(100, 101),
        report_seeds=(0, 1, 2),
        variant_seeds=(),
        grids={"treegrpo": (3e-4,), "mixgrpo": (3e-4,), "treegrpo_official": (1e-4,)},
        headline=("treegrpo", "mixgrpo"),
        variants=(),
        official=("treegrpo_official",),
        extension_seeds=(3, 4),
    )
    cache = RunCache(tmp_path, PROTOCOL)
    for m in ("treegrpo", "mixgrpo"):
        for s in (100, 101):
            write(cache, RunSpec(m, 3e-4, s), [0.5, 0.6, 0.7, 0.7, 0.7])

    def pending() -> list[RunSpec]:
        return [s for s in plan.jobs(cache, design) if cache.load(s) is None]

    reported = [RunSpec(m, 3e-4, s) for s in (0, 1, 2) for m in ("treegrpo", "mixgrpo")]
    official = [RunSpec("treegrpo_official", 1e-4, s) for s in (100, 101)]
    mix = [RunSpec("mixgrpo", 3e-4, s) for s in (3, 4)]
    assert pending() == reported + official + mix  # TreeGRPO's extension: undecided
    for spec in reported + official:
        write(cache, spec, [0.5, 0.6, 0.7, 0.7, 0.7])
    assert pending() == [RunSpec("treegrpo_official", 1e-4, s) for s in (0, 1, 2)] + mix
    # the official preset ends above treegrpo by 0.02, 0.03, 0.04: mean 0.03, sd 0.01, t(0.975, 2) =
    # 4.303, so the interval 0.03 -+ 0.0248 lies above 0 and it is extended (by 0.01, 0.02, 0.03 it
    # would not: 0.02 - 0.0248 < 0)
    for s, end in zip((0, 1, 2), (0.72, 0.73, 0.74)):
        write(cache, RunSpec("treegrpo_official", 1e-4, s), [0.5, 0.6, 0.7, 0.7, end])
    assert plan.extended(cache, design) == {"mixgrpo": (3, 4), "treegrpo_official": (3, 4)}
    assert pending() == mix + [RunSpec("treegrpo_official", 1e-4, s) for s in (3, 4)]
    # ... while one that ends below, or not clearly above, leaves treegrpo the settling one
    for s, end in zip((0, 1, 2), (0.71, 0.69, 0.70)):
        write(cache, RunSpec("treegrpo_official", 1e-4, s), [0.5, 0.6, 0.7, 0.7, end])
    assert plan.extended(cache, design) == {"mixgrpo": (3, 4), "treegrpo": (3, 4)}
    assert plan.seeds_of("treegrpo", design, plan.extended(cache, design)) == (0, 1, 2, 3, 4)
    # --status counts an extended method against its own seeds, the extension's included
    import compare_methods

    text = compare_methods.status(cache, design)
    assert "chosen 0.0003; reported 3/5" in text and "chosen 0.0001; reported 3/3" in text
    assert design.swept == ("treegrpo", "mixgrpo", "treegrpo_official")
    with pytest.raises(ValueError, match="would both tune and be reported"):
        plan.Design(sweep_seeds=(100,), extension_seeds=(100,))


def test_an_official_presets_grid_is_centred_on_its_best_screen_rate(tmp_path: Path) -> None:
    # screen rates 1e-4 and 3e-4 on seeds 100, 101: plateaus (0.7, 0.7) and (0.75, 0.65) score 0.7
    # and 0.7 - 0.0707 by the mean-minus-sd rule, so 1e-4 wins and the grid is 3e-5, 1e-4, 3e-4
    cache = RunCache(tmp_path, PROTOCOL)
    assert plan.screen_grid(cache, "treegrpo_official") is None  # not screened yet
    for s, (low, high) in zip(plan.SCREEN_SEEDS, ((0.7, 0.75), (0.7, 0.65))):
        write(cache, RunSpec("treegrpo_official", 1e-4, s), [0.5, 0.7, 0.7, 0.7, low])
        write(cache, RunSpec("treegrpo_official", 3e-4, s), [0.5, high, high, high, high])
    assert plan.screen_grid(cache, "treegrpo_official") == (3e-5, 1e-4, 3e-4)


def test_an_official_preset_that_collapses_at_every_screen_rate_centres_on_its_lowest(tmp_path: Path) -> None:
    # 1e-4 falls from 0.75 to 0.1 on both seeds (plateau 0.1), 3e-4 from 0.8 to 0.4 (plateau 0.4):
    # the best plateau is 3e-4's, yet both collapse, so the grid is centred on 1e-4, the lowest
    cache = RunCache(tmp_path, PROTOCOL)
    for s in plan.SCREEN_SEEDS:
        write(cache, RunSpec("treegrpo_official", 1e-4, s), [0.5, 0.75, 0.1, 0.1, 0.1])
        write(cache, RunSpec("treegrpo_official", 3e-4, s), [0.5, 0.8, 0.4, 0.4, 0.4])
    assert plan.screen_grid(cache, "treegrpo_official") == (3e-5, 1e-4, 3e-4)
    # one seed whose final lies exactly COLLAPSE_DROP below its peak has not collapsed: the best
    # plateau (3e-4, mean minus sd 0.45 - 0.0707 against 0.1) centres the grid again
    write(cache, RunSpec("treegrpo_official", 3e-4, 101), [0.5, 0.6, 0.5, 0.5, 0.6 - plan.COLLAPSE_DROP])
    assert plan.screen_grid(cache, "treegrpo_official") == (1e-4, 3e-4, 1e-3)


def test_the_screens_added_rate_comes_after_its_first_runs_and_leaves_the_official_grids_alone(tmp_path: Path) -> None:
    jobs = plan.screen_jobs()
    added = [s for s in jobs if s.lr in (3e-5,) and s.method != "treegrpo_official"]
    # the first 30 runs (the rates fixed before the screen), then the 3e-5 runs: five arms x two seeds
    assert len(jobs) == 40 and jobs[30:] == added and len(set(jobs)) == 40
    assert {s.method for s in added} == set(plan.SCREEN_RATES_ADDED) and "branchgrpo" not in plan.SCREEN_RATES_ADDED
    assert plan.screen_rates()["branchgrpo_official"] == (1e-5, 3e-5, 1e-4, 3e-4)
    # branchgrpo_official screened at 1e-5 (steady, 0.7) and 1e-4 (collapsing) centres its grid on
    # 1e-5 whatever its added 3e-5 runs hold: here a best-of-all 0.8 that, were it read, would win
    cache = RunCache(tmp_path, PROTOCOL)
    for s in plan.SCREEN_SEEDS:
        write(cache, RunSpec("branchgrpo_official", 1e-5, s), [0.5, 0.7, 0.7, 0.7, 0.7])
        write(cache, RunSpec("branchgrpo_official", 1e-4, s), [0.5, 0.75, 0.3, 0.3, 0.3])
        write(cache, RunSpec("branchgrpo_official", 3e-4, s), [0.5, 0.75, 0.2, 0.2, 0.2])
        write(cache, RunSpec("branchgrpo_official", 3e-5, s), [0.5, 0.8, 0.8, 0.8, 0.8])
    assert plan.screen_grid(cache, "branchgrpo_official") == (3e-6, 1e-5, 3e-5)


def test_an_interim_headline_with_every_reported_seed_names_the_runs_that_extend_a_pair() -> None:
    def pair(mean: float, lo: float, hi: float) -> dict:
        return {"seeds": list(range(10)), "final": {"mean": mean, "lo": lo, "hi": hi, "resolved": lo > 0 or hi < 0}}

    extending = {
        "complete": False,
        "missing": ["mixgrpo: 16 of 26 seeds not run", "branchgrpo_official: 4 of 10 seeds not run"],
        "protocol": {"budget": 750_000.0, "reported_seeds": list(range(10))},
        "methods": {"treegrpo": {"n": 10}, "mixgrpo": {"n": 10}, "dancegrpo": {"n": 10}},
        "pairs": {"treegrpo - mixgrpo": pair(0.012, -0.001, 0.024), "treegrpo - dancegrpo": pair(0.034, 0.023, 0.046)},
    }
    text = report.headline_sentence(extending)
    assert text.startswith("Interim while more seeds run (mixgrpo: 16 of 26 seeds not run; the pairs with it hold")
    assert "branchgrpo_official" not in text and "read nothing" not in text  # not a headline pair's
    assert "over 10 paired seeds: mixgrpo +0.012 [-0.001, +0.024] (not resolved)" in text


def test_the_headline_gives_a_rising_methods_ceiling_once_all_its_seeds_have_run() -> None:
    diff = {"seeds": list(range(10)), "final": {"mean": 0.034, "lo": 0.023, "hi": 0.046, "resolved": True}}
    rising = {"verdict": "still rising"}
    cap = {"budget": 1.2e6, "reward": {"mean": 0.7863, "lo": 0.781, "hi": 0.791}, "verdict": "above at the cap"}
    done = {
        "complete": True,
        "protocol": {"budget": 750_000.0, "reported_seeds": list(range(10))},
        "methods": {
            "treegrpo": {"n": 10},
            "dancegrpo": {"n": 10, "plateau": rising, "ceiling": {**cap, "n": 5, "planned": 5}},
            "flowgrpo": {"n": 10, "plateau": rising, "ceiling": {**cap, "n": 2, "planned": 5}},
            "branchgrpo": {"n": 10, "plateau": rising, "ceiling": {**cap, "verdict": "plateau", "n": 5, "planned": 5}},
            "mixgrpo": {"n": 10, "plateau": {"verdict": "flat"}, "ceiling": {**cap, "verdict": "plateau"}},
        },
        "pairs": {f"treegrpo - {m}": diff for m in ("dancegrpo", "flowgrpo", "branchgrpo", "mixgrpo")},
    }
    text = report.headline_sentence(done)
    assert (
        "dancegrpo +0.034 [+0.023, +0.046] (resolved; dancegrpo still rising, ceiling above 0.786 at the 1200k cap)"
        in text
    )
    assert "(resolved; flowgrpo still rising)" in text  # two of five seeds: not read yet
    assert "(resolved; branchgrpo still rising, ceiling 0.786 at 1200k)" in text
    assert "mixgrpo +0.034 [+0.023, +0.046] (resolved)" in text  # flat at this budget: its number is its ceiling


def test_the_header_names_the_seeds_an_extension_added() -> None:
    same = {"mixgrpo": list(range(10, 26)), "treegrpo": list(range(10, 26))}
    assert (
        report.extension_note(same) == "; mixgrpo and treegrpo also seeds 10-25 (the pair's pre-registered extension)"
    )
    assert report.extension_note({"mixgrpo": [10, 12], "treegrpo": [10]}) == (
        "; mixgrpo also seeds 10, 12 (the pair's pre-registered extension)"
        "; treegrpo also seeds 10 (the pair's pre-registered extension)"
    )
    assert report.extension_note({}) == ""  # a results.json from before the extension


def test_the_remedy_screen_runs_every_arm_beside_treegrpo_rate_major() -> None:
    from compare.methods import REMEDIES

    jobs = plan.remedy_jobs()
    methods = ["treegrpo", *REMEDIES]
    assert len(jobs) == len(set(jobs)) == len(methods) * 2 * 2
    # every arm at TreeGRPO's chosen rate (treegrpo first) before any at the other rate
    assert [s.lr for s in jobs] == [1e-4] * (len(jobs) // 2) + [3e-4] * (len(jobs) // 2)
    assert [s.method for s in jobs[:2]] == ["treegrpo", "treegrpo"]
    assert {s.seed for s in jobs} == {100, 101} and not {100, 101} & set(plan.REPORT_SEEDS)
    assert plan.REMEDY_SCREEN.protocol == plan.CEILING.protocol  # a 1.2M run begins as its 750k run
