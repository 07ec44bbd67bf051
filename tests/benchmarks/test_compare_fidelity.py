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
