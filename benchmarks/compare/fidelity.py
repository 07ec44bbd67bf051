"""Both papers' methods as their official code runs them (docs/benchmarks.md, "The fidelity
screen"): the screen's arms against today's presets, the official presets against DanceGRPO and
their base, and the papers' claims read off ``results.json``, each reproduced, contradicted or not
resolved."""

from __future__ import annotations

import math
import statistics
from typing import Any

from . import stats
from .methods import ARMS, RunSpec
from .plan import COLLAPSE_DROP, SCREEN_RATES_ADDED, SCREEN_SEEDS, curve, screen_rates
from .runs import Run, RunCache

BASE_OF = {**ARMS, "branchgrpo_official": "branchgrpo", "treegrpo_official": "treegrpo"}
"""The preset each screen arm and official preset is compared with."""
QUANTITIES = ("final", "peak", "drop", "units_to_target")


def run_quantities(run: Run, budget: float, target: float) -> dict[str, float]:
    """A run's final reward, its best evaluation, its fall from there to the end, and its compute
    to ``target`` (censored at the budget)."""
    c = curve(run)
    final, peak = stats.at(c, budget), max(y for _, y in c)
    return {
        "final": final,
        "peak": peak,
        "drop": peak - final,
        "units_to_target": stats.to_target(c, target, budget)[0],
    }


def _direction(diffs: list[float]) -> str:
    """The screen's rule: an arm moves a quantity only where every seed moves it the same way."""
    if diffs and all(d > 0 for d in diffs):
        return "up"
    if diffs and all(d < 0 for d in diffs):
        return "down"
    return "mixed"


def _compare(pairs: list[tuple[dict[str, float], dict[str, float]]]) -> dict[str, Any]:
    """Per quantity: the arm's and the base's means, the paired differences, their direction and (two
    pairs or more) their Student-t interval."""
    out: dict[str, Any] = {"n": len(pairs)}
    for q in QUANTITIES:
        diffs = [a[q] - b[q] for a, b in pairs]
        row: dict[str, Any] = {
            "arm_per_seed": [a[q] for a, _ in pairs],
            "arm": statistics.fmean(a[q] for a, _ in pairs),
            "base": statistics.fmean(b[q] for _, b in pairs),
            "diffs": diffs,
            "direction": _direction(diffs),
        }
        if len(pairs) >= 2 and len({round(d, 12) for d in diffs}) > 1:
            row["t"] = stats.paired_t([a[q] for a, _ in pairs], [b[q] for _, b in pairs])
            row["resolved"] = row["t"]["lo"] > 0 or row["t"]["hi"] < 0
        out[q] = row
    return out


def screen(cache: RunCache, budget: float, target: float, rates: dict[str, float | None]) -> dict[str, Any]:
    """Every screen arm against its base preset at the same rate and seed (per rate, and pooled over
    rates), and the learning-rate departure: today's BranchGRPO at DanceGRPO's chosen rate against
    its own chosen rate. ``rates``: the chosen rates of ``branchgrpo`` and ``dancegrpo``."""
    arms: dict[str, Any] = {}

    def load(method: str, lr: float, seed: int) -> dict[str, float] | None:
        run = cache.load(RunSpec(method, lr, seed))
        return None if run is None else run_quantities(run, budget, target)

    for arm, arm_rates in screen_rates().items():
        per_rate, pooled = {}, []
        for lr in arm_rates:
            pairs = [(load(arm, lr, s), load(BASE_OF[arm], lr, s)) for s in SCREEN_SEEDS]
            done = [(a, b) for a, b in pairs if a is not None and b is not None]
            if done:
                per_rate[f"{lr:g}"] = _compare(done)
                pooled += done
        arms[arm] = {"base": BASE_OF[arm], "rates": per_rate, "pooled": _compare(pooled) if pooled else None}
    tuned, dance = rates.get("branchgrpo"), rates.get("dancegrpo")
    if tuned is not None and dance is not None:
        pairs = [(load("branchgrpo", dance, s), load("branchgrpo", tuned, s)) for s in SCREEN_SEEDS]
        done = [(a, b) for a, b in pairs if a is not None and b is not None]
        arms["learning_rate"] = {
            "base": "branchgrpo",
            "rates": {f"{dance:g} vs {tuned:g}": _compare(done)} if done else {},
            "pooled": _compare(done) if done else None,
        }
    return {"seeds": list(SCREEN_SEEDS), "target": target, "arms": arms}


def paired_quantities(
    cache: RunCache, rates: dict[str, float], seeds: list[int], budget: float, target: float
) -> dict[str, Any]:
    """The screen's quantities (final, peak, drop, compute to ``target``) of the first of ``rates``'
    two methods minus the second's, over ``seeds``: the official presets' reported seeds against their
    base and DanceGRPO, each method at its chosen rate."""
    (a, lr_a), (b, lr_b) = rates.items()
    pairs = []
    for s in seeds:
        ra, rb = cache.load(RunSpec(a, lr_a, s)), cache.load(RunSpec(b, lr_b, s))
        if ra is None or rb is None:
            raise ValueError(f"paired_quantities: no run of {a if ra is None else b} on seed {s}")
        pairs.append((run_quantities(ra, budget, target), run_quantities(rb, budget, target)))
    return _compare(pairs)


def difference(report: dict[str, Any], a: str, b: str) -> dict[str, Any] | None:
    """``a`` minus ``b`` in final reward from the report's pairs (either order) or official pairs."""
    found = {**report["pairs"], **report.get("official_pairs", {})}
    if f"{a} - {b}" in found:
        return found[f"{a} - {b}"]["final"]
    if f"{b} - {a}" in found:
        d = found[f"{b} - {a}"]["final"]
        return {**d, "mean": -d["mean"], "lo": -d["hi"], "hi": -d["lo"]}
    return None


def gap(report: dict[str, Any]) -> str | None:
    """Which ingredient, if any, closes BranchGRPO's gap to DanceGRPO (docs/benchmarks.md, the rules
    fixed before the runs): the official settings together by the 10-seed paired differences, each
    one alone by the screen (ends at or above DanceGRPO's sweep plateau on both seeds at one rate;
    steady at an added rate where both seeds end within ``COLLAPSE_DROP`` of their peak). None until
    ``branchgrpo_official`` has paired seeds with DanceGRPO and today's preset."""
    op = report.get("official_pairs", {})
    vs_dance, vs_today = op.get("branchgrpo_official - dancegrpo"), op.get("branchgrpo_official - branchgrpo")
    today = difference(report, "branchgrpo", "dancegrpo")
    if vs_dance is None or vs_today is None or today is None:
        return None
    d, t = vs_dance["final"], vs_today["final"]
    if d["lo"] > 0:
        reading = "together they reverse the gap"
    elif d["hi"] >= 0:
        reading = "together they close the gap (not separated from DanceGRPO)"
    elif t["lo"] > 0:
        reading = "together they narrow the gap without closing it"
    else:
        reading = "together they do not close it"
    n, planned = len(vs_dance["seeds"]), len(report["protocol"]["reported_seeds"])
    interim = (
        f"Interim ({n} of {planned} reported seeds; read nothing into it until all have run): " if n < planned else ""
    )
    text = (
        f"{interim}BranchGRPO's gap to DanceGRPO: today's `branchgrpo` ends {_ci(today)} against DanceGRPO; "
        f"all the official code's settings together (`branchgrpo_official`, at "
        f"{report['methods']['branchgrpo_official']['lr']:g}, its sweep's rate) end {_ci(d)} against DanceGRPO "
        f"({'resolved' if d['resolved'] else 'not resolved'}) and {_ci(t)} against today's preset "
        f"({'resolved' if t['resolved'] else 'not resolved'}), over {n} paired seeds: {reading}."
    )
    sc = report.get("screen")
    if not sc:
        return text
    branch = {arm: a for arm, a in sc["arms"].items() if a["base"] == "branchgrpo"}
    # each arm and rate screened on every seed, by how far its lowest final lies from the target
    margins = {
        (arm, rate): min(row["final"]["arm_per_seed"]) - sc["target"]
        for arm, a in branch.items()
        for rate, row in a["rates"].items()
        if len(row["final"]["arm_per_seed"]) == len(sc["seeds"])
    }
    closing = [f"`{arm}` at {rate}" for (arm, rate), m in margins.items() if m >= 0]
    text += (
        f" In the screen ({len(sc['seeds'])} seeds per rate), "
        + (" and ".join(closing) if closing else "no setting, alone or together,")
        + f" ends at or above DanceGRPO's sweep plateau ({sc['target']:.4f}) on every seed at one rate"
    )
    if margins and not closing:
        (arm, rate), m = max(margins.items(), key=lambda kv: kv[1])
        finals = branch[arm]["rates"][rate]["final"]["arm_per_seed"]
        text += f" (the nearest: `{arm}` at {rate}, {', '.join(f'{v:.4f}' for v in finals)}; its lowest {m:+.4f})"
    text += "."
    for rate in sorted({f"{lr:g}" for rates in SCREEN_RATES_ADDED.values() for lr in rates}):
        drops = {arm: a["rates"][rate]["drop"] for arm, a in branch.items() if rate in a["rates"]}
        if not drops:
            continue
        base = next(iter(drops.values()))
        base_drops = [v - dv for v, dv in zip(base["arm_per_seed"], base["diffs"])]
        steady = [arm for arm, row in drops.items() if all(v <= COLLAPSE_DROP for v in row["arm_per_seed"])]
        text += (
            f" At {rate}, steady on every seed (the final within {COLLAPSE_DROP} of the peak): "
            + (", ".join(f"`{arm}` (drops {shown(drops[arm]['arm_per_seed'])})" for arm in steady) or "no arm")
            + f"; today's preset drops {shown(base_drops)}."
        )
    return text


def shown(values: list[float]) -> str:
    """Per-seed values, three decimals."""
    return ", ".join(f"{v:.3f}" for v in values)


def claims(report: dict[str, Any], seed: int = 0) -> list[dict[str, Any]]:
    """The papers' claims as this comparison measures them, on the compute and the seconds axis;
    each "reproduced" where the interval lies on the claimed side of no effect, "contradicted" where
    it lies on the other, else "not resolved" (the paper's own number is quoted beside). ``seed``:
    the bootstrap's, as for the report's other intervals."""
    out = []
    methods = report["methods"]

    def verdict(lo: float | None, hi: float | None, none: float) -> str:
        # no interval (one seed, or a target some seed never reached): nothing is resolved
        if lo is None or hi is None:
            return "not resolved"
        return "reproduced" if lo > none else "contradicted" if hi < none else "not resolved"

    def speedup_rows(method: str, claim: str, paper: str) -> None:
        mine = methods.get(method, {}).get("compute_to_target", {}).get("dancegrpo", {})
        t = mine.get("speedup")
        if t is None:
            return
        rate = (report.get("seconds") or {}).get("seconds_per_unit", {})
        out.append(
            {
                "kind": "speedup",
                "claim": claim,
                "paper": paper,
                "method": method,
                "axis": "compute",
                "ours": t,
                "verdict": verdict(t["lo"], t["hi"], 1.0),
            }
        )
        if rate.get("dancegrpo") and rate.get(method):
            base = methods["dancegrpo"]["compute_to_target"]["dancegrpo"]["units"]
            n = min(len(base), len(mine["units"]))
            sec = stats.seconds_ratio(
                base[:n], rate["dancegrpo"], mine["units"][:n], rate[method], report["protocol"]["budget"], seed=seed
            )
            # 0 / 0 (both at the target from the start) is undefined: no value, as JSON would hold it
            sec = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in sec.items()}
            out.append(
                {
                    "kind": "speedup",
                    "claim": claim,
                    "paper": paper,
                    "method": method,
                    "axis": "seconds",
                    "ours": sec,
                    "verdict": verdict(sec["lo"], sec["hi"], 1.0),
                }
            )

    def reward_rows(method: str, claim: str, paper: str) -> None:
        f = difference(report, method, "dancegrpo")
        if f is None:
            return
        out.append(
            {
                "kind": "reward",
                "claim": claim,
                "paper": paper,
                "method": method,
                "axis": "compute",
                "ours": f,
                "verdict": verdict(f["lo"], f["hi"], 0.0),
            }
        )
        per_seed = (report.get("seconds") or {}).get("per_seed", {})
        if method in per_seed and "dancegrpo" in per_seed:
            mine, dance = per_seed[method], per_seed["dancegrpo"]
            seeds = [s for s in mine if s in dance]
            if len(seeds) >= 2:
                sec = stats.paired_difference([mine[s] for s in seeds], [dance[s] for s in seeds])
                out.append(
                    {
                        "kind": "reward",
                        "claim": claim,
                        "paper": paper,
                        "method": method,
                        "axis": "seconds",
                        "ours": sec,
                        "verdict": verdict(sec["lo"], sec["hi"], 0.0),
                    }
                )

    def iteration_rows(method: str, claim: str, paper: str) -> None:
        timing = report.get("timing") or {}
        t = timing.get("methods", {})
        if method not in t or "dancegrpo" not in t:
            return
        # DanceGRPO's seconds per iteration over the method's, the rounds paired (they ran side by side)
        rounds = {m: t[m].get("rounds_seconds_per_iteration") for m in (method, "dancegrpo")}
        if rounds[method] and rounds["dancegrpo"] and len(rounds[method]) >= 2:
            ratios = [b / a for a, b in zip(rounds[method], rounds["dancegrpo"])]
            ci = stats.paired_t(ratios, [0.0] * len(ratios))
        else:
            ratio = t["dancegrpo"]["seconds_per_iteration"] / t[method]["seconds_per_iteration"]
            ci = {"mean": ratio, "lo": None, "hi": None, "n": 1}
        lo, hi = (ci["lo"], ci["hi"]) if ci["lo"] is not None else (ci["mean"], ci["mean"])
        row = {"kind": "iteration", "claim": claim, "paper": paper, "method": method, "axis": "seconds per iteration"}
        out.append({**row, "ours": ci, "verdict": verdict(lo, hi, 1.0) if ci["n"] > 1 else "one measurement"})

    for m in ("treegrpo", "treegrpo_official"):
        speedup_rows(m, "TreeGRPO trains faster than DanceGRPO", "2.4x (iteration time, SD3.5-M)")
    for m in ("branchgrpo", "branchgrpo_official"):
        reward_rows(m, "BranchGRPO ends above DanceGRPO", "+16% (FLUX, HPS-based)")
    for m in ("branchgrpo", "branchgrpo_pruned"):
        iteration_rows(m, "BranchGRPO takes less time per iteration than DanceGRPO", "2.2x (55% less; pruned, FLUX)")
    speedup_rows("branchgrpo_mix", "BranchGRPO-Mix trains faster than DanceGRPO", "4.7x (iteration time, FLUX)")
    iteration_rows("branchgrpo_mix", "BranchGRPO-Mix trains faster than DanceGRPO", "4.7x (iteration time, FLUX)")
    return out


def _ci(d: dict[str, Any], digits: int = 3, sign: str = "+") -> str:
    return f"{d['mean']:{sign}.{digits}f} [{d['lo']:{sign}.{digits}f}, {d['hi']:{sign}.{digits}f}]"


def _cell(row: dict[str, Any], scale: float = 1.0, digits: int = 3) -> str:
    """The arm's mean minus the base's, each seed's difference and its direction."""
    diffs = ", ".join(f"{d * scale:+.{digits}f}" for d in row["diffs"])
    return f"{(row['arm'] - row['base']) * scale:+.{digits}f} ({diffs}; {row['direction']})"


def _t_cell(row: dict[str, Any], quantity: str) -> str:
    """A paired t interval (compute in thousands of units) and whether it excludes 0; "—" without one."""
    if "t" not in row:
        return "—"
    scale, digits = (1e-3, 1) if quantity == "units_to_target" else (1.0, 3)
    t = {k: row["t"][k] * scale for k in ("mean", "lo", "hi")}
    return f"{_ci(t, digits)} ({'resolved' if row['resolved'] else 'not resolved'})"


def _interval(o: dict[str, Any], fmt: str, unit: str = "") -> str:
    """``mean [lo, hi]``; "n/a" for a missing mean and no brackets for a missing interval."""
    if o.get("mean") is None:
        return "n/a"
    text = f"{o['mean']:{fmt}}{unit}"
    if o.get("lo") is None or o.get("hi") is None:
        return text
    return f"{text} [{o['lo']:{fmt}}{unit}, {o['hi']:{fmt}}{unit}]"


def _censored(speedup: dict[str, Any]) -> str:
    """How many paired seeds never reached the target (on the seconds axis: by the common horizon),
    where any did: what says which way, if any, the restricted ratio bounds the speed-up."""
    c, n = speedup.get("censored"), speedup.get("n")
    if not c or not (c["method"] or c["baseline"]):
        return ""
    return f" (never reached: {c['method']} of {n} of its seeds, {c['baseline']} of DanceGRPO's)"


def tables(report: dict[str, Any]) -> list[str]:
    """The fidelity and claims tables (Markdown lines), from ``results.json``."""
    lines: list[str] = []
    sc = report.get("screen")
    if sc and any(a["rates"] for a in sc["arms"].values()):
        lines += [
            "",
            f"Fidelity screen: each official setting against today's preset at the same rate and seed (seeds "
            f"{', '.join(map(str, sc['seeds']))}, 750k); the arm minus its base, each seed's difference and "
            "whether every seed moves the same way; the pooled row: all rates' pairs, paired t 95% CI "
            f"(not resolved where it covers 0). Compute to DanceGRPO's target ({sc['target']:.3f}) in thousands "
            "of units, censored at the budget.",
            "",
            "| arm | rate | final | peak | drop after the peak | compute to target (k) |",
            "|---|---|---|---|---|---|",
        ]
        for arm, a in sc["arms"].items():
            for rate, row in a["rates"].items():
                cells = [
                    _cell(row[q], 1e-3 if q == "units_to_target" else 1.0, 1 if q == "units_to_target" else 3)
                    for q in QUANTITIES
                ]
                lines.append(f"| {arm} | {rate} | " + " | ".join(cells) + " |")
            pooled = a["pooled"]
            if pooled and pooled["n"] > 2:
                cells = [_t_cell(pooled[q], q) for q in QUANTITIES]
                lines.append(f"| {arm} | pooled ({pooled['n']} pairs) | " + " | ".join(cells) + " |")
    op = report.get("official_pairs")
    if op:
        lines += [
            "",
            "The official presets at their chosen rates against their base preset and DanceGRPO, paired by "
            "reported seed: the final reward with the 95% bootstrap interval of every paired final in this "
            "report; the peak, the drop after it and the compute to DanceGRPO's target (thousands of units, "
            "censored at the budget) with the paired t 95% interval of the screen's pooled rows.",
            "",
            "| official preset minus | seeds | final reward | peak | drop after the peak | compute to target (k) |",
            "|---|---|---|---|---|---|",
        ]
        for key, d in op.items():
            final = f"{_ci(d['final'], 4)} ({'resolved' if d['final']['resolved'] else 'not resolved'})"
            rest = [_t_cell(d["quantities"][q], q) if "quantities" in d else "—" for q in QUANTITIES[1:]]
            lines.append(f"| {key} | {len(d['seeds'])} | {final} | " + " | ".join(rest) + " |")
        said = gap(report)
        if said:
            lines += ["", said]
    cl = report.get("claims")
    if cl:
        lines += [
            "",
            "The papers' claims on this world (reproduced / contradicted where the 95% interval lies on one side "
            "of no effect; a seed that never reaches a speed-up's target counts at the budget, in seconds at the "
            "pair's common horizon):",
            "",
            "| claim | paper | method | axis | ours | verdict |",
            "|---|---|---|---|---|---|",
        ]
        for c in cl:
            o = c["ours"]
            if c["kind"] == "speedup":
                ours = f"{_interval(o, '.2f', 'x')} speed-up to DanceGRPO's target" + _censored(o)
            elif c["kind"] == "reward":
                ours = f"{_interval(o, '+.3f')} final reward" + (" at equal seconds" if c["axis"] == "seconds" else "")
            else:
                shown = "" if o["lo"] is None else f" [{o['lo']:.2f}x, {o['hi']:.2f}x] over {o['n']} rounds"
                ours = f"{o['mean']:.2f}x{shown} less time per iteration ({100 * (1 - 1 / o['mean']):.0f}% less)"
            lines.append(f"| {c['claim']} | {c['paper']} | {c['method']} | {c['axis']} | {ours} | {c['verdict']} |")
    return lines
