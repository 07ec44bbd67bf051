"""benchmarks/compare/fidelity.py: the claims table and the papers' sentence where a quantity has no
value (a quick design: a target no seed reached, one seed, NaN written to JSON as null)."""

from __future__ import annotations

from compare import fidelity, report


def _report(speedup: dict, difference: dict) -> dict:
    return {
        "methods": {"treegrpo": {"compute_to_target": {"dancegrpo": {"speedup": speedup}}}},
        "pairs": {"branchgrpo - dancegrpo": {"final": difference}},
        "seconds": {"seconds_per_unit": {"dancegrpo": 2.0, "treegrpo": 1.0}},
    }


def test_claims_without_an_interval_are_not_resolved_and_still_tabulated() -> None:
    r = _report({"mean": None, "lo": None, "hi": None, "n": 2}, {"mean": -0.01, "lo": None, "hi": None, "n": 1})
    r["claims"] = fidelity.claims(r)
    verdicts = {(c["method"], c["axis"]): c["verdict"] for c in r["claims"]}
    # the speed-up on both axes (seconds scaled by 2.0 / 1.0) and the reward difference: no interval
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
    r = _report({"mean": 2.0, "lo": 1.5, "hi": 2.5, "n": 5}, {"mean": 0.02, "lo": 0.01, "hi": 0.03, "n": 5})
    r["claims"] = fidelity.claims(r)
    text = "\n".join(fidelity.tables(r))
    # seconds: the compute ratio times DanceGRPO's seconds per unit over TreeGRPO's (2.0 / 1.0)
    assert "| 2.00x [1.50x, 2.50x] speed-up to DanceGRPO's target | reproduced |" in text
    assert "| 4.00x [3.00x, 5.00x] speed-up to DanceGRPO's target | reproduced |" in text
    assert "| +0.020 [+0.010, +0.030] final reward | reproduced |" in text
