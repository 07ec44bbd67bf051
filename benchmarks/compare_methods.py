"""TreeGRPO against DanceGRPO, Flow-GRPO, MixGRPO and BranchGRPO on the Shapes world, budgeted in
total compute, tuned on sweep seeds, reported over ten paired seeds with confidence intervals.

Every method is its preset in ``configs/methods/`` composed with ``configs/shapes.yaml``, built by
the project's own CLI (``benchmarks/compare/methods.py``), so what is measured is what ``fit``
trains. The protocol (docs/benchmarks.md) is fixed in code before any run:
``benchmarks/compare/plan.py`` (sweep, rule, targets, seeds), ``benchmarks/compare/runs.py``
(budget, evaluations), ``benchmarks/compare/stats.py`` (confidence intervals).

    python benchmarks/compare_methods.py --work --out benchmarks/results/shapes_cpu    # train (resumable;
                                                                 # two such processes share the runs)
    python benchmarks/compare_methods.py --report --out benchmarks/results/shapes_cpu  # results.json, plots
    python benchmarks/compare_methods.py --timing --out benchmarks/results/shapes_cpu  # seconds per unit
    python benchmarks/compare_methods.py --quick --out runs/bench                      # < 10 min, 2 cores
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import plan  # noqa: E402
from compare.runs import Protocol, RunCache  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder of runs/, results.json and the plots")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--work", action="store_true", help="train every run the protocol needs (sweep first), "
                      "skipping runs that are cached or that another process is training")  # fmt: skip
    mode.add_argument("--report", action="store_true", help="statistics, results.json, plots and tables from the cached runs")
    mode.add_argument("--timing", action="store_true", help="seconds per compute unit of each method, side by side")
    mode.add_argument("--quick", action="store_true", help="a small protocol end to end (same schema): < 10 min on 2 cores")
    p.add_argument("--no-variants", action="store_true", help="--work: leave the variants out")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the protocol's)")
    return p.parse_args(argv)


def work(cache: RunCache, variants: bool) -> None:
    """Train what the plan needs until nothing is left; wait while other processes hold the rest."""
    while True:
        pending = [s for s in plan.jobs(cache, variants=variants) if cache.load(s) is None]
        if not pending:
            print("nothing left to train", flush=True)
            return
        if next(cache.work(pending), None) is None:  # all pending runs are another process's
            time.sleep(30)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", message=".*does not have many workers")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.work:
        work(RunCache(args.out, Protocol()), variants=not args.no_variants)


if __name__ == "__main__":
    main()
