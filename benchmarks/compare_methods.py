"""TreeGRPO against DanceGRPO, Flow-GRPO, MixGRPO and BranchGRPO on the Shapes world, budgeted in
total compute, tuned on sweep seeds, reported over ten paired seeds with confidence intervals.

Every method is its preset in ``configs/methods/`` composed with ``configs/shapes.yaml``, built by
the project's own CLI (``benchmarks/compare/methods.py``), so what is measured is what ``fit``
trains. The protocol (docs/benchmarks.md) is fixed in code before any run:
``benchmarks/compare/plan.py`` (sweep, rule, targets, seeds), ``benchmarks/compare/runs.py``
(budget, evaluations), ``benchmarks/compare/stats.py`` (confidence intervals).

    python benchmarks/compare_methods.py --work --out benchmarks/results/shapes_cpu_750k    # train (resumable;
                                                             # two such processes share the runs)
    python benchmarks/compare_methods.py --report --out benchmarks/results/shapes_cpu_750k  # results.json, plots
    python benchmarks/compare_methods.py --timing --out benchmarks/results/shapes_cpu_750k  # seconds per unit
    python benchmarks/compare_methods.py --status --out benchmarks/results/shapes_cpu_750k  # how far
    python benchmarks/compare_methods.py --report --design 540k --out benchmarks/results/shapes_cpu_long  # the second one
    python benchmarks/compare_methods.py --report --design 300k --out benchmarks/results/shapes_cpu  # the first one
    python benchmarks/compare_methods.py --work --remedies --out benchmarks/results/shapes_cpu_remedies  # the remedy screen
    python benchmarks/compare_methods.py --quick --out runs/bench                      # < 10 min, 2 cores
"""

from __future__ import annotations

import argparse
import json
import math
import os
import stat
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import plan, plots, report  # noqa: E402
from compare.methods import VARIANT_OF, RunSpec  # noqa: E402
from compare.runs import InputError, RunCache, RunRecordError, kind_of, regular_file, timing  # noqa: E402

from lit_treegrpo.common.files import MiB, read_text_limited  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
REPORTED = RESULTS / "shapes_cpu_750k"
CEILINGS = RESULTS / "shapes_cpu_1200k"
REPORTED_DESIGN = next(name for name, design in plan.DESIGNS.items() if design is plan.FULL)
STOP = "STOP"
"""A file of this name in ``runs/`` tells every ``--work`` process to stop after its current run."""
#: the largest --docs file read (docs/results.md is about 50 KB) and the largest timing.json (about 5 KB)
MAX_DOC_BYTES = 4 * MiB
MAX_TIMING_BYTES = 4 * MiB
#: what --report writes into --out besides the plots (plots.draw's names)
REPORT_FILES = ("results.json", "report.md", "reward_vs_compute.png", "reward_vs_nfe.png", "reward_vs_seconds.png")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, help="folder of runs/, results.json and the plots")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--work",
        action="store_true",
        help="train every run the protocol needs (sweep first), "
        "skipping runs that are cached or that another process is training; "
        f"`touch OUT/runs/{STOP}` ends every such process after its current run",
    )
    mode.add_argument(
        "--report", action="store_true", help="statistics, results.json, plots and tables from the cached runs"
    )
    mode.add_argument("--timing", action="store_true", help="seconds per compute unit of each method, side by side")
    mode.add_argument(
        "--status",
        action="store_true",
        help="where the design stands: each sweep's plateaus and choice, the runs done and known to "
        "go (those that extend a shorter run), and the core-hours they need",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="the small protocol (plan.QUICK: 15k units, 1 rate, 1 sweep "
        "seed, 2 reported seeds, no variants); alone, it runs work, timing and report (same schema): "
        "< 10 min on 2 cores",
    )
    p.add_argument(
        "--design",
        choices=[d for d in plan.DESIGNS if d != "quick"],
        default=REPORTED_DESIGN,
        help="which fixed protocol (compare/plan.py: DESIGNS): 750k+ is the reported comparison's "
        "(benchmarks/results/shapes_cpu_750k: the 750k design's runs, the official presets and the "
        "TreeGRPO vs MixGRPO extension), 750k the same runs without those two, 540k the second "
        "comparison's (benchmarks/results/shapes_cpu_long), 300k the first one's (benchmarks/results/shapes_cpu)",
    )
    p.add_argument("--no-variants", action="store_true", help="--work: leave the variants out")
    p.add_argument(
        "--no-wait",
        action="store_true",
        help="--work: end once every run left is another live process's (so that a script's next "
        "stage starts at once) instead of waiting to take over a run whose process dies",
    )
    p.add_argument(
        "--ceiling",
        action="store_true",
        help="--work / --status: the ceiling runs (plan.CEILING: the methods still rising in --reported, "
        "to 1.2M units) into --out",
    )
    p.add_argument(
        "--reported",
        type=Path,
        default=REPORTED,
        help="--ceiling: the comparison whose still-rising methods and chosen rates it extends; its runs that "
        "kept a checkpoint go on from it instead of training again (default %(default)s)",
    )
    p.add_argument(
        "--ceiling-out",
        type=Path,
        default=CEILINGS,
        help="--report: the ceiling runs' folder, read for the ceilings of methods still rising (default %(default)s)",
    )
    p.add_argument(
        "--screen",
        action="store_true",
        help="--work / --status: the fidelity screen's runs (plan.screen_jobs: the official code's settings "
        "one at a time, at the 750k protocol) instead of the design's",
    )
    p.add_argument(
        "--remedies",
        action="store_true",
        help="--work / --status: the remedy screen's runs (plan.remedy_jobs: each remedy arm and treegrpo on two "
        "sweep seeds at two rates, to 1.2M units) into --out (benchmarks/results/shapes_cpu_remedies)",
    )
    p.add_argument(
        "--docs",
        type=Path,
        nargs="*",
        default=[],
        help="--report: also rewrite the generated region of these files (docs/results.md gets the "
        "tables, README.md the headline sentence)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the protocol's)")
    args = p.parse_args(argv)
    if not (args.work or args.report or args.timing or args.status):
        if not args.quick:
            p.error("choose --work, --report or --timing (or --quick for all three on the small protocol)")
        args.work = args.timing = args.report = True
    return args


def work(
    cache: RunCache,
    design: plan.Design,
    variants: bool = True,
    poll: float = 30.0,
    screen: bool = False,
    ceiling_of: RunCache | None = None,
    wait: bool = True,
    remedies: bool = False,
) -> None:
    """Train what the plan needs (``screen``: the screen's runs; ``remedies``: the remedy screen's; ``ceiling_of``: the ceiling runs of
    that comparison) until nothing is left; wait while other processes hold the rest (to take over a
    run whose process dies), or, without ``wait``, end then, so that a next stage starts at once.
    Ends after the run in hand (none lost) once ``runs/STOP`` exists."""
    stop = cache.folder / STOP
    planned_at, pending = None, []
    while True:
        if stop.exists():
            print(f"{stop} exists: stopping before the next run (delete it to go on)", flush=True)
            return
        # planning reads every record (the ceilings' plan, every run of the comparison it extends):
        # a waiting worker re-plans only once a record has changed, and meanwhile retries its claims
        stamp = (cache.records_stamp(), ceiling_of.records_stamp() if ceiling_of is not None else None)
        if stamp != planned_at:
            planned_at = stamp
            if ceiling_of is not None:
                wanted = plan.ceiling_jobs(ceiling_of)
            elif screen:
                wanted = plan.screen_jobs()
            elif remedies:
                wanted = plan.remedy_jobs()
            else:
                wanted = plan.jobs(cache, design, variants=variants)
            pending = [s for s in wanted if cache.load(s) is None]
        if not pending:
            print("nothing left to train", flush=True)
            return
        if next(cache.work(pending), None) is None:  # all pending runs are another process's
            if not wait:
                print(f"the {len(pending)} runs left are other processes': ending (--no-wait)", flush=True)
                return
            time.sleep(poll)


def status(cache: RunCache, design: plan.Design, variants: bool = True) -> str:
    """The text of ``--status``."""
    now = plan.progress(cache, design, variants=variants)
    extension = plan.extended(cache, design, now.sweeps)  # an extended method counts its extension seeds too
    lines = [f"{design.protocol.budget:,.0f} units per run, runs in {cache.folder}"]
    for m, sweep in now.sweeps.items():
        rates = " | ".join(
            f"{lr:g}: " + " ".join("..." if p is None else f"{p:.3f}" for p in plateaus)
            for lr, plateaus in sorted(sweep.rates.items())
        )
        chosen = "not yet" if sweep.chosen is None else f"{sweep.chosen:g}"
        seeds = plan.seeds_of(m, design, extension)
        runs = [s for s in now.done if s.method == m and s.lr == sweep.chosen and s.seed in seeds]
        lines.append(f"  {m:<18} sweep plateaus {rates}; chosen {chosen}; reported {len(runs)}/{len(seeds)}")
    if variants and design.variants:
        runs = [s for s in now.done if s.method in design.variants]
        lines.append(f"  variants: {len(runs)}/{len(design.variants) * len(design.variant_seeds)} runs")
    cost = (
        ""
        if now.seconds_left is None
        else (
            f": about {now.seconds_left / 3600:.1f} h on one core ({now.seconds_left / 7200:.1f} h with two --work processes)"
        )
    )
    later = ""
    if now.later:
        later = f"; {now.later} more once their sweeps choose a rate"
        if now.seconds_later is not None:
            later += f" (up to {now.seconds_later / 3600:.1f} h on one core, if none extends a shorter run)"
    lines.append(
        f"{len(now.done)} runs done, {len(now.pending)} known to go ({len(now.extending)} extend a shorter run){cost}"
        f"{later}; a sweep whose best rate is at its grid's edge adds a rate"
    )
    return "\n".join(lines)


def ceiling_status(cache: RunCache, reported: RunCache) -> str:
    """The text of ``--status --ceiling``: each still-rising method's ceiling runs done, and how many
    of those to go extend their run in ``reported``."""
    jobs = plan.ceiling_jobs(reported)
    done = {spec for spec, _ in cache.finished()}
    lines = [f"the ceilings ({cache.protocol.budget:,.0f} units), runs in {cache.folder}"]
    for method in dict.fromkeys(s.method for s in jobs):
        mine = [s for s in jobs if s.method == method]
        extending = sum(s not in done and cache.start(s) is not None for s in mine)
        lines.append(
            f"  {method:<20} {sum(s in done for s in mine)}/{len(mine)} runs at {mine[0].lr:g}"
            f" ({extending} to go extend a shorter run)"
        )
    lines.append(f"{sum(s in done for s in jobs)} of {len(jobs)} ceiling runs done")
    return "\n".join(lines)


def remedy_status(cache: RunCache) -> str:
    """The text of ``--status --remedies``: each arm's runs done, per rate."""
    jobs = plan.remedy_jobs()
    done = {spec for spec, _ in cache.finished()}
    lines = [f"the remedy screen ({cache.protocol.budget:,.0f} units), runs in {cache.folder}"]
    for method in dict.fromkeys(s.method for s in jobs):
        per_rate = " | ".join(
            f"{lr:g}: {sum(s in done for s in jobs if s.method == method and s.lr == lr)}/{len(plan.REMEDY_SEEDS)}"
            for lr in plan.REMEDY_RATES
        )
        lines.append(f"  {method:<26} {per_rate}")
    lines.append(f"{sum(s in done for s in jobs)} of {len(jobs)} remedy-screen runs done")
    return "\n".join(lines)


def screen_status(cache: RunCache) -> str:
    """The text of ``--status --screen``: each arm's runs done."""
    jobs = plan.screen_jobs()
    done = {spec for spec, _ in cache.finished()}
    lines = [f"the fidelity screen, runs in {cache.folder}"]
    for arm in plan.screen_rates():
        mine = [s for s in jobs if s.method == arm]
        lines.append(f"  {arm:<24} {sum(s in done for s in mine)}/{len(mine)} runs")
    lines.append(f"{sum(s in done for s in jobs)} of {len(jobs)} screen runs done")
    return "\n".join(lines)


#: the 1-minute load average below which the cores count as idle before a timing
IDLE_LOAD = 0.5


def timed(cache: RunCache, design: plan.Design, rounds: int, iterations: int) -> dict[str, Any]:
    """Seconds per unit of every reported method at its chosen rate (seed 0), with the environment."""
    sweeps = plan.sweeps_of(cache, design)
    chosen = {m: s.chosen for m, s in sweeps.items()}
    chosen.update({v: chosen[VARIANT_OF[v]] for v in design.variants})
    missing = [m for m, lr in chosen.items() if lr is None]
    if missing:
        raise SystemExit(f"--timing needs the chosen rates; the sweep of {', '.join(missing)} is not complete")
    before = os.getloadavg()
    result = timing([RunSpec(m, lr, 0) for m, lr in chosen.items()], rounds=rounds, iterations=iterations)
    # the load before the run says whether other work shared the cores (this process adds about 1)
    load = {"before": list(before), "after": list(os.getloadavg()), "idle_before": before[0] <= IDLE_LOAD}
    return {**result, "environment": report.environment(), "load_average": load}


def finite(value: Any) -> Any:
    """``value`` with every NaN / inf float replaced by None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def plot_links(results: dict[str, Any], out: Path, doc: Path) -> str:
    """The plots as images in ``doc``'s generated region; none until a reported run exists (the plots
    are drawn from the reported seeds only)."""
    if not results["methods"]:
        return ""
    rel = Path(os.path.relpath(out.resolve(), doc.resolve().parent))
    return "".join(
        f"\n\n![held-out reward against {what}]({(rel / name).as_posix()})"
        for what, name in (
            ("compute", "reward_vs_compute.png"),
            ("sampling NFE", "reward_vs_nfe.png"),
            *([("seconds", "reward_vs_seconds.png")] if results.get("seconds") else []),
        )
    )


def write_report(
    cache: RunCache, design: plan.Design, out: Path, docs: list[Path] = (), ceiling_out: Path | None = None
) -> dict[str, Any]:
    saved = out / "timing.json"
    longer = None
    if ceiling_out is not None and ceiling_out.is_dir():
        chosen = {m: s.chosen for m, s in plan.sweeps_of(cache, design).items()}
        longer = report.ceiling_runs(ceiling_out, chosen)
    timing = read_timing(saved)
    results = report.summarise(cache, design, timing, longer=longer)
    (out / "results.json").write_text(json.dumps(finite(results), indent=1, allow_nan=False))
    for path in plots.draw(results, out) if results["methods"] else []:
        print(f"wrote {path}")
    results = json.loads((out / "results.json").read_text())  # the tables format what the file holds
    text = report.tables(results)
    (out / "report.md").write_text(text + "\n")
    print(f"wrote {out / 'results.json'} and {out / 'report.md'}\n\n{text}")
    if results["missing"]:
        print("\nnot complete: " + "; ".join(results["missing"]))
    for doc in docs:
        generated = results["headline"] if doc.name == "README.md" else text + plot_links(results, out, doc)
        doc.write_text(report.replace_generated(read_doc(doc), generated, str(doc)))
        print(f"rewrote the generated region of {doc}")
    return results


def read_timing(path: Path) -> dict[str, Any] | None:
    """``--out``'s timing.json (None when there is none), checked: a regular file (a FIFO would block
    the read), bounded, a JSON object of per-method objects under ``methods``, as ``--timing`` writes."""
    fix = "delete it, or measure again with --timing"
    if not regular_file(path, "a timing file", fix):
        return None
    try:
        saved = json.loads(read_text_limited(path, MAX_TIMING_BYTES, "timing file"))
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not a timing file (invalid JSON: {err.msg} at line {err.lineno}); {fix}") from None
    except ValueError as err:  # too large, or not UTF-8
        raise InputError(f"{err}; {fix}") from None
    except OSError as err:
        raise InputError(f"{path}: cannot be read ({err.strerror}); {fix}") from None
    methods = saved.get("methods") if isinstance(saved, dict) else None
    if not isinstance(methods, dict) or not all(isinstance(m, dict) for m in methods.values()):
        raise InputError(f"{path}: not a timing file (no object of methods' timings under 'methods'); {fix}")
    return saved


def read_doc(doc: Path) -> str:
    """The text of a ``--docs`` file, checked before any work: a regular file (told without opening
    it), bounded, UTF-8, writable, with exactly one generated region."""
    fix = f"give --docs files with one generated region ({report.BEGIN} ... {report.END}), or leave {doc} out"
    if not regular_file(doc, "a Markdown file", fix):
        raise InputError(f"--docs {doc} does not exist; {fix}")
    try:
        text = read_text_limited(doc, MAX_DOC_BYTES, "--docs")
    except ValueError as err:  # too large, or not UTF-8
        raise InputError(str(err)) from None
    except OSError as err:
        raise InputError(f"--docs {doc}: cannot be read ({err.strerror}); {fix}") from None
    if not os.access(doc, os.W_OK):
        raise InputError(f"--docs {doc} is not writable; make it writable (chmod u+w {doc}), or leave it out")
    if (
        text.count(report.BEGIN) != 1
        or text.count(report.END) != 1
        or text.index(report.BEGIN) > text.index(report.END)
    ):
        raise InputError(f"--docs {doc} has no single generated region; {fix}")
    return text


def check_inputs(args: argparse.Namespace) -> None:
    """Refuse, in one line naming the option or file and the fix, what would fail or hang later (a
    ``--docs`` file after hours of training): ``--threads``, ``--docs`` and ``--out`` with what the
    modes write into it. Reads no run record (the modes that read them check them as they go)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if not 1 <= args.threads <= cores:
        raise InputError(
            f"--threads {args.threads} is no number of torch threads for the {cores} cores this process may use; "
            f"give --threads 1 (the protocol's) to {cores}"
        )
    if args.docs and not args.report:
        raise InputError("--docs rewrites the docs from the report: add --report, or leave --docs out")
    for doc in args.docs:
        read_doc(doc)
    writes = args.work or args.timing or args.report
    for folder, what, fix in (
        (args.out, "a folder", "give --out a folder (it is created if missing)"),
        (args.out / "runs", "the folder of run records", "remove it, or give --out another folder"),
    ):
        try:
            mode = os.stat(folder).st_mode
        except FileNotFoundError:
            break  # created when written
        except OSError as err:  # a parent that is a file, no permission
            raise InputError(f"--out {args.out}: {folder} cannot be used ({err.strerror}); {fix}") from None
        if not stat.S_ISDIR(mode):
            kind = "a file" if stat.S_ISREG(mode) else kind_of(mode)
            raise InputError(f"--out {args.out}: {folder} is {kind}, not {what}; {fix}")
        if writes and not os.access(folder, os.W_OK | os.X_OK):
            raise InputError(f"--out {args.out}: {folder} is not writable; give --out a folder you can write")
    if args.report and not args.timing:  # read by the report, not written before it: refused before any record is read
        read_timing(args.out / "timing.json")
    # what the modes write or read there: a FIFO in its place would block, a folder fail
    written = (["timing.json"] if args.timing or args.report else []) + (list(REPORT_FILES) if args.report else [])
    for name in written:
        regular_file(args.out / name, f"{name} as this benchmark writes it", "remove it, or give --out another folder")


def check_runs_folder(cache: RunCache, design: plan.Design, name: str, option: str = "--out") -> None:
    """Before ``--report`` / ``--status`` alone: refuse, in one line, a folder with no runs, or with
    the runs of another design only, instead of reporting an empty comparison as under way."""
    out = cache.folder.parent
    protocols = cache.protocols()  # every record read and checked (RunRecordError names a bad one)
    if not protocols:
        # the folder --reported names is read, never trained: say which runs it wants and how to make them
        train = "--work" if option == "--out" else f"--work --design {name} --out {out}"
        raise RunRecordError(f"no runs in {out}; check {option}, or train them with {train}")
    if asdict(design.protocol) in protocols:
        return
    designs = {**plan.DESIGNS, "quick": plan.QUICK}
    # designs with one protocol (750k, 750k+) read the same runs: name the reported one first
    held = sorted(
        (n for n, d in designs.items() if asdict(d.protocol) in protocols), key=lambda n: n != REPORTED_DESIGN
    )
    if held:
        raise RunRecordError(f"{out} holds design {held[0]}, not {name}; give --design {held[0]}")
    raise RunRecordError(f"{out} holds runs of no known design, none of {name}; check {option} and --design")


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse(argv)
    try:
        check_inputs(args)  # before any work
        return run(args)
    except InputError as err:  # an option, record or file it cannot use: one line, the option or file and the fix
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", message=".*does not have many workers")
    design = (
        plan.QUICK
        if args.quick
        else plan.CEILING
        if args.ceiling
        else plan.REMEDY_SCREEN
        if args.remedies
        else plan.DESIGNS[args.design]
    )
    # a ceiling run goes on from its 750k run's checkpoint where that run kept one
    cache = RunCache(args.out, design.protocol, shorter=[args.reported] if args.ceiling or args.remedies else [])
    reported = RunCache(args.reported, plan.FULL.protocol) if args.ceiling else None
    if reported is not None:  # the ceilings' plan is read from --reported: an empty one plans nothing
        check_runs_folder(reported, plan.FULL, REPORTED_DESIGN, "--reported")
    elif (args.report or args.status) and not (args.work or args.timing or args.screen or args.remedies):
        name = "quick" if args.quick else args.design
        check_runs_folder(cache, design, name)  # reads only: a missing --out is not created
    if args.status and reported is not None:
        print(ceiling_status(cache, reported))
        return None
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a parent that is a file, no permission
        raise InputError(
            f"--out {args.out}: cannot create it ({err.strerror}); give --out a folder you can write"
        ) from None
    if args.status:
        if args.remedies:
            print(remedy_status(cache))
        else:
            print(screen_status(cache) if args.screen else status(cache, design, variants=not args.no_variants))
        return None
    if args.work:
        poll = 2.0 if args.quick else 30.0
        work(
            cache,
            design,
            variants=not args.no_variants,
            poll=poll,
            screen=args.screen,
            ceiling_of=reported,
            wait=not args.no_wait,
            remedies=args.remedies,
        )
    if args.timing:
        rounds, iterations = (1, 1) if args.quick else (3, 3)
        (args.out / "timing.json").write_text(json.dumps(timed(cache, design, rounds, iterations), indent=1))
    if args.report:
        ceiling_out = None if args.quick else args.ceiling_out
        return write_report(cache, design, args.out, args.docs, ceiling_out=ceiling_out)
    return None


if __name__ == "__main__":
    main()
