"""benchmarks/compare/report.py's timing table: it says whether the cores were idle when the timing
ran (a seconds figure holds only for the load it was measured under)."""

from __future__ import annotations

from compare import report


def _timing(load: dict | None) -> dict:
    method = {
        "seconds_per_unit": 0.0012,
        "units_per_iteration": 1850.0,
        "seconds_per_iteration": 2.22,
        "seconds_per_sampling_forward": 0.0004,
        "seconds_per_trained_forward": 0.00093,
        "trained_forward_in_sampling_forwards": 2.325,
    }
    t = {"rounds": 3, "iterations": 3, "environment": {"cpu": "AMD EPYC"}, "methods": {"treegrpo": method}}
    return t if load is None else {**t, "load_average": load}


def test_the_timing_table_says_whether_the_cores_were_idle() -> None:
    idle = "\n".join(
        report.timing_table(_timing({"before": [0.48, 2.0, 3.0], "after": [1.0] * 3, "idle_before": True}))
    )
    assert "1-minute load average 0.48 before: the cores otherwise idle" in idle
    busy = "\n".join(
        report.timing_table(_timing({"before": [1.9, 2.0, 2.0], "after": [2.0] * 3, "idle_before": False}))
    )
    assert "1-minute load average 1.90 before: **other work shared the cores**" in busy
    # a timing written before the load was recorded says so instead of claiming either
    assert "the cores' load not recorded" in "\n".join(report.timing_table(_timing(None)))
    # ms per unit, units and seconds per iteration, ms per sampling / trained forward, their ratio
    assert "| treegrpo | 1.200 | 1850 | 2.22 | 0.400 / 0.930 | 2.33 |" in idle
