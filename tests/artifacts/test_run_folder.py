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

from lit_treegrpo.artifacts import run_folder
from lit_treegrpo.artifacts.run_folder import LOCK_NAME, SET_ASIDE, RunFolderError, RunLock, write_new_record
from lit_treegrpo.common.files import MANIFEST_NAME, Manifest
from tests.cli.test_cli import QUIET, TINY, _main_error, snapshot

REPO = Path(__file__).resolve().parents[2]


OLD_RUN = ("checkpoints/last.ckpt", "tensorboard/config.yaml", "tensorboard/m_tree-k2_mean_r/events.out.tfevents.1.host",
           "samples/step_000000.png")  # fmt: skip


def _old_run(root: Path, *, recorded: bool = True) -> dict[str, bytes]:
    """A folder as an earlier fit leaves it, its files recorded in its manifest (``recorded``; not:
    a run from before manifests). The files' contents do not matter to these checks."""
    for rel in OLD_RUN:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(f"the earlier run's {rel}".encode())
    if recorded:
        manifest = Manifest.read(root)
        for rel in OLD_RUN:
            manifest.record(rel, grows="tfevents" in rel)
        manifest.save()
    return snapshot(root)


def test_a_new_fit_in_a_folder_that_holds_a_run_is_refused_with_the_ways_forward(
    tmp_path: Path, capsys, monkeypatch, no_model
) -> None:
    before = _old_run(tmp_path)
    line = _main_error(
        monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--trainer.default_root_dir", str(tmp_path)
    )
    assert line.startswith(
        f"error: --trainer.default_root_dir: {tmp_path} already holds a run ({tmp_path / 'checkpoints' / 'last.ckpt'}); "
        "resume it with --ckpt_path last, train into another --trainer.default_root_dir, or pass --overwrite true"
    ), line
    assert snapshot(tmp_path) == before  # no lock, config or event file left behind


def test_a_fit_refused_on_a_bad_option_writes_nothing_into_the_run(
    tmp_path: Path, capsys, monkeypatch, no_model
) -> None:
    before = _old_run(tmp_path)
    _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--ckpt_path", "last", "--model.minibatches", "0",
                "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert snapshot(tmp_path) == before


def test_overwrite_starts_a_new_run_in_place_of_the_old_one(tmp_path: Path, caplog) -> None:
    from lit_treegrpo.cli import main

    _old_run(tmp_path)
    (tmp_path / "predictions").mkdir()  # not a fit's output: kept
    # files a fit does not write, in its own sub-folders: kept too, and named
    (tmp_path / "checkpoints" / "notes.txt").write_text("mine")
    (tmp_path / "samples" / "holiday.png").write_bytes(b"mine")
    caplog.set_level("INFO")
    main(["fit", "--config", str(TINY), *QUIET, "--overwrite", "true", "--trainer.max_steps", "1",
          "--trainer.limit_val_batches", "0", "--trainer.default_root_dir", str(tmp_path)])  # fmt: skip
    # no last-v1.ckpt beside it
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.ckpt", "notes.txt"]
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 1
    assert "overwrite: true" in (tmp_path / "tensorboard" / "config.yaml").read_text()
    assert (tmp_path / "samples" / "step_000000.png").read_bytes() != b"png"
    assert (tmp_path / "predictions").is_dir() and not (tmp_path / LOCK_NAME).exists()
    assert (tmp_path / "checkpoints" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "samples" / "holiday.png").read_bytes() == b"mine"
    assert (
        f"--overwrite true: set the earlier run's 4 files aside in {tmp_path / SET_ASIDE} until this fit writes its "
        "first checkpoint (then they are deleted; if it fails before, they are put back); kept 2 files the earlier "
        f"run did not write (not in {MANIFEST_NAME} with their sha256): checkpoints/notes.txt, samples/holiday.png"
        in caplog.text
    )
    assert (
        f"--overwrite true: this fit wrote its first checkpoint; deleted the earlier run's 4 files set aside in "
        f"{tmp_path / SET_ASIDE}" in caplog.text
    )
    assert not (tmp_path / SET_ASIDE).exists()
    # the new run's files are recorded as it wrote them: a later --overwrite may set them aside
    manifest = Manifest.read(tmp_path)
    assert "checkpoints/last.ckpt" in manifest and all(manifest.verified(rel) for rel in manifest)
    assert "checkpoints/notes.txt" not in manifest and not (tmp_path / "tensorboard" / "m_tree-k2_mean_r").exists()


def test_overwrite_keeps_and_names_every_file_no_fit_recorded_in_sub_folders_too(tmp_path: Path, caplog) -> None:
    # once deleted by name: *.ckpt, event files and step_*.png, at any depth, none of them named
    from lit_treegrpo.cli import main

    _old_run(tmp_path)
    theirs = {
        "checkpoints/keep_me.ckpt": b"a checkpoint of the user's",
        "checkpoints/archive/old/last.ckpt": b"an archived run",
        "tensorboard/other_exp/events.out.tfevents.1.other": b"another experiment's curves",
        "samples/step_vacation.png": b"a holiday picture",
        "samples/notes.txt": b"listed in the manifest by hand, with a made-up hash",
    }
    for rel, data in theirs.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    manifest = Manifest.read(tmp_path)
    manifest.entries["samples/notes.txt"] = {"sha256": "0" * 64, "bytes": len(theirs["samples/notes.txt"])}
    (tmp_path / "tensorboard" / "config.yaml").write_text("the earlier run's record, edited since\n")
    manifest.save()
    caplog.set_level("INFO")
    main(["fit", "--config", str(TINY), *QUIET, "--overwrite", "true", "--trainer.max_steps", "1",
          "--trainer.limit_val_batches", "0", "--trainer.default_root_dir", str(tmp_path)])  # fmt: skip
    assert {rel: (tmp_path / rel).read_bytes() for rel in theirs} == theirs
    assert (tmp_path / "tensorboard" / "config-2.yaml").exists()  # the edited record stayed: the new one beside it
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("--overwrite true: set"))
    assert "set the earlier run's 3 files aside" in line, line
    assert "; kept 6 files the earlier run did not write" in line, line
    for rel in [*theirs, "tensorboard/config.yaml"]:
        assert rel in line, (rel, line)


def _failing_fit(root: Path, monkeypatch, capsys, *args: str, code: int) -> str:
    return _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--overwrite", "true", *args,
                       "--trainer.limit_val_batches", "0", "--trainer.default_root_dir", str(root), code=code)  # fmt: skip


def test_overwrite_puts_the_old_run_back_when_the_new_fit_fails_before_its_first_checkpoint(
    tmp_path: Path, capsys, monkeypatch, caplog
) -> None:
    # the old run was deleted before the new one had trained: a refused tree left an empty folder
    before = _old_run(tmp_path)
    (tmp_path / "samples" / "holiday.png").write_bytes(b"the user's")
    before = snapshot(tmp_path)
    caplog.set_level("INFO")
    # past the work bound raised knowingly, so that the model loads and the memory guard refuses it
    big = ("--model.tree.branching", "1000000", "--model.work_limit.max_evaluations", str(10**13))
    line = _failing_fit(tmp_path, monkeypatch, capsys, *big, code=2)
    assert line.startswith("error: memory guard: one rollout needs about"), line
    assert snapshot(tmp_path) == before
    assert (
        f"--overwrite true: this fit stopped before its first checkpoint; put the earlier run's 4 files back in {tmp_path}"
        in caplog.text
    )
    # one that failed after it trained and wrote (a grid, curves, its config record): those go, the old run comes back
    caplog.clear()
    nan = '{"class_path": "tests.probes.FlakyReward", "init_args": {"nan_on": [1]}}'
    line = _failing_fit(tmp_path, monkeypatch, capsys, "--model.reward", nan, code=1)
    assert line.startswith("error: reward 'flaky' gave non-finite scores"), line
    assert snapshot(tmp_path) == before and not (tmp_path / SET_ASIDE).exists()
    said = next(r.getMessage() for r in caplog.records if "stopped before its first checkpoint" in r.getMessage())
    assert said.startswith(
        f"--overwrite true: this fit stopped before its first checkpoint; put the earlier run's 4 files back in "
        f"{tmp_path} and removed the "
    ), said


def test_overwrite_refuses_files_in_its_way_that_no_fit_recorded_before_anything_loads(
    tmp_path: Path, capsys, monkeypatch, no_model
) -> None:
    # a run from before manifests, or a last.ckpt replaced by hand: it would be written over (or beside)
    before = _old_run(tmp_path, recorded=False)
    line = _failing_fit(tmp_path, monkeypatch, capsys, code=2)
    assert line.startswith(
        f"error: --overwrite true: {tmp_path} holds checkpoints/last.ckpt, samples/step_000000.png, where the new run "
        f"writes, and they are not recorded in {tmp_path / MANIFEST_NAME} as written by a fit there"
    ), line
    assert "move them away yourself (or train into another --trainer.default_root_dir) and run again" in line
    assert snapshot(tmp_path) == before


_KILLED_OVERWRITE = """
import os, signal, sys
from pathlib import Path
from lit_treegrpo.artifacts.run_folder import RunLock, clear_run
root = Path(sys.argv[1])
lock = RunLock(root)
lock.acquire()
clear_run(root)
for rel in sys.argv[2:]:  # what the new fit wrote before it was killed
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(b"the killed fit's")
os.kill(os.getpid(), signal.SIGKILL)
"""


def _kill_an_overwrite(root: Path, *written: str) -> None:
    done = subprocess.run([sys.executable, "-c", _KILLED_OVERWRITE, str(root), *written], cwd=REPO, timeout=300,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == -9, done.stderr[-2000:]
    assert (root / SET_ASIDE).is_dir()


def test_an_overwrite_killed_before_its_first_checkpoint_is_put_back_by_the_next_fit(tmp_path: Path, caplog) -> None:
    before = _old_run(tmp_path)
    _kill_an_overwrite(tmp_path, "tensorboard/new_run/events.out.tfevents.2.host")
    caplog.set_level("INFO")
    run_folder.check_new_run(tmp_path, "last", False)  # a resume: it finds last.ckpt again
    assert {k: v for k, v in snapshot(tmp_path).items() if "new_run" not in k} == before
    assert f"put back in {tmp_path} the earlier run's 4 files that a fit with --overwrite true set aside" in caplog.text
    # one whose new files lie where the earlier run's go back: refused, nothing removed
    _kill_an_overwrite(tmp_path, "samples/step_000000.png")
    with pytest.raises(RunFolderError, match="samples/step_000000.png cannot go back, as files of the same names"):
        run_folder.check_new_run(tmp_path, None, True)
    assert (tmp_path / "samples" / "step_000000.png").read_bytes() == b"the killed fit's"
    assert (tmp_path / SET_ASIDE / "samples" / "step_000000.png").read_bytes() == before["samples/step_000000.png"]


def test_a_checkpoint_is_replaced_by_the_checkpoint_callback_only_if_a_fit_recorded_it(tmp_path: Path) -> None:
    _old_run(tmp_path)
    manifest = Manifest.read(tmp_path)
    for name in ("epoch=0-step=3.ckpt", "epoch=1-step=6.ckpt"):
        (tmp_path / "checkpoints" / name).write_bytes(b"top-k")
        manifest.record(f"checkpoints/{name}")
    manifest.save()
    (tmp_path / "checkpoints" / "epoch=1-step=6.ckpt").write_bytes(b"replaced by hand")
    lock = RunLock(tmp_path)
    lock.acquire()  # a fit resumed there, whose ModelCheckpoint replaces both
    try:
        assert run_folder.remove_checkpoint(tmp_path / "checkpoints" / "epoch=0-step=3.ckpt") is True
        assert run_folder.remove_checkpoint(tmp_path / "checkpoints" / "epoch=1-step=6.ckpt") is False
    finally:
        lock.release()
    assert run_folder.remove_checkpoint(tmp_path / "checkpoints" / "last.ckpt") is None  # no fit holds the folder
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["epoch=1-step=6.ckpt", "last.ckpt"]


def test_overwrite_refuses_a_run_sub_folder_that_is_a_link_before_any_model_loads(
    tmp_path: Path, capsys, monkeypatch, no_model
) -> None:
    root, target = tmp_path / "run", tmp_path / "big_disk"
    _old_run(root)
    (root / "checkpoints").rename(target)
    (root / "checkpoints").symlink_to(target)
    before, kept = snapshot(root), snapshot(target)
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--overwrite", "true",
                       "--trainer.default_root_dir", str(root))  # fmt: skip
    assert line.startswith(
        f"error: --overwrite true: {root / 'checkpoints'} is a symbolic link (to {target}); this project removes only "
        "what it wrote in its own folders, never through a link"
    ), line
    assert snapshot(root) == before and snapshot(target) == kept and (root / "checkpoints").is_symlink()


def test_a_new_fit_over_an_earlier_fits_outputs_without_a_checkpoint_is_refused(
    tmp_path: Path, capsys, monkeypatch, no_model
) -> None:
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "step_000000.png").write_bytes(b"an earlier fit's grid")
    (tmp_path / "samples" / "holiday.png").write_bytes(b"the user's")
    before = snapshot(tmp_path)
    line = _main_error(
        monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--trainer.default_root_dir", str(tmp_path)
    )
    assert line.startswith(
        f"error: --trainer.default_root_dir: {tmp_path} holds an earlier fit's outputs "
        f"({tmp_path / 'samples' / 'step_000000.png'}) but no checkpoint to resume, and a new fit would write over "
        "them; train into another --trainer.default_root_dir, or pass --overwrite true"
    ), line
    assert snapshot(tmp_path) == before
    (tmp_path / "samples" / "step_000000.png").unlink()
    run_folder.check_new_run(tmp_path, None, False)  # a folder of the user's own files only: nothing to write over


@pytest.mark.parametrize("command", ["fit", "validate", "predict", "export"])
@pytest.mark.parametrize("root", ["", "  "])
def test_an_empty_root_dir_is_refused_and_nothing_is_written_anywhere(
    tmp_path: Path, capsys, monkeypatch, no_model, command: str, root: str
) -> None:
    monkeypatch.chdir(tmp_path)  # '' was the working directory: checkpoints in ./runs, grids in ./samples
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "step_000000.png").write_bytes(b"the user's")
    before = snapshot(tmp_path)
    extra = ["--out", str(tmp_path / "export")] if command == "export" else []
    line = _main_error(monkeypatch, capsys, command, "--config", str(TINY), *QUIET, *extra,
                       "--trainer.default_root_dir", root)  # fmt: skip
    assert line.startswith("error: --trainer.default_root_dir: empty; give the run's folder"), line
    assert snapshot(tmp_path) == before


def test_overwrite_with_a_checkpoint_to_resume_is_refused(tmp_path: Path, capsys, monkeypatch, no_model) -> None:
    before = _old_run(tmp_path)
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--overwrite", "true", "--ckpt_path", "last",
                       "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert line.startswith(
        "error: --overwrite true starts a new run, --ckpt_path last resumes one; give only one of them"
    ), line
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
    assert list(config.parent.rglob("events.out.tfevents.*")), "validate logged nothing"


def test_config_records_are_numbered_and_never_replaced(tmp_path: Path) -> None:
    assert write_new_record(tmp_path, "first\n").name == "config.yaml"
    assert write_new_record(tmp_path, "second\n").name == "config-2.yaml"
    (tmp_path / "config-3.yaml").write_text("written by someone else\n")
    assert write_new_record(tmp_path, "fourth\n").name == "config-4.yaml"
    assert [(tmp_path / n).read_text() for n in ("config.yaml", "config-2.yaml", "config-3.yaml", "config-4.yaml")] == [
        "first\n",
        "second\n",
        "written by someone else\n",
        "fourth\n",
    ]


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
        line = _main_error(
            monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--trainer.default_root_dir", str(tmp_path)
        )
    finally:
        lock.release()
    assert line.startswith(
        f"error: --trainer.default_root_dir: {tmp_path} is in use by another fit (pid {os.getpid()}, lock "
    ), line
    assert "wait for it to end or stop it, or train into another --trainer.default_root_dir" in line
    assert list(tmp_path.iterdir()) == []


def test_a_killed_fits_lock_is_taken_over(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path / LOCK_NAME)], stdout=subprocess.PIPE, text=True
    )
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


LAUNCH_VARIABLES = ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE",
                    "MASTER_ADDR", "SLURM_NTASKS", "JSM_NAMESPACE_SIZE")  # fmt: skip


def test_the_ranks_a_launcher_starts_beside_rank_0_leave_the_folder_to_it(monkeypatch) -> None:
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert run_folder.launch_rank() == 0
    # Lightning's DDP launcher (and torchrun) set WORLD_SIZE and MASTER_ADDR beside the ranks
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert run_folder.launch_rank() == 1
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("NODE_RANK", "2")
    assert run_folder.launch_rank() == 2
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_NTASKS", "4")  # srun's tasks
    monkeypatch.setenv("SLURM_PROCID", "3")
    assert run_folder.launch_rank() == 3


@pytest.mark.parametrize("stray", [{"RANK": "1"}, {"LOCAL_RANK": "1"}, {"RANK": "3", "WORLD_SIZE": "4"},
                                   {"SLURM_PROCID": "1", "SLURM_NTASKS": "1"}])  # fmt: skip
def test_a_rank_variable_no_launcher_set_is_ignored_and_said(monkeypatch, caplog, stray: dict[str, str]) -> None:
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in stray.items():
        monkeypatch.setenv(name, value)
    caplog.set_level("INFO")
    assert run_folder.launch_rank() == 0  # the process takes the lock and makes the checks
    name = next(n for n in ("RANK", "SLURM_PROCID", "LOCAL_RANK") if n in stray)
    assert (
        f"{name}={stray[name]} in the environment, but no launcher started this process beside others (no "
        "WORLD_SIZE > 1 with MASTER_ADDR, no SLURM_NTASKS > 1): ignored, this fit runs as the only process (rank 0)"
    ) in caplog.text


def test_a_stray_rank_does_not_let_a_fit_write_beside_a_run_or_past_the_lock(
    tmp_path: Path, capsys, monkeypatch, no_model
) -> None:
    # RANK=1 once skipped the run check and the lock: the fit wrote last-v1.ckpt beside the run
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "1")
    before = _old_run(tmp_path)
    line = _main_error(
        monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--trainer.default_root_dir", str(tmp_path)
    )
    assert line.startswith(f"error: --trainer.default_root_dir: {tmp_path} already holds a run"), line
    assert snapshot(tmp_path) == before
    lock = RunLock(tmp_path / "live")
    lock.acquire()  # a fit writing there: a second one is refused, whatever its rank variables say
    try:
        monkeypatch.setenv("LOCAL_RANK", "1")
        line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET,
                           "--trainer.default_root_dir", str(tmp_path / "live"))  # fmt: skip
    finally:
        lock.release()
    assert line.startswith(f"error: --trainer.default_root_dir: {tmp_path / 'live'} is in use by another fit"), line


def _symlinked_lock(tmp_path: Path) -> tuple[Path, Path]:
    """A run folder whose ``.fit.lock`` is a symbolic link to another file (``victim``)."""
    victim = tmp_path / "notes.txt"
    victim.write_text("someone's notes\n")
    root = tmp_path / "run"
    root.mkdir()
    (root / LOCK_NAME).symlink_to(victim)
    return root, victim


def test_a_fit_refuses_a_lock_that_is_a_symbolic_link_and_leaves_its_target(
    tmp_path: Path, capsys, monkeypatch, no_model
) -> None:
    root, victim = _symlinked_lock(tmp_path)
    line = _main_error(
        monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--trainer.default_root_dir", str(root)
    )
    lock = root / LOCK_NAME
    assert line.startswith(
        f"error: --trainer.default_root_dir: the fit lock {lock} is a symbolic link, and a fit writes "
        f"its PID into its lock; delete the link {lock} (the file it points to stays) and run again"
    ), line
    assert victim.read_text() == "someone's notes\n"  # not truncated, no PID written into it
    assert lock.is_symlink() and sorted(p.name for p in root.iterdir()) == [LOCK_NAME]


@pytest.mark.parametrize("kind", ["dangling symbolic link", "hard link", "FIFO", "folder"])
def test_the_lock_is_only_ever_a_regular_file_of_its_own(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "run"
    root.mkdir()
    lock = root / LOCK_NAME
    victim = tmp_path / "victim"
    if kind == "dangling symbolic link":  # O_CREAT through it would create the file it names
        lock.symlink_to(victim)
        message = "is a symbolic link"
    elif kind == "hard link":  # another name of a file: truncating the lock would empty it
        victim.write_text("someone's notes\n")
        os.link(victim, lock)
        message = "is a hard link (one of 2 names of one file), and a fit writes its PID into its lock; delete the name"
    elif kind == "FIFO":
        os.mkfifo(lock)
        message = "is no regular file (a FIFO, socket or device)"
    else:
        lock.mkdir()
        message = "is a folder, and a fit writes its PID into its lock; move"
    with pytest.raises(RunFolderError, match=f"the fit lock {lock} {message}".replace("(", r"\(").replace(")", r"\)")):
        RunLock(root).acquire()
    assert victim.read_text() == "someone's notes\n" if kind == "hard link" else not victim.exists()
    assert os.path.lexists(lock)  # left for the user to look at


# --- the last steps of a fit are saved; a moved or copied run folder resumes into its own last.ckpt ---

OFF_SCHEDULE = ("--trainer.val_check_interval", "3", "--trainer.enable_model_summary", "false",
                "--trainer.enable_progress_bar", "false")  # fmt: skip


def _fit(root: Path, *args: str) -> None:
    from lit_treegrpo.cli import main

    main(["fit", "--config", str(TINY), *OFF_SCHEDULE, *args, "--trainer.default_root_dir", str(root)])


def _saved(path: Path) -> tuple[int, int]:
    """The optimizer steps and training iterations a checkpoint holds."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    return checkpoint["global_step"], checkpoint["lit_treegrpo"]["iteration"]


class _LastWrites:
    """Records each write of a ``last.ckpt`` (optimizer steps, iteration) through the CLI's
    checkpoint IO."""

    def __init__(self, monkeypatch) -> None:
        from lit_treegrpo.artifacts.checkpoint import AtomicCheckpointIO

        self.writes: list[tuple[int, int]] = []
        save = AtomicCheckpointIO.save_checkpoint

        def recording(io, checkpoint, path, storage_options=None):
            if Path(path).name == "last.ckpt":
                self.writes.append((checkpoint["global_step"], checkpoint["lit_treegrpo"]["iteration"]))
            save(io, checkpoint, path, storage_options)

        monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", recording)


@pytest.fixture(scope="module")
def stopped_off_schedule(tmp_path_factory) -> tuple[Path, list[tuple[int, int]]]:
    """A fit of 5 steps validated every 3 (its last validation, and save, at step 3), and the
    writes of its last.ckpt. Tests only read it (or copy it)."""
    root = tmp_path_factory.mktemp("off_schedule") / "run"
    with pytest.MonkeyPatch.context() as monkeypatch:
        writes = _LastWrites(monkeypatch)
        _fit(root, "--trainer.max_steps", "5")
    return root, writes.writes


def test_the_last_steps_of_a_fit_are_saved_whatever_the_validation_schedule(stopped_off_schedule) -> None:
    root, writes = stopped_off_schedule
    assert _saved(root / "checkpoints" / "last.ckpt") == (5, 5)  # not the validation's step 3
    assert writes == [(3, 3), (5, 5)]
    assert sorted(p.name for p in (root / "checkpoints").iterdir()) == ["epoch=0-step=3.ckpt", "last.ckpt"]


def test_a_fit_whose_last_step_saved_writes_no_second_checkpoint(tmp_path: Path, monkeypatch) -> None:
    writes = _LastWrites(monkeypatch)
    _fit(tmp_path, "--trainer.max_steps", "6")
    assert writes.writes == [(3, 3), (6, 6)]  # the validation at step 6 saved it; nothing more at the end
    assert _saved(tmp_path / "checkpoints" / "last.ckpt") == (6, 6)


def test_a_fit_whose_last_iteration_took_no_optimizer_step_saves_that_iteration(tmp_path: Path) -> None:
    # --max_iterations stops through should_stop, which makes Lightning validate and ModelCheckpoint
    # save, unless no optimizer step was taken since its last save: here the last iteration's step
    # is skipped (its reward raises), which still moves the iteration, the faults and the prompts.
    # Reward calls: the sanity check, the base model's validation, iterations 1-3, the validation
    # after 3, iteration 4 (raises), ...
    flaky = '{"class_path": "tests.probes.FlakyReward", "init_args": {"raise_on": [6]}}'
    _fit(tmp_path, "--max_iterations", "4", "--model.reward", flaky, "--model.faults.nonfinite", "skip",
         "--trainer.callbacks=[]")  # fmt: skip
    assert _saved(tmp_path / "checkpoints" / "last.ckpt") == (3, 4)  # 3 optimizer steps in 4 iterations
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["lit_treegrpo"]
    assert saved["faults"]["skipped_steps"] == 1


def test_a_fit_stopped_by_max_time_saves_its_final_state(tmp_path: Path, monkeypatch) -> None:
    # Lightning's Timer reads a clock that shows the iterations done as seconds, so the 5 s limit
    # stops the fit after iteration 5 (off the validation schedule) whatever the machine's speed.
    # A stop through should_stop also makes Lightning validate (and save) when a step was trained
    # since the last save; this checks the documented outcome, whichever of the two writes it
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import timer

    from lit_treegrpo.training.module import TreeGRPOModule

    fitting: list[TreeGRPOModule] = []
    on_fit_start = TreeGRPOModule.on_fit_start

    def recording(module: TreeGRPOModule) -> None:
        fitting.append(module)
        on_fit_start(module)

    monkeypatch.setattr(TreeGRPOModule, "on_fit_start", recording)
    monkeypatch.setattr(
        timer, "time", SimpleNamespace(monotonic=lambda: float(fitting[-1].iteration if fitting else 0))
    )
    _fit(tmp_path, "--trainer.max_time", "00:00:00:05")
    assert _saved(tmp_path / "checkpoints" / "last.ckpt") == (5, 5)


def test_export_after_a_fit_exports_its_final_iteration(stopped_off_schedule, tmp_path: Path) -> None:
    import json

    from lit_treegrpo.cli import main

    root, _ = stopped_off_schedule
    main(["export", "--config", str(TINY), "--trainer.default_root_dir", str(root), "--out", str(tmp_path / "lora")])
    card = json.loads((tmp_path / "lora" / "export.json").read_text())
    assert card["iterations"] == 5 and card["optimizer_steps"] == 5


def _checkpoint_state(path: Path) -> dict:
    """The ModelCheckpoint state a checkpoint holds."""
    states = torch.load(path, map_location="cpu", weights_only=False)["callbacks"]
    (state,) = [v for k, v in states.items() if k.startswith("ModelCheckpoint")]
    return state


@pytest.mark.parametrize("how", ["mv", "cp -a"])
def test_a_moved_or_copied_run_folder_resumes_into_its_own_last_ckpt(
    stopped_off_schedule, tmp_path: Path, how: str
) -> None:
    if how == "mv":  # a run of its own, so that its old folder is gone
        old = tmp_path / "A"
        _fit(old, "--trainer.max_steps", "5")
    else:
        old = stopped_off_schedule[0]
    before = snapshot(old)
    new = tmp_path / "B"
    subprocess.run([*how.split(), str(old), str(new)], check=True)
    _fit(new, "--trainer.max_steps", "7", "--ckpt_path", "last")  # validated (and saved) at 6, saved at 7
    folder = new / "checkpoints"
    # last.ckpt itself holds the resumed run, no last-v1.ckpt beside it; the top-k file of the
    # run's step 3 is replaced by step 6's, as in a folder that was never moved
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=1-step=6.ckpt", "last.ckpt"]
    assert _saved(folder / "last.ckpt") == (7, 7)
    state = _checkpoint_state(folder / "last.ckpt")
    assert (
        Path(state["dirpath"]) == folder.resolve() and Path(state["last_model_path"]) == folder.resolve() / "last.ckpt"
    )
    if how == "mv":
        assert not old.exists()
    else:
        assert snapshot(old) == before  # the original run untouched


@pytest.mark.slow  # two real DDP processes, twice: over a minute on 2 cores
def test_ddp_saves_the_last_steps_and_resumes_a_moved_folder_into_its_own_last_ckpt(tmp_path: Path) -> None:
    # the end-of-fit save is a collective (every rank runs it) and so is the resumed run's
    from tests.cli.test_cli import fit

    ddp = ("--trainer.strategy", "ddp", "--trainer.devices", "2", "--data.batch_size", "1", *OFF_SCHEDULE)
    fit(tmp_path / "A", "--trainer.max_steps", "5", *ddp)
    assert _saved(tmp_path / "A" / "checkpoints" / "last.ckpt") == (5, 5)
    (tmp_path / "A").rename(tmp_path / "B")
    fit(tmp_path / "B", "--trainer.max_steps", "7", "--ckpt_path", "last", *ddp)
    folder = tmp_path / "B" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=1-step=6.ckpt", "last.ckpt"]
    assert _saved(folder / "last.ckpt") == (7, 7)


def test_the_run_name_says_what_trains() -> None:
    from types import SimpleNamespace

    from lit_treegrpo.artifacts.run_folder import run_name
    from lit_treegrpo.core import TreeSpec
    from lit_treegrpo.models.shapes import ShapesAdapter
    from lit_treegrpo.rewards import Brightness
    from lit_treegrpo.training.settings import AdvantageSettings

    def module(tree: TreeSpec, method: str = "mean") -> SimpleNamespace:
        adapter = ShapesAdapter.__new__(ShapesAdapter)  # only its class is read
        return SimpleNamespace(
            adapter=adapter, tree=tree, advantage=AdvantageSettings(method=method), reward=Brightness()
        )

    tree = TreeSpec(branch_steps=(0, 1, 2), branching=3)
    assert run_name(module(tree)) == "shapes_tree-k3_mean_brightness"
    flat = TreeSpec(sde_steps=tuple(range(8)), branching=1, num_trees=27)
    assert run_name(module(flat, "logprob_softmax")) == "shapes_flat-27x8sde_logprob_softmax_brightness"


def test_events_go_under_the_run_name_unless_an_older_run_wrote_beside_the_records(tmp_path: Path) -> None:
    from lit_treegrpo.artifacts.run_folder import RunTensorBoardLogger, event_folder

    def log_once(root: Path) -> None:
        logger = RunTensorBoardLogger(save_dir=str(root), name="tensorboard", version="", run_name="m_tree-k2_mean_r")
        logger.log_metrics({"x": 1.0}, step=0)
        logger.finalize("success")

    log_once(tmp_path / "new")
    assert [p.parent.name for p in (tmp_path / "new" / "tensorboard").rglob("events.out.tfevents.*")] == [
        "m_tree-k2_mean_r"
    ]
    assert event_folder(tmp_path / "new" / "tensorboard").name == "m_tree-k2_mean_r"
    old = tmp_path / "old" / "tensorboard"  # a run folder from before runs were named: its curves go on there
    old.mkdir(parents=True)
    (old / "events.out.tfevents.1.host").write_bytes(b"")
    log_once(tmp_path / "old")
    assert not any(p.is_dir() for p in old.iterdir()) and len(list(old.glob("events.out.tfevents.*"))) == 2
    assert event_folder(old) == old
