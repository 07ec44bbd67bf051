"""The README's commands as a new user runs them: the main job's one-liner sets the threads its
time assumes, and that time is the one benchmarks/main_job_time.py measured; the method-preset
example runs after the main job, in a run folder of its own."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MEASURED = REPO / "benchmarks" / "results" / "main_job_time.json"
# one training step, small: appended to the README's commands
ONE_STEP = ["--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", "--data.batch_size", "2"]


def _preset_example() -> list[str]:
    (found,) = re.findall(r"`(python -m lit_treegrpo fit --config configs/shapes\.yaml --config configs/methods/[^`]+)`",
                          README.read_text())  # fmt: skip
    return shlex.split(found)


def test_the_readme_states_the_main_jobs_threads_and_its_measured_time() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import main_job_time

    text = README.read_text()
    assert main_job_time.readme_command().startswith("OMP_NUM_THREADS=2 ")  # the threads its time assumes
    assert "benchmarks/main_job_time.py" in text
    if MEASURED.is_file():  # once measured on idle cores, the README quotes that figure and its page
        measured = json.loads(MEASURED.read_text())
        page = MEASURED.with_suffix(".md").relative_to(REPO).as_posix()  # the report it wrote beside
        assert main_job_time.figure(measured) in text and page in text
        assert measured["threads"] == "2" and measured["idle_before"], measured


def test_the_readme_preset_example_runs_after_the_main_job(tmp_path: Path, monkeypatch) -> None:
    from lit_treegrpo.cli import main

    monkeypatch.chdir(tmp_path)  # a fresh folder, as a clone's root: runs/ lands here
    (tmp_path / "configs").symlink_to(REPO / "configs")
    main_job = shlex.split(
        re.search(r"python -m lit_treegrpo fit --config configs/shapes\.yaml", README.read_text())[0]
    )
    main([*main_job[3:], *ONE_STEP])
    assert (tmp_path / "runs" / "shapes" / "checkpoints" / "last.ckpt").is_file()
    preset = _preset_example()
    main([*preset[3:], *ONE_STEP])  # refused before: runs/shapes already held the main job's run
    (folder,) = [preset[i + 1] for i, a in enumerate(preset) if a == "--trainer.default_root_dir"]
    assert folder != "runs/shapes" and (tmp_path / folder / "checkpoints" / "last.ckpt").is_file()
