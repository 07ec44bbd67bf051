"""From the cached runs to ``results.json``, the plots and the Markdown tables (``report.md``), every
number computed here from the runs and every table formatted from the JSON.

Statistics over the reported seeds (:mod:`.stats`, 95% percentile bootstrap, 10 000 resamples,
fixed seeds): per method the held-out reward at each compute level of :func:`levels` (the last is
the budget: ``final``), the area under the reward-vs-compute curve (the mean reward over the
budget), compute to each target (censored at the budget) and its speed-up against the target's
baseline; per pair of headline methods the paired differences of ``final`` and of the area, with
"not resolved" where the interval covers 0.
"""

from __future__ import annotations

import itertools
import math
import platform
import statistics
from pathlib import Path
from typing import Any

import torch

from . import fidelity, plan, settle, stats
from .methods import HEADLINE, VARIANT_OF, RunSpec, description
from .plan import CEILING, Design, curve, sweeps_of, targets
from .runs import Run, RunCache


def levels(budget: float) -> list[float]:
    """The compute levels of the tables: a quarter, half, three quarters and all of the budget."""
    return [budget * f for f in (0.25, 0.5, 0.75, 1.0)]


def environment() -> dict[str, Any]:
    cpu = "unknown"
    info = Path("/proc/cpuinfo")
    if info.is_file():
        cpu = next(
            (line.split(":", 1)[1].strip() for line in info.read_text().splitlines() if line.startswith("model name")),
            cpu,
        )
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def mean_curve(curves: list[list[tuple[float, float]]], xs: list[float]) -> list[float]:
    return [statistics.fmean(stats.at(c, x) for c in curves) for x in xs]


def flattening(runs: list[Run], budget: float, evaluations: int) -> dict[str, Any]:
    """Evidence that the curve has flattened: the seed-mean reward at the last three evaluation
    points of the budget, and the evaluation noise of that mean (the root-mean-square of the runs'
    own evaluation standard errors, over the square root of the number of seeds). Flat: every one
    of the three lies within two noise units of their mean."""
    xs = [budget * (i + 1) / evaluations for i in range(evaluations)]
    ys = mean_curve([curve(r) for r in runs], xs)
    last = ys[-3:]
    ses = [p["reward_se"] for r in runs for p in r.curve]
    noise = math.sqrt(statistics.fmean(se * se for se in ses)) / math.sqrt(len(runs))
    centre = statistics.fmean(last)
    return {
        "units": xs[-3:],
        "mean_reward": last,
        "evaluation_noise": noise,
        "flat": all(abs(y - centre) <= 2 * noise for y in last),
    }


def per_iteration(runs: list[Run]) -> dict[str, float]:
    its = [i for r in runs for i in r.iterations]
    keys = ("sampling", "trained", "reference", "reward_images", "units")
    return {k: statistics.fmean(i[k] for i in its) for k in keys}


def method_summary(
    name: str, lr: float, seeds: list[int], runs: list[Run], design: Design, goals: dict[str, Any] | None, seed: int
) -> dict[str, Any]:
    budget = design.protocol.budget
    curves = [curve(r) for r in runs]
    out: dict[str, Any] = {
        "lr": lr,
        "description": description(name),
        "seeds": seeds,
        "n": len(runs),
        "per_iteration": per_iteration(runs),
        "iterations": [len(r.iterations) for r in runs],
        "start": statistics.fmean(c[0][1] for c in curves),
        "final": stats.bootstrap([stats.at(c, budget) for c in curves], seed=seed),
        "at_units": {f"{x:.0f}": stats.bootstrap([stats.at(c, x) for c in curves], seed=seed) for x in levels(budget)},
        "auc": stats.bootstrap([stats.area(c, budget) for c in curves], seed=seed),
        "last_three": stats.bootstrap([stats.plateau(c) for c in curves], seed=seed),
        "plateau": stats.plateau_test(curves, budget, design.protocol.evaluations, seed=seed),
        # a run that peaks and then collapses ends lower than it was: the final reward alone hides
        # it, so each seed's best held-out evaluation and its fall from there to the end are reported
        "peak": stats.bootstrap([max(y for _, y in c) for c in curves], seed=seed),
        "drop": stats.bootstrap([max(y for _, y in c) - stats.at(c, budget) for c in curves], seed=seed),
        "curves": [r.curve for r in runs],
    }
    if goals is not None:
        out["compute_to_target"] = {}
        for key in ("best_flat", "dancegrpo"):
            reached = [stats.to_target(c, goals[key]["reward"], budget) for c in curves]
            out["compute_to_target"][key] = {
                "target": goals[key]["reward"],
                "units": [u for u, _ in reached],
                "reached": [bool(ok) for _, ok in reached],
                "mean": stats.bootstrap([u for u, _ in reached], seed=seed),
            }
    return out


def speedups(methods: dict[str, Any], goals: dict[str, Any], seed: int) -> None:
    """Each method's speed-up to each target: the target baseline's mean compute to it over the
    method's, paired by seed, censored seeds at the budget."""
    for key in ("best_flat", "dancegrpo"):
        base = methods[goals[key]["method"]]["compute_to_target"][key]
        for m in methods.values():
            mine = m["compute_to_target"][key]
            n = min(len(base["units"]), len(mine["units"]))
            mine["speedup"] = stats.ratio_of_means(base["units"][:n], mine["units"][:n], seed=seed)
            mine["speedup"]["baseline"] = goals[key]["method"]
            # how many of the paired seeds never reached it: what the restricted ratio bounds
            mine["speedup"]["censored"] = {
                "method": n - sum(mine["reached"][:n]),
                "baseline": n - sum(base["reached"][:n]),
            }


def pairs(methods: dict[str, Any], names: tuple[str, ...], seed: int) -> dict[str, Any]:
    """Paired differences (first minus second) of the final reward and the area, seed by seed."""
    out = {}
    for a, b in itertools.combinations(names, 2):
        ma, mb = methods[a], methods[b]
        common = [s for s in ma["seeds"] if s in mb["seeds"]]
        if len(common) < 2:  # while runs are under way: a pair needs two shared seeds for an interval
            continue
        # called in this iteration only, so the late binding of `common` is what is meant
        pick = lambda m, key: [m[key + "_per_seed"][m["seeds"].index(s)] for s in common]  # noqa: E731, B023
        out[f"{a} - {b}"] = {
            "seeds": common,
            "final": stats.paired_difference(pick(ma, "final"), pick(mb, "final"), seed=seed),
            "final_t": stats.paired_t(pick(ma, "final"), pick(mb, "final")),
            "auc": stats.paired_difference(pick(ma, "auc"), pick(mb, "auc"), seed=seed),
        }
    return out


def ceiling_runs(folder: Path, chosen: dict[str, float | None], seed: int = 0) -> dict[str, Any]:
    """The longer design's summaries (``plan.CEILING``, its runs in ``folder``) of each method it
    holds at least two seeds of, at the rate this comparison chose: what :func:`settle.ceiling`
    reads for a method still rising at this budget."""
    cache = RunCache(folder, CEILING.protocol)
    out = {}
    for method, lr in chosen.items():
        if lr is None:
            continue
        done = [(s, r) for s in CEILING.report_seeds if (r := cache.load(RunSpec(method, lr, s))) is not None]
        if len(done) >= 2:
            curves = [curve(r) for _, r in done]
            budget = CEILING.protocol.budget
            out[method] = {
                "n": len(done),
                "planned": len(CEILING.report_seeds),
                "seeds": [s for s, _ in done],
                "final": stats.bootstrap([stats.at(c, budget) for c in curves], seed=seed),
                "last_three": stats.bootstrap([stats.plateau(c) for c in curves], seed=seed),
                "plateau": stats.plateau_test(curves, budget, CEILING.protocol.evaluations, seed=seed),
            }
    return out


def summarise(
    cache: RunCache,
    design: Design,
    timing: dict[str, Any] | None = None,
    seed: int = 0,
    longer: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``results.json``'s content from the cached runs of ``design`` (``longer``: the summaries of
    :func:`ceiling_runs`, for the ceilings of methods still rising at this budget)."""
    sweeps = sweeps_of(cache, design)
    goals = targets(sweeps, design.headline)
    budget = design.protocol.budget
    methods: dict[str, Any] = {}
    missing: list[str] = []
    extension = plan.extended(cache, design, sweeps)
    wanted = [(m, sweeps[m].chosen, plan.seeds_of(m, design, extension)) for m in design.swept]
    wanted += [(v, sweeps[VARIANT_OF[v]].chosen, design.variant_seeds) for v in design.variants]
    for name, lr, seeds in wanted:
        if lr is None:
            missing.append(f"{name}: its sweep is not complete")
            continue
        found = [(s, cache.load(RunSpec(name, lr, s))) for s in seeds]
        done = [(s, r) for s, r in found if r is not None]
        if len(done) < len(seeds):
            missing.append(f"{name}: {len(seeds) - len(done)} of {len(seeds)} seeds not run")
        if len(done) < 2:
            continue
        summary = method_summary(name, lr, [s for s, _ in done], [r for _, r in done], design, goals, seed)
        summary["final_per_seed"] = [stats.at(curve(r), budget) for _, r in done]
        summary["auc_per_seed"] = [stats.area(curve(r), budget) for _, r in done]
        methods[name] = summary
    # complete: every headline method has all its reported seeds (variants may be listed as not run)
    complete = goals is not None and all(
        m in methods and methods[m]["n"] == len(plan.seeds_of(m, design, extension)) for m in design.headline
    )
    if goals is not None and all(goals[k]["method"] in methods for k in ("best_flat", "dancegrpo")):
        speedups(methods, goals, seed)
    headline = [m for m in design.headline if m in methods]
    report: dict[str, Any] = {
        "protocol": {
            "budget_axis": "compute",
            "budget": budget,
            "cost_model": "units = sampling forwards + 3 x trained forwards (with backward) + 1 x reference "
            "forwards + 0 x scored images (lit_treegrpo.core.compute.ComputeCost defaults)",
            "evaluations": design.protocol.evaluations,
            "evaluation": {
                "prompts": 36,
                "seeds_per_prompt": design.protocol.eval_seeds,
                "same_noises_for_every_method": True,
            },
            "batch_size": design.protocol.batch_size,
            "sweep_seeds": list(design.sweep_seeds),
            "reported_seeds": list(design.report_seeds),
            "extension_seeds": {m: list(seeds) for m, seeds in extension.items()},
            "variant_seeds": list(design.variant_seeds),
            "selection_rule": "the rate with the highest mean minus one sd, over the sweep seeds, of each run's "
            "plateau (mean of its last three evaluations); a best rate at a grid edge moves the "
            "grid one step (x3) that way",
            "confidence_intervals": f"95% percentile bootstrap over seeds, {stats.RESAMPLES} resamples, seed {seed}; "
            "pairs resampled by seed index",
            "targets": goals,
            "levels": levels(budget),
        },
        "environment": environment(),
        "complete": complete,
        "missing": missing,
        "sweep": {m: s.as_dict() for m, s in sweeps.items()},
        "methods": methods,
        "pairs": pairs(methods, tuple(headline), seed),
        # each variant against its own headline method, over the seeds the variant ran (its seeds are
        # reported seeds too, so the pair shares prompt order and root noise like the headline pairs)
        "variant_pairs": {
            key: diff
            for v in design.variants
            if v in methods and VARIANT_OF[v] in methods
            for key, diff in pairs(methods, (v, VARIANT_OF[v]), seed).items()
        },
        "timing": timing,
    }
    # the verdict (docs/benchmarks.md, "Settling the verdict"): ceilings (of the official presets too,
    # whose still-rising runs the ceiling plan extends like the others'), seconds, fixed levels, Holm
    swept = [m for m in design.swept if m in methods]
    for name in swept:
        methods[name]["ceiling"] = settle.ceiling(methods[name], (longer or {}).get(name))
    report["seconds"] = settle.seconds_axis(
        methods, [m for m in methods if timing and m in timing["methods"]], timing, seed
    )
    report["level_targets"] = settle.level_targets(methods, swept, timing, budget, seed)
    report["multiplicity"] = settle.holm_families(report)
    settling = next((m for m in extension if m != "mixgrpo"), "treegrpo")  # the TreeGRPO extended against MixGRPO
    report["curve_pair"] = settle.curve_pair(methods, settling, "mixgrpo", budget, design.protocol.evaluations, seed)
    # both papers' methods as their official code runs them: the screen, the official presets, the claims
    report["official_pairs"] = {
        key: diff
        for m in design.official
        if m in methods
        for other in (fidelity.BASE_OF[m], "dancegrpo")
        if other in methods
        for key, diff in pairs(methods, (m, other), seed).items()
    }
    if goals is not None:
        # the rest of the screen's reading for each official pair: peak, drop and compute to DanceGRPO's target
        for key, diff in report["official_pairs"].items():
            rates = {m: methods[m]["lr"] for m in key.split(" - ")}
            diff["quantities"] = fidelity.paired_quantities(
                cache, rates, diff["seeds"], budget, goals["dancegrpo"]["reward"]
            )
        chosen = {m: sweeps[m].chosen for m in ("branchgrpo", "dancegrpo") if m in sweeps}
        report["screen"] = fidelity.screen(cache, budget, goals["dancegrpo"]["reward"], chosen)
    report["claims"] = fidelity.claims(report, seed)
    if headline:
        best = max(headline, key=lambda m: methods[m]["final"]["mean"])
        runs = [cache.load(RunSpec(best, methods[best]["lr"], s)) for s in methods[best]["seeds"]]
        report["flattening"] = {
            "method": best,
            **flattening([r for r in runs if r], budget, design.protocol.evaluations),
        }
    report["headline"] = headline_sentence(report)
    return report


def verdict(diff: dict[str, Any]) -> str:
    return "resolved" if diff["resolved"] else "not resolved"


def headline_sentence(report: dict[str, Any]) -> str:
    """The README's one sentence: TreeGRPO against every other headline method at the budget."""
    pairs_ = report["pairs"]
    parts, counts, notes = [], [], []
    for key, diff in pairs_.items():
        a, b = key.split(" - ")
        if "treegrpo" not in (a, b):
            continue
        other, sign = (b, 1) if a == "treegrpo" else (a, -1)
        d = diff["final"]
        lo, hi = sorted((sign * d["lo"], sign * d["hi"]))
        counts.append(len(diff["seeds"]))
        method = report["methods"].get(other, {})
        rising = method.get("plateau", {}).get("verdict") == "still rising"
        ceiling = settle.finished_ceiling(method.get("ceiling"))  # a longer run's ceiling, once complete
        note = f"; {other} still rising" + (f", {ceiling}" if ceiling else "") if rising else ""
        parts.append(f"{other} {sign * d['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}] ({verdict(d)}")
        notes.append(note)
    # while runs are under way the pairs may hold different numbers of seeds: each then says its own
    # (before the note, whose ceiling has seeds of its own)
    each = len(set(counts)) > 1
    parts = [f"{p}{f', {c} seeds' if each else ''}{n})" for p, c, n in zip(parts, counts, notes)]
    if not parts:
        return (
            "No result yet: the method comparison is under way and no two reported seeds have been trained "
            "by both TreeGRPO and another headline method, so it ranks no method (its report shows the "
            "learning-rate sweep so far)."
        )
    n = min(report["methods"]["treegrpo"]["n"], *(report["methods"][p.split()[0]]["n"] for p in parts))
    over = f"{n}" if len(set(counts)) <= 1 else f"{min(counts)} to {max(counts)}"
    interim = ""
    if not report["complete"] and n < len(report["protocol"]["reported_seeds"]):
        interim = (
            f"Interim, the comparison is under way ({n} of {len(report['protocol']['reported_seeds'])} paired "
            "seeds trained; read nothing into it until it completes): "
        )
    elif not report["complete"]:  # every reported seed is in: what is left extends a pair
        interim = f"Interim while more seeds run ({extension_runs(report)}): "
    return (
        interim
        + (
            f"On the Shapes world at {report['protocol']['budget']:,.0f} compute units, TreeGRPO's final held-out "
            f"reward minus each method's, mean [95% CI] over {over} paired seeds: " + "; ".join(parts) + "."
        )
        + papers_sentence(report.get("claims") or [])
    )


def extension_runs(report: dict[str, Any]) -> str:
    """What a report with every reported seed still lacks of its headline methods (the runs that
    extend a pair to more seeds), and that the pairs with those methods hold the seeds so far."""
    headline = {m for key in report["pairs"] for m in key.split(" - ")}
    pending = [line for line in report["missing"] if line.split(":")[0] in headline]
    return f"{'; '.join(pending)}; the pairs with {'it' if len(pending) == 1 else 'them'} hold the seeds so far"


def papers_sentence(claims: list[dict[str, Any]]) -> str:
    """The papers' headline claims in one sentence (TreeGRPO's speed-up, BranchGRPO's reward), each
    verdict with its compute and seconds numbers; empty before the claims table exists."""
    parts = []
    for kind, method, what in (("speedup", "treegrpo", "TreeGRPO faster than DanceGRPO"),
                               ("reward", "branchgrpo", "BranchGRPO above DanceGRPO"),
                               ("reward", "branchgrpo_official", "BranchGRPO as its code runs it above DanceGRPO")):  # fmt: skip
        rows = {c["axis"]: c for c in claims if c["kind"] == kind and c["method"] == method}
        if "compute" not in rows:
            continue
        shown = []
        for axis, row in rows.items():
            mean = row["ours"].get("mean")
            if mean is None:  # no seed reached the target: nothing to quote
                shown.append(f"n/a in {axis}")
            else:
                shown.append(f"{mean:.2f}x in {axis}" if kind == "speedup" else f"{mean:+.3f} at equal {axis}")
        verdicts = {row["verdict"] for row in rows.values()}
        said = verdicts.pop() if len(verdicts) == 1 else " / ".join(rows[a]["verdict"] for a in rows)
        parts.append(f"{what}: {said} ({', '.join(shown)})")
    return " The papers' claims here: " + "; ".join(parts) + "." if parts else ""


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------


def ci(stat: dict[str, Any], digits: int = 3) -> str:
    return f"{stat['mean']:.{digits}f} [{stat['lo']:.{digits}f}, {stat['hi']:.{digits}f}]"


def times(x: float | None) -> str:
    """A speed-up; None is what JSON keeps of a non-finite ratio (a target reached at 0 units)."""
    return "—" if x is None or not math.isfinite(x) else f"{x:.2f}x"


def units_k(x: float) -> str:
    return f"{x / 1000:.1f}k"


def timing_table(t: dict[str, Any]) -> list[str]:
    """The timing's table (Markdown lines), with whether other work shared the cores when it ran."""
    load = t.get("load_average")
    if load is None:
        shared = "the cores' load not recorded"
    else:
        shared = f"1-minute load average {load['before'][0]:.2f} before: " + (
            "the cores otherwise idle" if load["idle_before"] else "**other work shared the cores**"
        )
    lines = [
        "",
        f"Seconds per compute unit, side by side in one process on one thread ({t['rounds']} rounds of "
        f"{t['iterations']} iterations per method after one warm-up; {t['environment']['cpu']}; {shared}):",
        "",
        "| method | ms per unit | units per iteration | s per iteration | ms per sampling / trained forward "
        "| a trained forward in sampling forwards |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in t["methods"].items():
        lines.append(
            f"| {name} | {1000 * m['seconds_per_unit']:.3f} | {m['units_per_iteration']:.0f} | "
            f"{m['seconds_per_iteration']:.2f} | {1000 * m['seconds_per_sampling_forward']:.3f} / "
            f"{1000 * m['seconds_per_trained_forward']:.3f} | {m['trained_forward_in_sampling_forwards']:.2f} |"
        )
    return lines


def extension_note(extension: dict[str, list[int]]) -> str:
    """'; mixgrpo and treegrpo also seeds 10-25 (...)': the methods a pre-registered extension gave
    more reported seeds, for the header (older results.json files have none)."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for method, seeds in extension.items():
        groups.setdefault(tuple(seeds), []).append(method)
    parts = []
    for seeds, methods in groups.items():
        consecutive = len(seeds) > 2 and list(seeds) == list(range(seeds[0], seeds[-1] + 1))
        parts.append(
            f"{' and '.join(methods)} also seeds {f'{seeds[0]}-{seeds[-1]}' if consecutive else ', '.join(map(str, seeds))}"
        )
    return "".join(f"; {part} (the pair's pre-registered extension)" for part in parts)


def tables(report: dict[str, Any]) -> str:
    """report.md: the sweep, the comparison, the pairs, time to target and timing, from the JSON."""
    p = report["protocol"]
    lines = [
        f"Budget {p['budget']:,.0f} compute units per run; held-out reward of 36 prompts x {p['evaluation']['seeds_per_prompt']} "
        f"seeds; sweep seeds {', '.join(map(str, p['sweep_seeds']))}; reported seeds "
        f"{', '.join(map(str, p['reported_seeds']))}"
        + extension_note(p.get("extension_seeds", {}))
        + "; mean [95% bootstrap CI] over seeds."
        + (
            " With fewer than 5 seeds the intervals are too narrow to mean anything (a smoke run)."
            if len(p["reported_seeds"]) < 5
            else ""
        ),
        "",
        *(
            []
            if report["complete"] or not report["methods"]
            else [
                "**Interim**: the comparison is under way and the tables below hold the reported seeds "
                "trained so far (listed under them); their intervals are not the protocol's until every "
                "headline method has all its seeds. Read nothing into them yet.",
                "",
            ]
            if any(report["methods"].get(m, {}).get("n", 0) < len(p["reported_seeds"]) for m in HEADLINE)
            else [f"**Interim** while more seeds run: {extension_runs(report)}.", ""]
        ),
        "| method | rates tried: score (plateau per sweep seed) | chosen |",
        "|---|---|---|",
    ]
    for name, s in report["sweep"].items():
        cells = []
        for lr in s["explored"]:
            key = f"{lr:g}"
            plateaus, score = s["plateaus"][key], s["scores"][key]
            shown = ", ".join("—" if v is None else f"{v:.3f}" for v in plateaus)
            cells.append(f"{key}: {'—' if score is None else f'{score:.3f}'} ({shown})")
        chosen = "—" if s["chosen_lr"] is None else f"{s['chosen_lr']:g}"
        lines.append(f"| {name} | {'; '.join(cells)} | {chosen} |")
    if report["missing"]:
        lines += ["", "Not run yet: " + "; ".join(report["missing"]) + "."]
    methods = report["methods"]
    if methods:
        level_names = [units_k(x) for x in p["levels"]]
        lines += [
            "",
            "| method | lr | seeds | units / iteration (sampling + trained + reference) | "
            + " | ".join(f"reward at {n}" for n in level_names)
            + " | mean reward over the budget (AUC) | best evaluation | its fall to the end |",
            "|---|---|---|---|" + "---|" * len(level_names) + "---|---|---|",
        ]
        for name, m in methods.items():
            it = m["per_iteration"]
            cost = f"{it['units']:.0f} ({it['sampling']:.0f} + 3 x {it['trained']:.0f} + {it['reference']:.0f})"
            at = " | ".join(ci(m["at_units"][f"{x:.0f}"]) for x in p["levels"])
            lines.append(
                f"| {name} | {m['lr']:g} | {m['n']} | {cost} | {at} | {ci(m['auc'])} | {ci(m['peak'])} | "
                f"{ci(m['drop'])} |"
            )
    if report["pairs"]:
        lines += ["", "| pair (first minus second) | final reward | | AUC | |", "|---|---|---|---|---|"]
        for key, d in report["pairs"].items():
            lines.append(
                f"| {key} | {ci(d['final'], 4)} | {verdict(d['final'])} | {ci(d['auc'], 4)} | {verdict(d['auc'])} |"
            )
    if report.get("variant_pairs"):
        lines += [
            "",
            "| variant minus its headline method (paired over the variant's seeds) | seeds | final reward | | AUC | |",
            "|---|---|---|---|---|---|",
        ]
        for key, d in report["variant_pairs"].items():
            lines.append(
                f"| {key} | {len(d['seeds'])} | {ci(d['final'], 4)} | {verdict(d['final'])} | {ci(d['auc'], 4)} | "
                f"{verdict(d['auc'])} |"
            )
    goals = p["targets"]
    if (
        goals
        and methods
        and all("speedup" in m["compute_to_target"][k] for m in methods.values() for k in ("best_flat", "dancegrpo"))
    ):
        lines += [
            "",
            f"Targets from the sweep seeds: best flat baseline ({goals['best_flat']['method']}) "
            f"{goals['best_flat']['reward']:.4f}, DanceGRPO {goals['dancegrpo']['reward']:.4f}; compute to a target "
            "censored at the budget; speed-up = the baseline's mean compute to it over the method's.",
            "",
            "| method | best-flat target: reached, units | speed-up vs "
            + goals["best_flat"]["method"]
            + " | DanceGRPO target: reached, units | speed-up vs dancegrpo |",
            "|---|---|---|---|---|",
        ]
        for name, m in methods.items():
            cells = []
            for key in ("best_flat", "dancegrpo"):
                t = m["compute_to_target"][key]
                s = t["speedup"]
                cells += [
                    f"{sum(t['reached'])}/{len(t['reached'])}, {units_k(t['mean']['mean'])} "
                    f"[{units_k(t['mean']['lo'])}, {units_k(t['mean']['hi'])}]",
                    f"{times(s['mean'])} [{times(s['lo'])}, {times(s['hi'])}]",
                ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if report.get("timing"):
        lines += timing_table(report["timing"])
    lines += settle.tables(report) + fidelity.tables(report)
    if "flattening" in report:
        f = report["flattening"]
        shown = ", ".join(f"{units_k(x)}: {y:.4f}" for x, y in zip(f["units"], f["mean_reward"]))
        lines += [
            "",
            f"Plateau: {f['method']} (the best final mean), seed-mean reward at the last three evaluation "
            f"points {shown}; evaluation noise of that mean {f['evaluation_noise']:.4f}; "
            f"{'flat' if f['flat'] else 'NOT flat'} (each within two noise units of their mean).",
        ]
    lines += ["", report["headline"]]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the docs' generated regions
# ---------------------------------------------------------------------------------------------

BEGIN, END = "<!-- generated by benchmarks/compare_methods.py --report: do not edit -->", "<!-- end of generated -->"


def replace_generated(text: str, generated: str, where: str) -> str:
    """``text`` with the region between :data:`BEGIN` and :data:`END` replaced by ``generated``."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError(f"{where} needs exactly one generated region ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{generated}\n{END}{tail}"


def generated_region(text: str) -> str:
    """The content of ``text``'s generated region."""
    return text.split(BEGIN)[1].split(END)[0].strip("\n")
