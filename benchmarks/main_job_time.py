"""How long the README's main job takes, measured as a user runs it: the README's own command
(``OMP_NUM_THREADS=2 python -m lit_treegrpo fit --config configs/shapes.yaml``, read from the
README, with the threads it sets), in a fresh process, from a fresh folder.

Recorded: wall-clock and CPU seconds (user + system of the child process), the threads the command
sets, the load average before and after (1, 5 and 15 minutes: a figure measured on busy cores is
inflated, and the report says so), the CPU model and the cores this process may use, torch's
version, the commit, the held-out reward at each validation (``val/reward``), and the progress lines
the run printed (its own per-iteration seconds and validation times). The README quotes
:func:`figure` of the result; ``tests/scenarios/test_readme_commands.py`` checks that it does.

    python benchmarks/main_job_time.py [--out benchmarks/results/main_job_time] [--require-idle] [--threads N] [-- EXTRA ARGS]

``--require-idle`` refuses to start while the 1-minute load average is above 0.5 (another job on the
cores). ``--threads N`` runs the command with ``OMP_NUM_THREADS=N`` instead of the README's (to
compare thread counts; give another ``--out``). Arguments after ``--`` are appended to the command
(the test runs two iterations so).
Writes ``<out>.json``, ``<out>.md`` and ``<out>.log`` (the run's stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "main_job_time"
#: the main job's command inside the README's one-liner (after the installs)
COMMAND = re.compile(r"((?:\w+=\S+ )*python -m lit_treegrpo fit --config configs/shapes\.yaml)")
IDLE_LOAD = 0.5


def readme_command(readme: Path = REPO / "README.md") -> str:
    """The main job's command as the README's set-up block gives it, environment settings included."""
    block = readme.read_text().split("## Set up and run the main job", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    found = COMMAND.search(block)
    if found is None:
        raise ValueError(f"{readme}: no `python -m lit_treegrpo fit --config configs/shapes.yaml` in its set-up block")
    return found.group(1)


def split_command(command: str) -> tuple[dict[str, str], list[str]]:
    """``VAR=value ... python -m ...`` -> ({VAR: value}, [python, -m, ...])."""
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"\w+=\S*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; the platform's processor elsewhere)."""
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def held_out(root: Path) -> dict[int, float]:
    """``val/reward`` by iteration, from the run's TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[int, float] = {}
    for events in sorted((root / "tensorboard").rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        if "val/reward" in accumulator.Tags()["scalars"]:
            found.update({e.step: e.value for e in accumulator.Scalars("val/reward")})
    return dict(sorted(found.items()))


def figure(result: dict[str, Any]) -> str:
    """The wall-clock time as the README quotes it: ``5 min 12 s``."""
    minutes, seconds = divmod(round(result["wall_s"]), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


def measure(command: str, extra: list[str], work: Path, threads: int | None = None) -> dict[str, Any]:
    """Run ``command`` (plus ``extra``; ``threads``: its ``OMP_NUM_THREADS`` replaced) in ``work``
    (its ``configs/`` linked to the repository's) and return what the module docstring lists."""
    env_set, words = split_command(command)
    if threads is not None:
        env_set["OMP_NUM_THREADS"] = str(threads)
        command = " ".join([*(f"{k}={v}" for k, v in env_set.items()), *map(shlex.quote, words)])
    if words[0] == "python":
        words[0] = sys.executable  # this environment's interpreter, as the README's activated venv
    (work / "configs").symlink_to(REPO / "configs")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONWARNINGS")}
    env.update(env_set)
    load_before = os.getloadavg()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([*words, *extra], cwd=work, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_after = os.getloadavg()
    if done.returncode != 0:
        raise RuntimeError(f"the main job failed (status {done.returncode}):\n{done.stderr[-3000:]}")
    import torch

    return {
        "command": " ".join([command, *map(shlex.quote, extra)]),
        "wall_s": wall,
        "cpu_s": (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime),
        "threads": env_set.get("OMP_NUM_THREADS", "unset (torch's default: one per core)"),
        "load_before": list(load_before),
        "load_after": list(load_after),
        "idle_before": load_before[0] <= IDLE_LOAD,
        "cpu_model": cpu_model(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "held_out": {str(k): v for k, v in held_out(work / "runs" / "shapes").items()},
        "stdout": done.stdout,
    }


def _commit() -> str:
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return found.stdout.strip() or "unknown"


def report(result: dict[str, Any]) -> str:
    """The Markdown page of one measurement."""
    load = lambda values: " / ".join(f"{v:.2f}" for v in values)  # noqa: E731
    rewards = ", ".join(f"{step}: {value:.4f}" for step, value in result["held_out"].items())
    lines = [
        "# The main job's time (benchmarks/main_job_time.py)",
        "",
        f"`{result['command']}`, in a fresh process and folder.",
        "",
        "| wall clock | CPU (user + system) | threads | cores | CPU | load average before (1 / 5 / 15 min) | after |",
        "|---|---|---|---|---|---|---|",
        f"| {figure(result)} ({result['wall_s']:.1f} s) | {result['cpu_s']:.1f} s | {result['threads']} | "
        f"{result['cores']} | {result['cpu_model']} | {load(result['load_before'])} | {load(result['load_after'])} |",
        "",
        f"Held-out reward (`val/reward`) by iteration: {rewards}.",
        "",
        f"torch {result['torch']}, Python {result['python']}, commit {result['commit']}, {result['date']}.",
    ]
    if not result["idle_before"]:
        lines += [
            "",
            f"**The cores were not idle** (1-minute load average {result['load_before'][0]:.2f} before the run): "
            "other work shared them, so this figure is an upper bound.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where to write <out>.json, .md and .log")
    parser.add_argument("--require-idle", action="store_true", help=f"refuse to start above load {IDLE_LOAD}")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS instead of the README's")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    load = os.getloadavg()[0]
    if args.require_idle and load > IDLE_LOAD:
        parser.exit(
            2, f"error: the 1-minute load average is {load:.2f}: other work shares the cores; run again when idle\n"
        )
    command = readme_command()
    with tempfile.TemporaryDirectory(prefix="main_job_time_") as work:
        result = measure(command, extra, Path(work), threads=args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".log").write_text(result.pop("stdout"))
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(report(result))
    print(report(result))
    return result


if __name__ == "__main__":
    main()
