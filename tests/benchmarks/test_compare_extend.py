"""A longer budget extends the cached runs from their checkpoints (benchmarks/compare/runs.py): the
extended record must be the record of a run trained straight to the longer budget, or a comparison
whose budget grew would mix two kinds of run. Trained for real on the Shapes world, small budgets."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from compare.methods import RunSpec, resolved_config
from compare.runs import Protocol, RunCache, sha256

SHORT = Protocol(budget=6_000.0, evaluations=2, eval_seeds=1)
LONG = Protocol(budget=12_000.0, evaluations=4, eval_seeds=1)  # the same spacing, twice as far


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    yield
    torch.set_num_threads(threads)


def record(cache: RunCache, spec: RunSpec) -> dict:
    return json.loads(cache.path(spec).read_text())


def training(saved: dict) -> tuple[list, list]:
    """What the run did, without its timings (the same work takes another time on a second try)."""
    timeless = [{k: v for k, v in i.items() if not k.endswith("_s")} for i in saved["iterations"]]
    curve = [{k: v for k, v in p.items() if k != "seconds"} for p in saved["curve"]]
    return timeless, curve


def test_a_protocol_extends_only_a_shorter_one_with_the_same_evaluations() -> None:
    assert LONG.extends(SHORT)
    assert not SHORT.extends(LONG)
    assert not LONG.extends(LONG)
    assert not LONG.extends(Protocol(budget=6_000.0, evaluations=3, eval_seeds=1))  # other spacing
    assert not LONG.extends(Protocol(budget=6_000.0, evaluations=2, eval_seeds=2))  # other noises


@pytest.mark.slow
@pytest.mark.parametrize("method", ["treegrpo", "mixgrpo"])
def test_an_extended_run_is_the_run_trained_straight_to_the_longer_budget(tmp_path: Path, method: str) -> None:
    spec = RunSpec(method, 3e-4, 100)
    straight = RunCache(tmp_path / "straight", LONG)
    straight.get(spec)

    grown = RunCache(tmp_path / "grown", SHORT)
    grown.get(spec)
    short = record(grown, spec)
    assert short["curve"][-1]["units"] >= SHORT.budget and len(short["curve"]) == 3
    grown = RunCache(tmp_path / "grown", LONG)
    assert grown.load(spec) is None and grown.start(spec) is not None
    grown.get(spec)

    extended, whole = record(grown, spec), record(straight, spec)
    assert len(extended["iterations"]) > len(short["iterations"])
    assert training(extended)[0][: len(short["iterations"])] == training(short)[0]
    # every loss, reward, count and held-out score equal (bitwise) to the unbroken run's
    assert training(extended) == training(whole)
    assert extended["seconds"] > short["seconds"]


def short_run(cache: RunCache, spec: RunSpec) -> None:
    """A finished run of ``spec`` under SHORT in ``cache`` with the checkpoint it ended with (not
    trained: :meth:`RunCache.start` reads only the record and the checkpoint's hash)."""
    cache.folder.mkdir(parents=True)
    cache.checkpoint(spec).write_bytes(b"the state the run stopped in")
    saved = {
        "identity": {"protocol": asdict(SHORT)},
        "spec": asdict(spec),
        "config": resolved_config(spec),
        "checkpoint_sha256": sha256(cache.checkpoint(spec)),
        "seconds": 1.0,
        "iterations": [{"units_total": 6_100.0}],
        "curve": [{"units": 0.0}, {"units": 6_100.0}],
    }
    cache.path(spec).write_text(json.dumps(saved))


def test_only_the_checkpoint_a_record_ended_with_is_extended(tmp_path: Path) -> None:
    spec = RunSpec("treegrpo", 3e-4, 100)
    cache = RunCache(tmp_path, SHORT)
    short_run(cache, spec)
    start = RunCache(tmp_path, LONG).start(spec)
    assert start is not None and start.checkpoint == cache.checkpoint(spec) and start.seconds == 1.0
    # a save interrupted between the checkpoint and the record leaves them apart: train from the start
    cache.checkpoint(spec).write_bytes(b"a longer run's state")
    assert RunCache(tmp_path, LONG).start(spec) is None
    cache.checkpoint(spec).unlink()
    assert RunCache(tmp_path, LONG).start(spec) is None


def test_a_longer_comparison_extends_the_runs_of_the_folder_it_names(tmp_path: Path) -> None:
    spec = RunSpec("branchgrpo_official", 3e-5, 0)
    reported = RunCache(tmp_path / "750k", SHORT)
    short_run(reported, spec)
    assert RunCache(tmp_path / "1200k", LONG).start(spec) is None  # its own folder holds no run
    start = RunCache(tmp_path / "1200k", LONG, shorter=[tmp_path / "750k"]).start(spec)
    assert start is not None and start.checkpoint == reported.checkpoint(spec) and start.seconds == 1.0
    # a shorter run under another spacing is not the start of this one
    assert (
        RunCache(
            tmp_path / "1200k", Protocol(budget=12_000.0, evaluations=3, eval_seeds=1), shorter=[tmp_path / "750k"]
        ).start(spec)
        is None
    )
