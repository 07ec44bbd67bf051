"""benchmarks/main_job_time.py: the README's main-job command, timed in a fresh process with the
threads it sets (the figure itself comes from a run on idle cores, not from a test)."""

from __future__ import annotations

import json
from pathlib import Path

import main_job_time
import pytest


def test_it_times_the_readmes_own_command_with_the_threads_that_command_sets() -> None:
    command = main_job_time.readme_command()
    assert command == "OMP_NUM_THREADS=2 python -m lit_treegrpo fit --config configs/shapes.yaml"
    env, words = main_job_time.split_command(command)
    assert env == {"OMP_NUM_THREADS": "2"} and words[:3] == ["python", "-m", "lit_treegrpo"]
    assert main_job_time.figure({"wall_s": 312.4}) == "5 min 12 s"
    assert main_job_time.figure({"wall_s": 59.6}) == "1 min 0 s"


@pytest.mark.slow  # two iterations of the main job in a fresh process (the real run is 300)
def test_the_code_path_records_time_threads_load_machine_and_rewards(tmp_path: Path) -> None:
    out = tmp_path / "main_job_time"
    result = main_job_time.main(
        ["--out", str(out), "--", "--trainer.max_steps", "2", "--trainer.val_check_interval", "2"]
    )
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved == result and saved["threads"] == "2"
    assert saved["wall_s"] > 0 and saved["cpu_s"] > 0 and saved["cores"] >= 1 and saved["cpu_model"]
    assert len(saved["load_before"]) == len(saved["load_after"]) == 3
    assert list(saved["held_out"]) == ["0", "2"] and all(0 < v < 1 for v in saved["held_out"].values())
    assert saved["command"].endswith(
        "--config configs/shapes.yaml --trainer.max_steps 2 --trainer.val_check_interval 2"
    )
    page = out.with_suffix(".md").read_text()
    assert main_job_time.figure(saved) in page and saved["cpu_model"] in page
    assert "finished at iteration 2" in out.with_suffix(".log").read_text()  # the run's own progress lines
