"""The main CPU job, configs/shapes.yaml, raises the held-out reward (a short run: 60 of its 300 steps)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_treegrpo.artifacts.run_folder import event_folder

REPO = Path(__file__).resolve().parents[2]
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(
        [sys.executable, "-m", "lit_treegrpo", *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=1200
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def scalar(root: Path, tag: str) -> list[tuple[int, float]]:
    values = []
    for events in sorted((root / "tensorboard").rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            values += [(e.step, e.value) for e in acc.Scalars(tag)]
    return values


@pytest.mark.slow
def test_the_shapes_job_raises_the_held_out_reward_and_keeps_diversity(tmp_path: Path) -> None:
    config = ["--config", str(REPO / "configs" / "shapes.yaml"), *QUIET]
    cli("validate", *config, "--trainer.default_root_dir", str(tmp_path / "base"))
    cli("fit", *config, "--trainer.max_steps", "60", "--trainer.val_check_interval", "60",
        "--trainer.default_root_dir", str(tmp_path / "rl"))  # fmt: skip
    ((_, base),) = scalar(tmp_path / "base", "val/reward")
    ((_, base_diversity),) = scalar(tmp_path / "base", "val/diversity")
    (start, (step, tuned)) = scalar(tmp_path / "rl", "val/reward")
    diversity = scalar(tmp_path / "rl", "val/diversity")[-1][1]
    # the fit scores the base model first (validate_at_start), what the validate command gave
    assert start[0] == 0 and start[1] == pytest.approx(base, abs=1e-6), (start, base)
    assert step == 60  # validation is logged at the number of completed iterations (one x-axis)
    assert tuned > base + 0.03, (base, tuned)  # measured: 0.630 -> ~0.72 after 50 steps
    assert diversity > 0.5 * base_diversity, (base_diversity, diversity)
    assert len(scalar(tmp_path / "rl", "reward/mean")) == 60
    images = EventAccumulator(str(event_folder(tmp_path / "rl" / "tensorboard")), size_guidance={"images": 0})
    images.Reload()
    assert [e.step for e in images.Images("tree")] == [0, 50, 60]  # the tree view: the grid's rhythm, and the end
