"""benchmarks/compare/fidelity.py: the claims table and the papers' sentence where a quantity has no
value (a quick design: a target no seed reached, one seed, NaN written to JSON as null)."""

from __future__ import annotations

import pytest
from compare import fidelity, report


def _report(speedup: dict, difference: dict, units: dict[str, list[float]]) -> dict:
    """A report's claims inputs: TreeGRPO's speed-up as given, each method's compute to DanceGRPO's
    target per seed (``units``, budget 100) and the seconds per unit (DanceGRPO 2.0, TreeGRPO 1.0)."""
    to_target = {m: {"units": u, "reached": [x < 100.0 for x in u]} for m, u in units.items()}
    return {
        "protocol": {"budget": 100.0},
        "methods": {
            "treegrpo": {"compute_to_target": {"dancegrpo": {**to_target["treegrpo"], "speedup": speedup}}},
            "dancegrpo": {"compute_to_target": {"dancegrpo": to_target["dancegrpo"]}},
        },
        "pairs": {"branchgrpo - dancegrpo": {"final": difference}},
        "seconds": {"seconds_per_unit": {"dancegrpo": 2.0, "treegrpo": 1.0}},
    }


def test_claims_without_an_interval_are_not_resolved_and_still_tabulated() -> None:
    # both methods at the target from the start on both seeds: 0 / 0 on both axes
    units = {"treegrpo": [0.0, 0.0], "dancegrpo": [0.0, 0.0]}
    r = _report({"mean": None, "lo": None, "hi": None, "n": 2}, {"mean": -0.01, "lo": None, "hi": None, "n": 1}, units)
    r["claims"] = fidelity.claims(r)
    verdicts = {(c["method"], c["axis"]): c["verdict"] for c in r["claims"]}
    # the speed-up on both axes and the reward difference: no interval
    assert verdicts == {
        ("treegrpo", "compute"): "not resolved",
        ("treegrpo", "seconds"): "not resolved",
        ("branchgrpo", "compute"): "not resolved",
    }
    text = "\n".join(fidelity.tables(r))
    assert "| n/a speed-up to DanceGRPO's target | not resolved |" in text
    assert "| -0.010 final reward | not resolved |" in text
    assert "TreeGRPO faster than DanceGRPO: not resolved (n/a in compute, n/a in seconds)" in report.papers_sentence(
        r["claims"]
    )


def test_a_resolved_speed_up_shows_its_interval_on_both_axes() -> None:
    units = {"treegrpo": [10.0, 20.0], "dancegrpo": [20.0, 40.0]}
    r = _report({"mean": 2.0, "lo": 1.5, "hi": 2.5, "n": 5}, {"mean": 0.02, "lo": 0.01, "hi": 0.03, "n": 5}, units)
    r["claims"] = fidelity.claims(r)
    text = "\n".join(fidelity.tables(r))
    assert "| 2.00x [1.50x, 2.50x] speed-up to DanceGRPO's target | reproduced |" in text
    # seconds, every seed inside the horizon: (40 + 80) s over (10 + 20) s, each pair 4x
    assert "| 4.00x [4.00x, 4.00x] speed-up to DanceGRPO's target | reproduced |" in text
    assert "| +0.020 [+0.010, +0.030] final reward | reproduced |" in text


def test_a_seed_neither_method_reaches_counts_alike_on_the_seconds_axis() -> None:
    # budget 100 units; TreeGRPO 1 s per unit, DanceGRPO 2 s: the common horizon is TreeGRPO's 100 s.
    # Seed 0: 20 units (40 s) against 10 (10 s); seed 1: neither reaches the target, both at 100 s,
    # so (40 + 100) / (10 + 100), where the compute ratio scaled by 2.0 would read (120 / 110) x 2.
    units = {"treegrpo": [10.0, 100.0], "dancegrpo": [20.0, 100.0]}
    r = _report(
        {"mean": 120 / 110, "lo": 1.0, "hi": 2.0, "n": 2}, {"mean": 0.0, "lo": -0.01, "hi": 0.01, "n": 2}, units
    )
    seconds = next(c for c in fidelity.claims(r) if c["method"] == "treegrpo" and c["axis"] == "seconds")
    assert seconds["ours"]["mean"] == pytest.approx(140 / 110)
    assert seconds["ours"]["horizon_seconds"] == 100.0
    r["claims"] = fidelity.claims(r)
    text = "\n".join(fidelity.tables(r))
    assert (
        "| 1.27x [1.00x, 4.00x] speed-up to DanceGRPO's target (never reached: 1 of 2 of its seeds, 1 of DanceGRPO's) | not resolved |"
        in text
    )


def test_paired_quantities_are_the_screens_reading_of_two_methods_at_their_rates(tmp_path) -> None:
    from compare.methods import RunSpec
    from compare.runs import Protocol, RunCache

    from tests.benchmarks.records import write

    # budget 100, evaluations every 25 units; target 0.7
    cache = RunCache(tmp_path, Protocol(budget=100.0, evaluations=4, eval_seeds=2))
    # the official preset: seed 0 peaks 0.8 at 50 and ends 0.75; reaches 0.7 half-way from 25 (0.6) to
    # 50 (0.8), at 37.5. Seed 1 climbs to 0.72 at the end, reaching 0.7 at 75 + 25 x (0.1 / 0.12)
    write(cache, RunSpec("branchgrpo_official", 3e-5, 0), [0.5, 0.6, 0.8, 0.78, 0.75])
    write(cache, RunSpec("branchgrpo_official", 3e-5, 1), [0.5, 0.55, 0.58, 0.6, 0.72])
    # DanceGRPO at its own rate: seed 0 never reaches 0.7 (censored at 100); seed 1 at 50 exactly
    write(cache, RunSpec("dancegrpo", 3e-4, 0), [0.5, 0.6, 0.65, 0.66, 0.69])
    write(cache, RunSpec("dancegrpo", 3e-4, 1), [0.5, 0.6, 0.7, 0.7, 0.7])
    q = fidelity.paired_quantities(cache, {"branchgrpo_official": 3e-5, "dancegrpo": 3e-4}, [0, 1], 100.0, 0.7)
    assert q["n"] == 2
    assert q["final"]["diffs"] == pytest.approx([0.75 - 0.69, 0.72 - 0.7])
    assert q["peak"]["arm_per_seed"] == pytest.approx([0.8, 0.72])
    assert q["drop"]["diffs"] == pytest.approx([0.05 - 0.0, 0.0 - 0.0])
    assert q["units_to_target"]["diffs"] == pytest.approx([37.5 - 100.0, 75 + 25 * 0.1 / 0.12 - 50.0])
    assert q["units_to_target"]["direction"] == "mixed" and q["final"]["direction"] == "up"
    write(cache, RunSpec("branchgrpo_official", 3e-5, 2), [0.5, 0.6, 0.7, 0.7, 0.7])
    with pytest.raises(ValueError, match="no run of dancegrpo on seed 2"):
        fidelity.paired_quantities(cache, {"branchgrpo_official": 3e-5, "dancegrpo": 3e-4}, [0, 2], 100.0, 0.7)


def _gap_report(vs_dance: tuple[float, float, float], vs_today: tuple[float, float, float], seeds: int) -> dict:
    """A report with BranchGRPO's pairs (mean, lo, hi) and a screen of two arms at 1e-05 and 3e-05."""

    def final(mean: float, lo: float, hi: float) -> dict:
        return {"final": {"mean": mean, "lo": lo, "hi": hi, "resolved": lo > 0 or hi < 0}, "seeds": list(range(seeds))}

    def rate(finals: list[float], drops: list[float], drop_diffs: list[float]) -> dict:
        return {"final": {"arm_per_seed": finals}, "drop": {"arm_per_seed": drops, "diffs": drop_diffs}}

    return {
        "protocol": {"reported_seeds": list(range(10))},
        "methods": {"branchgrpo_official": {"lr": 3e-5}},
        "pairs": {"branchgrpo - dancegrpo": final(-0.05, -0.06, -0.04)},
        "official_pairs": {
            "branchgrpo_official - dancegrpo": final(*vs_dance),
            "branchgrpo_official - branchgrpo": final(*vs_today),
        },
        "screen": {
            "seeds": [100, 101],
            "target": 0.76,
            "arms": {
                # today's preset at 3e-05 drops 0.11 and 0.02 (each arm's drop minus its difference)
                "branchgrpo_official": {
                    "base": "branchgrpo",
                    "rates": {"3e-05": rate([0.7599, 0.77], [0.005, 0.0], [-0.105, -0.02])},
                },
                "branchgrpo_binary": {
                    "base": "branchgrpo",
                    "rates": {
                        "1e-05": rate([0.70, 0.71], [0.0, 0.0], [0.0, 0.0]),
                        "3e-05": rate([0.65, 0.74], [0.12, 0.01], [0.01, -0.01]),
                    },
                },
                "treegrpo_official": {"base": "treegrpo", "rates": {"3e-05": rate([0.9, 0.9], [0.0, 0.0], [0.0, 0.0])}},
            },
        },
    }


def test_the_gap_sentence_reads_the_verdict_by_the_rules_fixed_before_the_runs() -> None:
    # not separated from DanceGRPO, resolved above today's preset: closed
    text = fidelity.gap(_gap_report((0.01, -0.005, 0.02), (0.06, 0.05, 0.07), 10))
    assert text is not None and not text.startswith("Interim")
    assert "today's `branchgrpo` ends -0.050 [-0.060, -0.040] against DanceGRPO" in text
    assert "(`branchgrpo_official`, at 3e-05, its sweep's rate) end +0.010 [-0.005, +0.020] against DanceGRPO" in text
    assert "(not resolved) and +0.060 [+0.050, +0.070] against today's preset (resolved), over 10 paired seeds" in text
    assert "together they close the gap (not separated from DanceGRPO)" in text
    # the screen: no branchgrpo arm ends at or above 0.76 on both seeds (treegrpo's arms are not read);
    # the nearest is the official preset at 3e-05, its lower seed 0.0001 below
    assert "no setting, alone or together, ends at or above DanceGRPO's sweep plateau (0.7600)" in text
    assert "(the nearest: `branchgrpo_official` at 3e-05, 0.7599, 0.7700; its lowest -0.0001)" in text
    # steady at the added rate: the official preset (drops 0.005, 0) and not binary (0.12 on seed 100);
    # today's preset drops 0.005 + 0.105 and 0.0 + 0.02
    assert "`branchgrpo_official` (drops 0.005, 0.000); today's preset drops 0.110, 0.020." in text
    assert "`branchgrpo_binary` (drops" not in text
    reversed_ = fidelity.gap(_gap_report((0.02, 0.01, 0.03), (0.06, 0.05, 0.07), 10))
    assert "together they reverse the gap" in reversed_
    narrowed = fidelity.gap(_gap_report((-0.02, -0.03, -0.01), (0.03, 0.02, 0.04), 10))
    assert "together they narrow the gap without closing it" in narrowed
    kept = fidelity.gap(_gap_report((-0.05, -0.06, -0.04), (0.0, -0.01, 0.01), 4))
    assert kept.startswith("Interim (4 of 10 reported seeds") and "together they do not close it" in kept


def test_an_arm_at_the_target_on_every_seed_closes_the_gap_in_the_screen() -> None:
    r = _gap_report((0.01, -0.005, 0.02), (0.06, 0.05, 0.07), 10)
    r["screen"]["arms"]["branchgrpo_binary"]["rates"]["1e-05"]["final"]["arm_per_seed"] = [0.76, 0.80]
    text = fidelity.gap(r)
    assert "In the screen (2 seeds per rate), `branchgrpo_binary` at 1e-05 ends at or above" in text
    assert "the nearest" not in text
    del r["official_pairs"]["branchgrpo_official - branchgrpo"]
    assert fidelity.gap(r) is None  # the official preset not yet paired with today's
