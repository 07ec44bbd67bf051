"""The whole report of a settled design (``plan.SETTLED``'s shape, scaled down): the official presets
swept on grids centred by the screen and reported, the screen's arms, MixGRPO and the settling
TreeGRPO extended to more seeds, a ceiling folder for a method still rising at the budget, the
timing. It runs on hand-written run records (the report reads curves; which model made them does
not matter to it), so that the report the long runs end in cannot first fail when they finish."""

from __future__ import annotations

import inspect
import json
import statistics
from pathlib import Path

import compare_methods
import pytest
from compare import plan, report
from compare.methods import HEADLINE, OFFICIAL, VARIANTS, RunSpec, resolved_config
from compare.plan import SCREEN_BASELINES, SCREEN_SEEDS, screen_rates
from compare.runs import Protocol, RunCache

from tests.benchmarks import records

# the report's 10 000-resample bootstraps in pure Python over ten methods and the plots: about 40 s
# on an idle core, so beside the long comparison tests rather than in the default suite
pytestmark = pytest.mark.slow

PROTOCOL = Protocol(budget=120.0, evaluations=6, eval_seeds=2)
CHOSEN = {"treegrpo": 1e-4, "mixgrpo": 3e-4, "dancegrpo": 3e-4, "flowgrpo": 1e-3, "branchgrpo": 1e-5}
DESIGN = plan.Design(
    protocol=PROTOCOL,
    sweep_seeds=SCREEN_SEEDS,  # the screen's runs are the official presets' first sweep seeds
    report_seeds=(0, 1, 2),
    variant_seeds=(0, 1),
    grids={m: (lr,) for m, lr in CHOSEN.items()},  # one rate: the sweep rule is tested elsewhere
    official=OFFICIAL,
    extension_seeds=(3, 4),
)
# each run's level at the end (the curves' shapes below); a method absent at a rate is not needed
LEVEL = {
    ("treegrpo", 1e-4): 0.80,
    ("treegrpo", 3e-4): 0.70,
    ("mixgrpo", 3e-4): 0.79,
    ("dancegrpo", 3e-4): 0.76,
    ("flowgrpo", 1e-3): 0.78,
    ("branchgrpo", 1e-5): 0.70,
    ("branchgrpo", 1e-4): 0.60,
    ("branchgrpo", 3e-4): 0.55,
    ("branchgrpo", 3e-5): 0.66,  # the screen's added rate
    ("treegrpo_softmax", 1e-4): 0.79,
    ("branchgrpo_pruned", 1e-5): 0.69,
    ("branchgrpo_mix", 1e-5): 0.74,
    # the official presets: the screen's best rate (1e-4) in the middle of its grid, so the grid stays
    ("branchgrpo_official", 1e-5): 0.72,
    ("branchgrpo_official", 3e-5): 0.74,
    ("branchgrpo_official", 1e-4): 0.77,
    ("branchgrpo_official", 3e-4): 0.60,
    ("treegrpo_official", 3e-5): 0.75,
    ("treegrpo_official", 1e-4): 0.79,
    ("treegrpo_official", 3e-4): 0.70,
    ("treegrpo_official_window", 1e-4): 0.80,
    ("treegrpo_official_window", 3e-4): 0.72,
    **{
        (arm, lr): level
        for arm, level in (
            ("branchgrpo_binary", 0.72),
            ("branchgrpo_split_noise", 0.65),
            ("branchgrpo_updates", 0.70),
            ("branchgrpo_equal_weight", 0.70),
        )
        for lr in (1e-5, 3e-5, 1e-4)
    },
}
RISING = {"dancegrpo", "flowgrpo", "branchgrpo"}  # linear to the end; the others level off at half the budget


def rewards(method: str, lr: float, seed: int, evaluations: int) -> list[float]:
    """A curve from 0.63 to the run's level, with a small wobble that differs by seed and method (so
    paired differences vary)."""
    level = LEVEL[(method, lr)]
    wobble = [0.004 * ((7 * seed + 3 * i + len(method)) % 5 - 2) for i in range(evaluations + 1)]
    rise = [i / evaluations if method in RISING else min(1.0, 2 * i / evaluations) for i in range(evaluations + 1)]
    return [round(0.63 + (level - 0.63) * r + w, 6) for r, w in zip(rise, wobble)]


CONFIGS: dict[str, dict] = {}


def write(cache: RunCache, spec: RunSpec, curve: list[float]) -> None:
    if spec.method not in CONFIGS:  # what a method trains does not depend on its rate or seed here
        CONFIGS[spec.method] = resolved_config(spec)
    records.write(cache, spec, curve, iterations=6, config=CONFIGS[spec.method])


def every_run() -> list[RunSpec]:
    runs = [RunSpec(m, lr, s) for m, lr in CHOSEN.items() for s in (*DESIGN.sweep_seeds, *DESIGN.report_seeds)]
    runs += [RunSpec(m, CHOSEN[m], s) for m in ("treegrpo", "mixgrpo") for s in DESIGN.extension_seeds]
    runs += [RunSpec(v, 1e-4 if v == "treegrpo_softmax" else 1e-5, s) for v in VARIANTS for s in DESIGN.variant_seeds]
    runs += [RunSpec(m, lr, s) for m, rates in screen_rates().items() for lr in rates for s in SCREEN_SEEDS]
    runs += [RunSpec(m, lr, s) for m, rates in SCREEN_BASELINES.items() for lr in rates for s in SCREEN_SEEDS]
    runs += [RunSpec(m, 3e-5, s) for m in OFFICIAL for s in SCREEN_SEEDS]  # each grid's third rate
    runs += [RunSpec(m, 1e-4, s) for m in OFFICIAL for s in DESIGN.report_seeds]
    return sorted(set(runs), key=lambda r: (r.method, r.lr, r.seed))


def timing() -> dict:
    ms = {"treegrpo": 1.2, "mixgrpo": 1.0, "dancegrpo": 1.05, "flowgrpo": 1.15, "branchgrpo": 1.5}
    ms |= {"treegrpo_softmax": 1.2, "branchgrpo_pruned": 1.3, "branchgrpo_mix": 1.0}
    ms |= {"treegrpo_official": 1.1, "branchgrpo_official": 1.4}
    return {
        "rounds": 3,
        "iterations": 3,
        "environment": {"cpu": "test"},
        "load_average": {"before": [0.3, 0.3, 0.3], "after": [1.0] * 3, "idle_before": True},
        "methods": {
            m: {
                "seconds_per_unit": v / 1000,
                "units_per_iteration": 2000.0,
                "seconds_per_iteration": 2 * v,
                "rounds_seconds_per_iteration": [2 * v, 2 * v * 1.01, 2 * v * 0.99],
                "seconds_per_sampling_forward": 0.0004,
                "seconds_per_trained_forward": 0.001,
                "trained_forward_in_sampling_forwards": 2.5,
            }
            for m, v in ms.items()
        },
    }


def final(method: str, lr: float, seeds: tuple[int, ...]) -> list[float]:
    return [rewards(method, lr, s, PROTOCOL.evaluations)[-1] for s in seeds]


@pytest.fixture(scope="module")
def settled(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("settled")
    cache = RunCache(out, PROTOCOL)
    for spec in every_run():
        write(cache, spec, rewards(spec.method, spec.lr, spec.seed, PROTOCOL.evaluations))
    # DanceGRPO, still rising at this budget, levels off at 0.79 by its cap in the ceiling folder
    ceiling = RunCache(out / "ceiling", plan.CEILING.protocol)
    n = plan.CEILING.protocol.evaluations
    for s in plan.CEILING.report_seeds:
        write(ceiling, RunSpec("dancegrpo", 3e-4, s), [0.63 + 0.16 * min(1.0, 2 * i / n) for i in range(n + 1)])
    # BranchGRPO's ceiling runs are under way: two of its five seeds, still rising at the cap
    for s in plan.CEILING.report_seeds[:2]:
        write(ceiling, RunSpec("branchgrpo", 1e-5, s), [0.60 + 0.002 * s + 0.004 * i for i in range(n + 1)])
    (out / "timing.json").write_text(json.dumps(timing()))
    marked = f"before\n{report.BEGIN}\nold\n{report.END}\nafter\n"
    docs = [out / "results.md", out / "README.md"]
    for doc in docs:
        doc.write_text(marked)
    results = compare_methods.write_report(cache, DESIGN, out, docs, ceiling_out=out / "ceiling")
    return results, out


def test_the_settled_design_is_complete_with_its_extension_and_official_presets(settled) -> None:
    results, out = settled
    assert results["complete"] and results["missing"] == []
    methods = results["methods"]
    assert [methods[m]["n"] for m in HEADLINE] == [5, 5, 3, 3, 3]  # TreeGRPO and MixGRPO extended
    assert {m: (methods[m]["lr"], methods[m]["n"]) for m in OFFICIAL} == {m: (1e-4, 3) for m in OFFICIAL}
    official = results["sweep"]["branchgrpo_official"]
    assert official["grid"] == [3e-5, 1e-4, 3e-4] and official["chosen_lr"] == 1e-4  # centred by the screen
    # the official preset against its base and DanceGRPO, paired on the reported seeds
    diff = results["official_pairs"]["branchgrpo_official - branchgrpo"]
    assert diff["seeds"] == [0, 1, 2]
    expected = statistics.fmean(
        a - b for a, b in zip(final("branchgrpo_official", 1e-4, (0, 1, 2)), final("branchgrpo", 1e-5, (0, 1, 2)))
    )
    assert diff["final"]["mean"] == pytest.approx(expected)
    assert "branchgrpo_official - dancegrpo" in results["official_pairs"]
    # the screen's other quantities over the same seeds: the peak difference, seed by seed
    peak = diff["quantities"]["peak"]
    assert peak["t"]["n"] == 3 and len(peak["diffs"]) == 3
    assert results["curve_pair"]["pair"].startswith("treegrpo") and len(results["curve_pair"]["seeds"]) == 5
    # the header names the extension's seeds beside the protocol's reported seeds
    assert results["protocol"]["extension_seeds"] == {"mixgrpo": [3, 4], "treegrpo": [3, 4]}
    assert "reported seeds 0, 1, 2; mixgrpo and treegrpo also seeds 3, 4 (the pair's pre-registered extension);" in (
        report.tables(results)
    )


def test_the_ceilings_extend_every_method_still_rising_official_presets_included(settled) -> None:
    results, out = settled
    methods = results["methods"]
    # the planner extends what the report calls still rising (the scaled curves' wobble makes an
    # official preset one of them), at the chosen rate, on the ceiling's seeds
    rising = [m for m in plan.CEILING_ORDER if methods[m]["plateau"]["verdict"] == "still rising"]
    assert {"dancegrpo", "flowgrpo", "branchgrpo"} <= set(rising) and set(rising) & set(OFFICIAL)
    jobs = plan.ceiling_jobs(RunCache(out, PROTOCOL), DESIGN)
    assert jobs == [RunSpec(m, methods[m]["lr"], s) for m in rising for s in plan.CEILING.report_seeds]
    assert set(OFFICIAL) <= set(plan.CEILING_ORDER)
    assert inspect.signature(plan.ceiling_jobs).parameters["design"].default is plan.SETTLED


def test_the_settled_reports_ceilings_screen_and_claims_come_from_the_records(settled) -> None:
    results, out = settled
    methods = results["methods"]
    assert methods["dancegrpo"]["plateau"]["verdict"] == "still rising"
    assert methods["dancegrpo"]["ceiling"]["verdict"] == "plateau"  # the ceiling folder's runs level off
    assert methods["dancegrpo"]["ceiling"]["reward"]["mean"] == pytest.approx(0.79)
    assert methods["treegrpo"]["ceiling"]["verdict"] == "plateau"  # flat at this budget already
    assert methods["flowgrpo"]["ceiling"]["verdict"] == "still rising, no runs past the budget yet"
    # a ceiling says how many of its planned seeds it holds, and "so far" while they run
    branch = methods["branchgrpo"]["ceiling"]
    assert branch["verdict"] == "above at the cap" and (branch["n"], branch["planned"]) == (2, 5)
    # the cap's slope beside it: each seed's line rises 0.004 an evaluation, so every bootstrap draw
    # of the mean does too; DanceGRPO's runs are level over the cap's last third
    per_100k = 0.004 / (plan.CEILING.protocol.budget / plan.CEILING.protocol.evaluations) * 1e5
    assert branch["slope"] == pytest.approx({"mean": per_100k, "lo": per_100k, "hi": per_100k})
    assert methods["dancegrpo"]["ceiling"]["slope"] == pytest.approx({"mean": 0.0, "lo": 0.0, "hi": 0.0}, abs=1e-12)
    text = report.tables(results)
    rise = f"{per_100k:+.4f}"
    cell = f"| above {branch['reward']['mean']:.3f} at the 1200k cap (2 of 5 seeds so far; slope there {rise} [{rise}, {rise}]) |"
    assert cell in text
    # the official presets have rows too: the ceiling plan extends them like the headline methods
    for m in OFFICIAL:
        verdict = methods[m]["plateau"]["verdict"]
        [row] = [r for r in text.splitlines() if r.startswith(f"| {m} | 3 |") and f"| {verdict} |" in r]
        assert row.endswith("| not measured yet (still rising, no runs past the budget yet) |") == (
            verdict == "still rising"
        )
    [dance] = [row for row in text.splitlines() if row.startswith("| dancegrpo |") and "| still rising |" in row]
    assert dance.endswith(" at 1200k (5 seeds; slope there +0.0000 [+0.0000, +0.0000]) |")
    binary = results["screen"]["arms"]["branchgrpo_binary"]["rates"]["1e-05"]
    assert binary["final"]["direction"] == "up" and binary["final"]["arm"] == pytest.approx(
        statistics.fmean(final("branchgrpo_binary", 1e-5, SCREEN_SEEDS))
    )
    window = results["screen"]["arms"]["treegrpo_official_window"]  # paired with the official preset
    assert window["base"] == "treegrpo_official" and window["rates"]["0.0001"]["final"]["direction"] == "up"
    claims = {(c["method"], c["axis"]): c["verdict"] for c in results["claims"]}
    assert claims[("branchgrpo", "compute")] == "contradicted"  # 0.70 against DanceGRPO's 0.76
    assert ("branchgrpo_official", "compute") in claims and ("branchgrpo_mix", "seconds per iteration") in claims
    # the file, the tables and the docs' generated regions say the same
    saved = json.loads((out / "results.json").read_text())
    text = (out / "report.md").read_text()
    assert text == report.tables(saved) + "\n"
    assert (
        "| branchgrpo_binary | 1e-05 |" in text
        and "| treegrpo_official_window | 0.0003 |" in text
        and "| branchgrpo_official - branchgrpo | 3 |" in text
        and "over 3 paired seeds: together they" in text
    )
    assert "| dancegrpo | 3 |" in text and "still rising" in text
    assert report.generated_region((out / "README.md").read_text()) == saved["headline"]
    assert report.generated_region((out / "results.md").read_text()).startswith(text.strip("\n"))
