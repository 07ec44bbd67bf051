"""The verdict's analyses of ``results.json`` (docs/benchmarks.md, "Settling the verdict"), fixed
before the runs they read: each method's plateau test and ceiling, the held-out reward against
seconds, compute and seconds to fixed reward levels with speed-ups, Student-t intervals and Holm's
correction over the pairwise tests, and the whole-curve comparison of one extended pair."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

from . import stats

LEVELS = (0.75, 0.775, 0.79)
"""Held-out reward levels fixed before the runs: each method's compute and seconds to each."""


def points(run_curve: list[dict[str, float]]) -> list[tuple[float, float]]:
    return [(p["units"], p["reward"]) for p in run_curve]


def plateau(m: dict[str, Any], budget: float, evaluations: int, seed: int) -> dict[str, Any]:
    """The method's plateau test over its reported seeds (:func:`~.stats.plateau_test`)."""
    return stats.plateau_test([points(c) for c in m["curves"]], budget, evaluations, seed=seed)


def ceiling(m: dict[str, Any], longer: dict[str, Any] | None) -> dict[str, Any]:
    """Where the method's curve levels off: its plateau at this budget when the plateau test does
    not find it still rising; else the longer design's (``longer``: its summary at the cap), or
    "above X at the cap" while that still rises; ``reward`` None while no longer run exists."""
    if m["plateau"]["verdict"] != "still rising":
        return {"budget": m["plateau"]["to_units"], "reward": m["last_three"], "verdict": "plateau"}
    if longer is None:
        return {"budget": None, "reward": None, "verdict": "still rising, no runs past the budget yet"}
    # n of planned: the ceiling's runs so far (a report written while they run says how many); the
    # slope at the cap says how far from flat a method "above X at the cap" still is
    cap = longer["plateau"]
    seeds = {
        "n": longer["n"],
        "planned": longer["planned"],
        "slope": {"mean": cap["slope"], "lo": cap["lo"], "hi": cap["hi"]},
    }
    if cap["verdict"] != "still rising":
        return {"budget": cap["to_units"], "reward": longer["last_three"], "verdict": "plateau", **seeds}
    return {"budget": cap["to_units"], "reward": longer["final"], "verdict": "above at the cap", **seeds}


def finished_ceiling(c: dict[str, Any] | None) -> str | None:
    """A ceiling from longer runs in a few words ("ceiling above 0.786 at the 1200k cap", "ceiling
    0.790 at 1200k") once all its planned seeds have run; None before then, or without one."""
    if not c or c.get("reward") is None or "n" not in c or c["n"] < c["planned"]:
        return None
    if c["verdict"] == "plateau":
        return f"ceiling {c['reward']['mean']:.3f} at {_k(c['budget'])}"
    return f"ceiling above {c['reward']['mean']:.3f} at the {_k(c['budget'])} cap"


def seconds_per_unit(timing: dict[str, Any] | None, method: str) -> float | None:
    if timing is None or method not in timing["methods"]:
        return None
    return timing["methods"][method]["seconds_per_unit"]


def seconds_axis(
    methods: dict[str, Any], names: list[str], timing: dict[str, Any] | None, seed: int
) -> dict[str, Any] | None:
    """The reward at equal seconds: every method's counted units converted at its measured seconds
    per unit, read at the shortest method's budget in seconds (the common horizon), with TreeGRPO's
    paired difference to each other method there."""
    rates = {m: seconds_per_unit(timing, m) for m in names}
    if not names or None in rates.values():
        return None
    budget = {m: methods[m]["curves"][0][-1]["units"] for m in names}
    horizon = min(budget[m] * rates[m] for m in names)
    reward = {m: [stats.at(points(c), horizon / rates[m]) for c in methods[m]["curves"]] for m in names}
    out: dict[str, Any] = {
        "seconds_per_unit": rates,
        "horizon_seconds": horizon,
        "reward": {m: stats.bootstrap(reward[m], seed=seed) for m in names},
        "per_seed": {m: dict(zip(methods[m]["seeds"], reward[m])) for m in names},
        "pairs": {},
    }
    if "treegrpo" in names:
        mine = dict(zip(methods["treegrpo"]["seeds"], reward["treegrpo"]))
        for other in names:
            if other == "treegrpo":
                continue
            theirs = dict(zip(methods[other]["seeds"], reward[other]))
            common = [s for s in methods[other]["seeds"] if s in mine]
            if len(common) >= 2:
                a, b = [mine[s] for s in common], [theirs[s] for s in common]
                out["pairs"][f"treegrpo - {other}"] = {
                    "seeds": common,
                    "final": stats.paired_difference(a, b, seed=seed),
                    "final_t": stats.paired_t(a, b),
                }
    return out


def level_targets(
    methods: dict[str, Any], names: list[str], timing: dict[str, Any] | None, budget: float, seed: int
) -> dict[str, Any]:
    """Compute and seconds to each of :data:`LEVELS` (censored at the budget) and the speed-ups
    against DanceGRPO and of TreeGRPO against each method, paired by seed."""
    out: dict[str, Any] = {}
    for level in LEVELS:
        key = f"{level:g}"
        per: dict[str, Any] = {}
        for m in names:
            reached = [stats.to_target(points(c), level, budget) for c in methods[m]["curves"]]
            rate = seconds_per_unit(timing, m)
            per[m] = {
                "seeds": methods[m]["seeds"],
                "units": [u for u, _ in reached],
                "reached": [bool(ok) for _, ok in reached],
                "mean_units": stats.bootstrap([u for u, _ in reached], seed=seed),
                "seconds_per_unit": rate,
            }
        speedups = {}
        for base, m in [("dancegrpo", m) for m in names if m != "dancegrpo"] + [
            (m, "treegrpo") for m in names if m != "treegrpo"
        ]:
            if base not in per or m not in per:
                continue
            key_pair = f"{m} vs {base}"
            if key_pair in speedups:
                continue
            common = [s for s in per[m]["seeds"] if s in per[base]["seeds"]]
            if len(common) < 2:
                continue
            units = {n: dict(zip(per[n]["seeds"], per[n]["units"])) for n in (m, base)}
            ratio = stats.ratio_of_means([units[base][s] for s in common], [units[m][s] for s in common], seed=seed)
            rb, rm = per[base]["seconds_per_unit"], per[m]["seconds_per_unit"]
            speedups[key_pair] = {
                "seeds": common,
                "compute": ratio,
                # units at each method's measured rate, censored at the pair's common horizon in seconds
                "seconds": None
                if not (rb and rm)
                else stats.seconds_ratio(
                    [units[base][s] for s in common], rb, [units[m][s] for s in common], rm, budget, seed=seed
                ),
            }
        out[key] = {"methods": per, "speedups": speedups}
    return out


def holm_families(report: dict[str, Any]) -> dict[str, Any]:
    """Holm's correction at 5% over the two families: the headline pairs' final-reward differences
    (paired-t p-values) and the speed-ups to the fixed levels (bootstrap p-values, compute axis;
    the seconds axis resamples the same seeds and is tabulated uncorrected, as pre-registered). Marks each test ``holm`` and returns the family sizes."""
    pairs = {k: d["final_t"]["p"] for k, d in report["pairs"].items()}
    for k, ok in stats.holm(pairs).items():
        report["pairs"][k]["final_t"]["holm"] = ok
    ratios = {
        f"{level} {key}": s["compute"]["p"]
        for level, t in report.get("level_targets", {}).items()
        for key, s in t["speedups"].items()
    }
    for name, ok in stats.holm(ratios).items():
        level, key = name.split(" ", 1)
        report["level_targets"][level]["speedups"][key]["compute"]["holm"] = ok
    return {"pairs": len(pairs), "speedups": len(ratios), "alpha": round(1 - stats.LEVEL, 10)}


def curve_pair(
    methods: dict[str, Any], a: str, b: str, budget: float, evaluations: int, seed: int
) -> dict[str, Any] | None:
    """``a`` minus ``b`` at every evaluation point over their common seeds (Student-t CI; who leads
    where the CI excludes 0) and the crossing point: the last point where the mean difference
    changes sign (linear between evaluations), with a bootstrap CI over pairs."""
    if a not in methods or b not in methods:
        return None
    common = [s for s in methods[a]["seeds"] if s in methods[b]["seeds"]]
    if len(common) < 3:
        return None
    xs = [budget * i / evaluations for i in range(evaluations + 1)]
    pick = {n: dict(zip(methods[n]["seeds"], methods[n]["curves"])) for n in (a, b)}
    diffs = [[stats.at(points(pick[a][s]), x) - stats.at(points(pick[b][s]), x) for x in xs] for s in common]  # [S][X]
    rows = []
    for j, x in enumerate(xs[1:], start=1):
        t = stats.paired_t([d[j] for d in diffs], [0.0] * len(diffs))
        lead = a if t["lo"] > 0 else b if t["hi"] < 0 else None
        rows.append({"units": x, "mean": t["mean"], "lo": t["lo"], "hi": t["hi"], "leads": lead})

    def crossing(sample: list[list[float]]) -> float | None:
        mean = [statistics.fmean(d[j] for d in sample) for j in range(len(xs))]
        found = None
        for j in range(1, len(xs) - 1):
            y0, y1 = mean[j], mean[j + 1]
            if (y0 < 0 <= y1) or (y0 > 0 >= y1):
                found = xs[j] + (xs[j + 1] - xs[j]) * (-y0) / (y1 - y0) if y1 != y0 else xs[j]
        return found

    rng = random.Random(seed)
    n = len(diffs)
    draws = [crossing([diffs[rng.randrange(n)] for _ in range(n)]) for _ in range(stats.RESAMPLES)]
    found = sorted(d for d in draws if d is not None)
    alpha = (1 - stats.LEVEL) / 2
    return {
        "pair": f"{a} - {b}",
        "seeds": common,
        "points": rows,
        "crossing": crossing(diffs),
        "crossing_lo": stats.quantile(found, alpha) if found else None,
        "crossing_hi": stats.quantile(found, 1 - alpha) if found else None,
        "resamples_without_crossing": (len(draws) - len(found)) / len(draws),
    }


def leads(curve: dict[str, Any]) -> list[tuple[str, float, float]]:
    """The stretches of the curve where one method leads: (method, from units, to units)."""
    out: list[tuple[str, float, float]] = []
    for p in curve["points"]:
        if p["leads"] is None:
            continue
        if (
            out
            and out[-1][0] == p["leads"]
            and math.isclose(out[-1][2], p["units"] - (curve["points"][1]["units"] - curve["points"][0]["units"]))
        ):
            out[-1] = (p["leads"], out[-1][1], p["units"])
        else:
            out.append((p["leads"], p["units"], p["units"]))
    return out


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------


def _ci(d: dict[str, Any], digits: int = 3, sign: str = "") -> str:
    return f"{d['mean']:{sign}.{digits}f} [{d['lo']:{sign}.{digits}f}, {d['hi']:{sign}.{digits}f}]"


def _k(units: float) -> str:
    return f"{units / 1000:.0f}k"


def _x(d: dict[str, Any] | None) -> str:
    if d is None or d["mean"] is None or not math.isfinite(d["mean"]):
        return "—"
    lo = "—" if d["lo"] is None or not math.isfinite(d["lo"]) else f"{d['lo']:.2f}x"
    hi = "—" if d["hi"] is None or not math.isfinite(d["hi"]) else f"{d['hi']:.2f}x"
    return f"{d['mean']:.2f}x [{lo}, {hi}]"


def _ceiling_seeds(c: dict[str, Any]) -> str:
    """' (5 seeds; slope there +0.0040 [...])' for a ceiling from longer runs, ' (2 of 5 seeds so
    far; ...)' while they run; '' for a plateau at this budget (its seeds and slope are the table's)."""
    if "n" not in c:
        return ""
    seeds = f"{c['n']} seeds" if c["n"] >= c["planned"] else f"{c['n']} of {c['planned']} seeds so far"
    return f" ({seeds}; slope there {_ci(c['slope'], 4, '+')})"


def tables(report: dict[str, Any]) -> list[str]:
    """The verdict's tables (Markdown lines), from ``results.json``."""
    methods, lines = report["methods"], []
    headline = [m for m in report["sweep"] if m in methods and "ceiling" in methods[m]]
    if headline:
        tol = methods[headline[0]]["plateau"]["tolerance"]
        lines += [
            "",
            f"Plateau test (the seed-mean curve's least-squares slope over the last third of the budget, per 100k "
            f"units, 95% bootstrap CI over seeds; still rising where the CI lies at or above {tol:g}) and ceiling "
            "(the mean of the last three evaluations where flat; the cap's final mean where still rising there; "
            "a ceiling from longer runs gives their seeds and the same test's slope at the cap):",
            "",
            "| method | seeds | slope per 100k units | verdict | ceiling |",
            "|---|---|---|---|---|",
        ]
        for m in headline:
            p, c = methods[m]["plateau"], methods[m]["ceiling"]
            if c["reward"] is None:
                cell = "not measured yet (" + c["verdict"] + ")"
            elif c["verdict"] == "plateau":
                cell = f"{_ci(c['reward'])} at {_k(c['budget'])}" + _ceiling_seeds(c)
            else:
                cell = f"above {c['reward']['mean']:.3f} at the {_k(c['budget'])} cap" + _ceiling_seeds(c)
            slope = {"mean": p["slope"], "lo": p["lo"], "hi": p["hi"]}
            lines.append(f"| {m} | {p['n']} | {_ci(slope, 4, '+')} | {p['verdict']} | {cell} |")
    mult = report.get("multiplicity")
    if mult and report["pairs"] and all("holm" in d.get("final_t", {}) for d in report["pairs"].values()):
        lines += [
            "",
            f"Final reward, paired Student-t 95% CI and Holm's correction over the {mult['pairs']} pairs "
            "(family-wise 5%):",
            "",
            "| pair | seeds | t CI | p | resolved after Holm |",
            "|---|---|---|---|---|",
        ]
        for key, d in report["pairs"].items():
            t = d["final_t"]
            lines.append(f"| {key} | {t['n']} | {_ci(t, 4, '+')} | {t['p']:.4f} | {'yes' if t['holm'] else 'no'} |")
    cp = report.get("curve_pair")
    if cp:
        stretches = "; ".join(f"{m} leads from {_k(a)} to {_k(b)}" for m, a, b in leads(cp)) or "neither leads anywhere"
        crossing = (
            "no crossing"
            if cp["crossing"] is None
            else f"the curves cross at {_k(cp['crossing'])} units"
            + (f" [{_k(cp['crossing_lo'])}, {_k(cp['crossing_hi'])}]" if cp["crossing_lo"] is not None else "")
        )
        lines += [
            "",
            f"{cp['pair']} along the whole curve over {len(cp['seeds'])} paired seeds (t CI at each evaluation): "
            f"{stretches}; {crossing} ({100 * cp['resamples_without_crossing']:.0f}% of bootstrap resamples "
            "have none).",
        ]
    sec = report.get("seconds")
    if sec:
        lines += [
            "",
            f"At equal seconds: every run's units at its method's measured seconds per unit, read at "
            f"{sec['horizon_seconds']:.0f} s (the shortest method's budget in seconds):",
            "",
            "| method | ms per unit | reward at equal seconds |",
            "|---|---|---|",
        ]
        for m, r in sec["reward"].items():
            lines.append(f"| {m} | {1000 * sec['seconds_per_unit'][m]:.3f} | {_ci(r)} |")
        for key, d in sec["pairs"].items():
            lines.append(
                f"| {key} (paired) | | {_ci(d['final'], 4, '+')} ({'resolved' if d['final']['resolved'] else 'not resolved'}) |"
            )
    lt = report.get("level_targets")
    if lt:
        n = (mult or {}).get("speedups")
        lines += [
            "",
            "Compute and seconds to fixed held-out rewards (seeds reaching it; mean units, censored at the budget), "
            f"and speed-ups (95% paired bootstrap CI; Holm over the {n} speed-ups, compute axis; seconds: each "
            "seed's units at its method's seconds per unit, both methods censored at the pair's common horizon, "
            "the shorter budget in seconds):",
            "",
            "| level | method | reached | units | vs DanceGRPO: compute | seconds | TreeGRPO vs it: compute | seconds |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for level, t in lt.items():
            for m, row in t["methods"].items():
                vs_dance = t["speedups"].get(f"{m} vs dancegrpo")
                tree_vs = t["speedups"].get(f"treegrpo vs {m}")

                def cell(s: dict[str, Any] | None, axis: str) -> str:
                    if s is None or s[axis] is None:
                        return "—"
                    mark = " (Holm)" if axis == "compute" and s["compute"].get("holm") else ""
                    return _x(s[axis]) + mark

                lines.append(
                    f"| {level} | {m} | {sum(row['reached'])}/{len(row['reached'])} | {_k(row['mean_units']['mean'])} | "
                    f"{cell(vs_dance, 'compute')} | {cell(vs_dance, 'seconds')} | {cell(tree_vs, 'compute')} | "
                    f"{cell(tree_vs, 'seconds')} |"
                )
    return lines
