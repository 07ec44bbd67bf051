"""The shipped configs work from an installed wheel, not only from a checkout: the wheel built from
the sources, installed in a fresh virtual environment (torch first, as the README says), runs one
step of the main job from a folder outside the repository, naming the config as ``--config shapes``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: what a wheel is built from (pyproject.toml's packages, package-dir and readme)
SOURCES = ("pyproject.toml", "README.md", "lit_treegrpo", "callbacks", "configs")


def _run(*args: str | Path, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "LIT_TREEGRPO_DEBUG")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, args))}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow  # a fresh venv with torch and the wheel's dependencies: 2-4 minutes here
def test_the_wheel_installs_in_a_fresh_venv_and_runs_the_main_job_from_outside_the_repository(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a clean copy: no build/ left over from an earlier build
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", source,
         cwd=tmp_path)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("lit_treegrpo-*.whl")

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(python, "-m", "pip", "install", "-q", "torch==2.13.0", cwd=tmp_path)
    _run(python, "-m", "pip", "install", "-q", wheel, cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run(python, "-c", "import lit_treegrpo; print(lit_treegrpo.__file__)", cwd=elsewhere).stdout.strip()
    assert Path(where).is_relative_to(venv), where  # the installed package, not the checkout
    fit = _run(python, "-m", "lit_treegrpo", "fit", "--config", "shapes", "--trainer.max_steps", "1",
               "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
               "--trainer.default_root_dir", "run", cwd=elsewhere)  # fmt: skip
    assert (elsewhere / "run" / "checkpoints" / "last.ckpt").is_file(), fit.stdout[-2000:]
    # a method preset by name too, and the console script
    preset = _run(venv / "bin" / "lit-treegrpo", "fit", "--config", "shapes", "--config", "methods/mixgrpo",
                  "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar",
                  "false", "--trainer.default_root_dir", "run_mixgrpo", cwd=elsewhere)  # fmt: skip
    assert (elsewhere / "run_mixgrpo" / "checkpoints" / "last.ckpt").is_file(), preset.stdout[-2000:]
