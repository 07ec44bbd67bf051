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
from lit_treegrpo.artifacts.run_folder import LOCK_NAME, RunFolderError, RunLock, write_new_record
from tests.cli.test_cli import QUIET, TINY, _main_error, snapshot

REPO = Path(__file__).resolve().parents[2]


def _old_run(root: Path) -> dict[str, bytes]:
    """A folder as an earlier fit leaves it (the files' contents do not matter to these checks)."""
    (root / "checkpoints").mkdir(parents=True)
    (root / "checkpoints" / "last.ckpt").write_bytes(b"the trained weights")
    (root / "tensorboard").mkdir()
    (root / "tensorboard" / "config.yaml").write_text("model: {seed: 7}\n")
    (root / "samples").mkdir()
    (root / "samples" / "step_000000.png").write_bytes(b"png")
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
        f"--overwrite true: deleted the earlier run's outputs in {tmp_path}; kept 2 file(s) a fit does not write"
        in (caplog.text)
    )


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


def test_the_ranks_a_launcher_starts_beside_rank_0_leave_the_folder_to_it(monkeypatch) -> None:
    for name in ("RANK", "SLURM_PROCID", "NODE_RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert run_folder.launch_rank() == 0
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert run_folder.launch_rank() == 1
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("NODE_RANK", "2")
    assert run_folder.launch_rank() == 2


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
