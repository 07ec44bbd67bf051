"""How much compute does the comparison's budget need for a method's held-out curve to flatten?

Trains one method at its chosen rate (read from the comparison's ``results.json`` in ``--from``, or
given by ``--lr``) on sweep
seeds only (never the reported ones), to a longer budget than the comparison's, with a held-out
evaluation every ``--every`` units as the comparison evaluates (same prompts, same noises). Then,
at each evaluation point B, it applies the report's flatness check to the seed-mean curve cut at
B (the last three evaluations within two noise units of their mean; noise: the evaluations' own
standard error over the square root of the number of seeds), so that the next comparison's
budget can be fixed before its runs. The runs are cached and claimed as the comparison's are, so
two processes share them and an interrupted pilot resumes; a longer ``--budget`` extends them.

    python benchmarks/budget_pilot.py --method treegrpo --budget 900000 --seeds 100 101 \\
        --out benchmarks/results/shapes_cpu_pilot          # train (two processes may share)
    python benchmarks/budget_pilot.py --method treegrpo --budget 900000 --seeds 100 101 \\
        --out benchmarks/results/shapes_cpu_pilot --report  # the check at every point, pilot_treegrpo_lr0.0001.json
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import plan, report  # noqa: E402
from compare.methods import RunSpec  # noqa: E402
from compare.runs import Protocol, RunCache  # noqa: E402

COMPARISON = Path(__file__).resolve().parent / "results" / "shapes_cpu_750k"  # the comparison the docs report


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", required=True, help="a headline method of the comparison, e.g. treegrpo")
    p.add_argument("--budget", type=float, required=True, help="compute units per run (the comparison's: 300000)")
    p.add_argument("--every", type=float, default=30_000.0, help="units between evaluations (the comparison's)")
    p.add_argument("--seeds", type=int, nargs="+", default=list(plan.SWEEP_SEEDS[:2]), help="sweep seeds only")
    p.add_argument("--out", type=Path, required=True, help="folder of the pilot's runs/ and pilot.json")
    p.add_argument(
        "--from", dest="source", type=Path, default=COMPARISON, help="the comparison whose sweep chose the rate"
    )
    p.add_argument("--lr", type=float, help="the rate to train (default: the one the comparison in --from chose)")
    p.add_argument(
        "--report",
        action="store_true",
        help="print the flatness check at every point; write pilot_<method>_lr<lr>.json",
    )
    args = p.parse_args(argv)
    if args.method not in plan.HEADLINE:
        p.error(f"--method must be one of {', '.join(plan.HEADLINE)}, got {args.method!r}")
    reported = set(args.seeds) & (set(plan.REPORT_SEEDS) | set(plan.VARIANT_SEEDS))
    if reported:
        p.error(f"--seeds {sorted(reported)} are the comparison's reported seeds; a pilot uses sweep seeds")
    evaluations = args.budget / args.every
    if args.budget <= 0 or args.every <= 0 or evaluations != int(evaluations) or evaluations < 3:
        p.error("--budget must be a multiple (at least 3) of --every")
    return args


def chosen_rate(source: Path, method: str) -> float:
    """The rate the comparison in ``source`` chose for ``method`` (its results.json, whatever the
    protocol its runs were trained under)."""
    path = source / "results.json"
    chosen = json.loads(path.read_text()).get("sweep", {}).get(method, {}).get("chosen_lr") if path.is_file() else None
    if chosen is None:
        raise SystemExit(f"{path} has no chosen rate for {method}: give --lr, or --from a finished comparison")
    return float(chosen)


def pilot_name(method: str, lr: float) -> str:
    """The pilot's file: one per method and rate, so that a pilot at another rate (the one a longer
    comparison's sweep chose) sits beside the earlier one instead of replacing it."""
    return f"pilot_{method}_lr{lr:g}.json"


def checks(runs: list[Any], every: float, budget: float) -> list[dict[str, Any]]:
    """The report's flatness check on the seed-mean curve cut at each evaluation point (from the third)."""
    out = []
    points = int(budget / every)
    for n in range(3, points + 1):
        # an evaluation lands just past its multiple of `every` (at the iteration that crosses it): keep
        # it, so that the curve is interpolated at the cut, not held at the evaluation before
        cut = [type(r)(r.iterations, [p for p in r.curve if p["units"] < (n + 0.5) * every]) for r in runs]
        out.append({"budget": n * every, **report.flattening(cut, n * every, n)})
    return out


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", message=".*does not have many workers")
    lr = args.lr if args.lr is not None else chosen_rate(args.source, args.method)
    cache = RunCache(args.out, Protocol(budget=args.budget, evaluations=int(args.budget / args.every)))
    specs = [RunSpec(args.method, lr, seed) for seed in args.seeds]
    if not args.report:
        for spec in cache.work(specs):
            print(f"trained {spec.key}", flush=True)
        return None
    runs = [cache.load(s) for s in specs]
    missing = [s.key for s, r in zip(specs, runs) if r is None]
    if missing:
        raise SystemExit(f"not trained yet: {', '.join(missing)}")
    rows = checks(runs, args.every, args.budget)
    first_flat = next((r["budget"] for r in rows if r["flat"]), None)
    means = [(r["budget"], r["mean_reward"][-1]) for r in rows]
    peak = max(means, key=lambda m: m[1])
    result = {"method": args.method, "lr": lr, "seeds": args.seeds, "every": args.every, "checks": rows,
              "first_flat_budget": first_flat, "peak": {"budget": peak[0], "mean_reward": peak[1]}}  # fmt: skip
    (args.out / pilot_name(args.method, lr)).write_text(json.dumps(result, indent=1))
    for r in rows:
        ys = ", ".join(f"{y:.4f}" for y in r["mean_reward"])
        print(f"{r['budget']:>9.0f} units: last three {ys}, noise {r['evaluation_noise']:.4f}: "
              f"{'flat' if r['flat'] else 'climbing or noisy'}")  # fmt: skip
    print(f"first flat at {first_flat} units" if first_flat else "not flat within the budget")
    print(f"highest seed mean {peak[1]:.4f} at {peak[0]:.0f} units")
    return result


if __name__ == "__main__":
    main()
