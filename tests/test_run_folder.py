"""A fit never destroys what a run folder holds: no second run on top of the first, no second
live fit beside it, no config record replaced, nothing left by a command refused before it ran."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_treegrpo import run_folder
from lit_treegrpo.run_folder import LOCK_NAME, RunFolderError, RunLock, write_new_record
from tests.test_cli import QUIET, TINY, _main_error, no_model, snapshot  # noqa: F401  (no_model: a fixture)

REPO = Path(__file__).resolve().parents[1]


def _old_run(root: Path) -> dict[str, bytes]:
    """A folder as an earlier fit leaves it (the files' contents do not matter to these checks)."""
    (root / "checkpoints").mkdir(parents=True)
    (root / "checkpoints" / "last.ckpt").write_bytes(b"the trained weights")
    (root / "tensorboard").mkdir()
    (root / "tensorboard" / "config.yaml").write_text("model: {seed: 7}\n")
    (root / "samples").mkdir()
    (root / "samples" / "step_000000.png").write_bytes(b"png")
    return snapshot(root)


def test_a_new_fit_in_a_folder_that_holds_a_run_is_refused_with_the_ways_forward(tmp_path: Path, capsys, monkeypatch, no_model) -> None:
    before = _old_run(tmp_path)
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--trainer.default_root_dir", str(tmp_path))
    assert line.startswith(f"error: --trainer.default_root_dir: {tmp_path} already holds a run ({tmp_path / 'checkpoints' / 'last.ckpt'}); "
                           "resume it with --ckpt_path last, train into another --trainer.default_root_dir, or pass --overwrite true"), line  # fmt: skip
    assert snapshot(tmp_path) == before  # no lock, config or event file left behind


def test_a_fit_refused_on_a_bad_option_writes_nothing_into_the_run(tmp_path: Path, capsys, monkeypatch, no_model) -> None:
    before = _old_run(tmp_path)
    _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--ckpt_path", "last", "--model.minibatches", "0",
                "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert snapshot(tmp_path) == before


def test_overwrite_starts_a_new_run_in_place_of_the_old_one(tmp_path: Path) -> None:
    from lit_treegrpo.cli import main

    _old_run(tmp_path)
    (tmp_path / "predictions").mkdir()  # not a fit's output: kept
    main(["fit", "--config", str(TINY), *QUIET, "--overwrite", "true", "--trainer.max_steps", "1",
          "--trainer.limit_val_batches", "0", "--trainer.default_root_dir", str(tmp_path)])  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.ckpt"]  # no last-v1.ckpt beside it
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 1
    assert "overwrite: true" in (tmp_path / "tensorboard" / "config.yaml").read_text()
    assert not (tmp_path / "samples" / "step_000000.png").read_bytes() == b"png"
    assert (tmp_path / "predictions").is_dir() and not (tmp_path / LOCK_NAME).exists()


def test_overwrite_with_a_checkpoint_to_resume_is_refused(tmp_path: Path, capsys, monkeypatch, no_model) -> None:
    before = _old_run(tmp_path)
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--overwrite", "true", "--ckpt_path", "last",
                       "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert line.startswith("error: --overwrite true starts a new run, --ckpt_path last resumes one; give only one of them"), line
    assert snapshot(tmp_path) == before


def test_overwrite_keeps_the_old_run_when_the_new_one_fails_to_load(tmp_path: Path, capsys, monkeypatch) -> None:
    before = _old_run(tmp_path)
    missing = '{"class_path": "lit_treegrpo.models.sd3.SD3Adapter", "init_args": {"pretrained": "/no/such/model"}}'
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--overwrite", "true", "--model.adapter", missing,
                       "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert "/no/such/model" in line, line
    assert snapshot(tmp_path) == before


def test_validate_saves_no_config_over_the_fits(tmp_path: Path) -> None:
    from lit_treegrpo.cli import main

    config = tmp_path / "tensorboard" / "config.yaml"
    config.parent.mkdir()
    config.write_text("the fit's configuration\n")
    main(["validate", "--config", str(TINY), *QUIET, "--trainer.default_root_dir", str(tmp_path)])
    assert config.read_text() == "the fit's configuration\n"
    assert sorted(p.name for p in config.parent.glob("config*")) == ["config.yaml"]
    assert list(config.parent.glob("events.out.tfevents.*")), "validate logged nothing"


def test_config_records_are_numbered_and_never_replaced(tmp_path: Path) -> None:
    assert write_new_record(tmp_path, "first\n").name == "config.yaml"
    assert write_new_record(tmp_path, "second\n").name == "config-2.yaml"
    (tmp_path / "config-3.yaml").write_text("written by someone else\n")
    assert write_new_record(tmp_path, "fourth\n").name == "config-4.yaml"
    assert [(tmp_path / n).read_text() for n in ("config.yaml", "config-2.yaml", "config-3.yaml", "config-4.yaml")] == [
        "first\n", "second\n", "written by someone else\n", "fourth\n"]  # fmt: skip


# a process holding a run folder's lock as a fit does (flock on .fit.lock, its PID inside), without
# the seconds of importing Lightning
_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.write(fd, f"{os.getpid()}\\n".encode())
print("locked", flush=True)
time.sleep(600)
"""


def test_a_second_live_fit_is_refused_naming_the_holder(tmp_path: Path, capsys, monkeypatch, no_model) -> None:
    lock = RunLock(tmp_path)
    lock.acquire()  # a fit in progress (this process: a second flock on the file conflicts all the same)
    try:
        line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--trainer.default_root_dir", str(tmp_path))
    finally:
        lock.release()
    assert line.startswith(f"error: --trainer.default_root_dir: {tmp_path} is in use by another fit (pid {os.getpid()}, lock "), line
    assert "wait for it to end or stop it, or train into another --trainer.default_root_dir" in line
    assert list(tmp_path.iterdir()) == []


def test_a_killed_fits_lock_is_taken_over(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path / LOCK_NAME)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderError, match=f"in use by another fit \\(pid {holder.pid},"):
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()  # SIGKILL: no clean-up runs, the lock file stays with a dead PID in it
        holder.wait()
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(holder.pid)
    lock = RunLock(tmp_path)
    lock.acquire()  # the kernel dropped the dead holder's flock
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_without_flock_the_pid_in_the_lock_decides(tmp_path: Path, monkeypatch) -> None:
    def no_flock(fd: int, operation: int) -> None:  # e.g. a network filesystem without locks
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_folder.fcntl, "flock", no_flock)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        (tmp_path / LOCK_NAME).write_text(f"{alive.pid}\n")
        with pytest.raises(RunFolderError, match=f"pid {alive.pid}"):
            RunLock(tmp_path).acquire()
    finally:
        alive.kill()
        alive.wait()
    (tmp_path / LOCK_NAME).write_text(f"{dead.pid}\n")
    lock = RunLock(tmp_path)
    lock.acquire()  # a stale lock: its PID is gone
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())
    lock.release()


def test_the_lock_removes_only_the_empty_folders_it_created(tmp_path: Path) -> None:
    root = tmp_path / "new" / "run"
    lock = RunLock(root)
    lock.acquire()
    assert (root / LOCK_NAME).exists()
    lock.release()
    assert not (tmp_path / "new").exists()
    # a folder that already existed stays, and so does what another writer put into one it made
    lock = RunLock(root)
    lock.acquire()
    (root / "checkpoints").mkdir()
    lock.release()
    assert (root / "checkpoints").is_dir() and not (root / LOCK_NAME).exists()


def test_the_ranks_a_launcher_starts_beside_rank_0_leave_the_folder_to_it(monkeypatch) -> None:
    for name in ("RANK", "SLURM_PROCID", "NODE_RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert run_folder.launch_rank() == 0
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert run_folder.launch_rank() == 1
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("NODE_RANK", "2")
    assert run_folder.launch_rank() == 2

