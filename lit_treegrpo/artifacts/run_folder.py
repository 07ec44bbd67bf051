"""What a fit may do to its run folder (``--trainer.default_root_dir``): nothing it did not write.

- :func:`check_new_run`: a fit without ``--ckpt_path`` into a folder that already holds
  ``checkpoints/last.ckpt`` is refused. Lightning would otherwise write ``last-v1.ckpt`` beside the
  old ``last.ckpt``, and a later ``--ckpt_path last`` would resume the *older* run. So is one into
  a folder holding an earlier fit's outputs without a checkpoint (a fit stopped before it saved):
  its sample grids would be written over. ``--overwrite true`` starts over there instead, deleting
  the old run's outputs (:func:`clear_run`): only the files a fit writes (:data:`RUN_OUTPUT_NAMES`),
  through :mod:`lit_treegrpo.common.files`, never through a link (a sub-folder that is a symbolic
  link is refused before anything loads); files of other names stay, and are named.
- :class:`RunLock`: one live fit per folder. ``<root>/.fit.lock`` holds the writer's PID under an
  advisory ``flock``, which the kernel drops when the process dies however it dies, so the lock
  of a killed fit is taken over by the next one; where the filesystem has no ``flock`` the PID
  itself decides (a dead PID's lock is taken over). The lock is opened without following a link
  and only as a regular file of its own: a ``.fit.lock`` that is a symbolic or hard link (or a
  folder, FIFO, ...) is refused, never truncated, so the file behind it is left as it was.
- :class:`RunConfigRecord`: the fit's configuration is saved once its first training step has
  completed (or its first checkpoint is written), never over an earlier record: ``config.yaml``
  for the first fit in the folder, ``config-2.yaml``, ``config-3.yaml``, ... for each later
  (resumed) one. ``validate`` / ``test`` / ``predict`` save none, and a command that fails before
  training writes no record.
- :class:`RunTensorBoardLogger`: opens its event file when something is first logged, not when
  a command starts, so that a command stopped or refused before that leaves no empty event file;
  the file lies in ``<root>/tensorboard/<run name>/``, the name saying what ran (:func:`run_name`),
  so that TensorBoard lists the run by it. :func:`event_folder` finds it.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from typing_extensions import override

from ..common.files import NotWrittenHere, check_no_link, clear_written, remove_empty_folder, remove_written

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; no lock is taken there
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".fit.lock"
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # POSIX; elsewhere RunLock._open checks for a link first
#: the outputs of a fit that ``--overwrite true`` deletes before a new run starts in the folder
RUN_OUTPUTS = ("checkpoints", "tensorboard", "samples")
#: the names a fit writes in each of :data:`RUN_OUTPUTS` (sub-folders included): only these are
#: deleted; checkpoints (Lightning's ``*.ckpt`` and the atomic writer's ``.last.ckpt.<pid>.tmp``),
#: TensorBoard's event files, hyper-parameters and the config records, the sample grids and trees
RUN_OUTPUT_NAMES = {
    "checkpoints": ("*.ckpt", ".*.tmp"),
    "tensorboard": ("events.out.tfevents.*", "config.yaml", "config-*.yaml", "hparams.yaml"),
    "samples": ("step_*.png", "step_*.gif", "tree_*.png"),
}


class RunFolderError(Exception):
    """The run folder cannot be used by this command (one line: the folder, why, the ways forward)."""


def check_new_run(root: Path, ckpt_path: str | None, overwrite: bool) -> None:
    """Refuse a fit that would start a second run on top of the one already in ``root``, or write
    over an earlier fit's outputs; with ``overwrite``, one whose run sub-folder is a link."""
    if overwrite and ckpt_path is not None:
        # --ckpt_path last is inside what --overwrite deletes; any other resumes a run, not a new one
        raise RunFolderError(
            f"--overwrite true starts a new run, --ckpt_path {ckpt_path} resumes one; give only one of them"
        )
    if overwrite:
        for name in RUN_OUTPUTS:
            try:
                check_no_link(root / name, root)
            except NotWrittenHere as err:
                raise RunFolderError(f"--overwrite true: {err}") from None
        return
    if ckpt_path is not None:
        return
    outputs = ", ".join(f"{name}/" for name in RUN_OUTPUTS)
    last = root / "checkpoints" / "last.ckpt"
    if last.exists():
        raise RunFolderError(
            f"--trainer.default_root_dir: {root} already holds a run ({last}); resume it with "
            "--ckpt_path last, train into another --trainer.default_root_dir, or pass --overwrite true "
            f"to delete its {outputs} and start over"
        )
    written = earlier_outputs(root)
    if written:
        raise RunFolderError(
            f"--trainer.default_root_dir: {root} holds an earlier fit's outputs ({written[0]}"
            f"{f' and {len(written) - 1} more' if len(written) > 1 else ''}) but no checkpoint to resume, and a "
            "new fit would write over them; train into another --trainer.default_root_dir, or pass "
            f"--overwrite true to delete the files a fit writes in its {outputs} and start over"
        )


def earlier_outputs(root: Path) -> list[Path]:
    """The files of ``root`` that a new fit would write over: checkpoints, sample grids and trees
    (:data:`RUN_OUTPUT_NAMES`; TensorBoard's event files and the config records are new files for
    every command, so a ``validate`` before the first fit leaves nothing in the way)."""
    found: list[Path] = []
    for name in ("checkpoints", "samples"):
        patterns, folder = RUN_OUTPUT_NAMES[name], root / name
        if folder.is_dir():
            found += sorted(
                p for p in folder.rglob("*") if p.is_file() and any(p.match(pattern) for pattern in patterns)
            )
    return found


def clear_run(root: Path) -> list[Path]:
    """Delete the outputs of an earlier fit in ``root`` (``--overwrite true``): the files a fit
    writes in its run sub-folders, then the folders left empty; returns the files kept (other
    names, links), which a fit did not write."""
    kept: list[Path] = []
    for name in RUN_OUTPUTS:
        try:
            kept += clear_written(root / name, root=root, names=RUN_OUTPUT_NAMES[name])
        except NotWrittenHere as err:  # a link made since the check before the model loaded
            raise RunFolderError(f"--overwrite true: {err}") from None
    if kept:
        shown = ", ".join(str(p) for p in kept[:3]) + (" ..." if len(kept) > 3 else "")
        rank_zero_info(
            f"--overwrite true: deleted the earlier run's outputs in {root}; kept {len(kept)} file(s) a fit "
            f"does not write: {shown}"
        )
    return kept


def launch_rank() -> int:
    """The global rank this process was launched as: non-zero for the processes that Lightning's
    DDP launcher, ``torchrun`` or SLURM start beside rank 0, which must leave the folder to it."""
    for name in ("RANK", "SLURM_PROCID", "NODE_RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "0")
        if value.isdigit() and int(value) != 0:
            return int(value)
    return 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _read_pid(fd: int) -> int | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 64).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def _not_regular(mode: int) -> str | None:
    """What a file of ``mode`` is when it is no regular file (``None`` when it is one)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "no regular file (a FIFO, socket or device)"


class RunLock:
    """``<root>/.fit.lock`` while a fit writes into ``root`` (see the module docstring).

    :meth:`acquire` creates ``root`` if needed (``OSError`` when it cannot: a file in the way, no
    permission) and raises :class:`RunFolderError` naming the PID of a live holder, or when the
    lock's name is taken by a link or by no regular file (:meth:`_open`). :meth:`release`
    removes the lock file and the folders that :meth:`acquire` created, if they are still empty,
    so that a command that failed before writing anything leaves no trace.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.path = self.root / LOCK_NAME
        self._fd: int | None = None
        self._created: list[Path] = []

    def acquire(self) -> None:
        missing = [p for p in (self.root, *self.root.parents) if not p.exists()]  # deepest first
        self.root.mkdir(parents=True, exist_ok=True)
        self._created = missing
        try:
            fd = self._open_locked()
        except BaseException:
            self._remove_created()
            raise
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def _open_locked(self) -> int:
        while True:
            fd = self._open()
            try:
                self._lock(fd)
                # a holder that released meanwhile unlinked the file we opened: lock the new one
                if os.path.lexists(self.path) and os.fstat(fd).st_ino == os.lstat(self.path).st_ino:
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    def _open(self) -> int:
        """Open (or create) the lock file itself, never what a link there points to: a fit writes
        its PID into its lock, which through a symbolic or hard link would overwrite another file."""
        if not _O_NOFOLLOW and os.path.islink(self.path):  # no O_NOFOLLOW on this platform
            raise RunFolderError(self._not_a_lock("a symbolic link"))
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _O_NOFOLLOW, 0o644)
        except OSError:
            # O_NOFOLLOW refuses a link (ELOOP on Linux and macOS); a folder or socket cannot be opened
            what = _not_regular(os.lstat(self.path).st_mode) if os.path.lexists(self.path) else None
            if what is not None:
                raise RunFolderError(self._not_a_lock(what)) from None
            raise
        info = os.fstat(fd)
        what = _not_regular(info.st_mode)
        if what is None and info.st_nlink > 1:
            what = f"a hard link (one of {info.st_nlink} names of one file)"
        if what is not None:
            os.close(fd)
            raise RunFolderError(self._not_a_lock(what))
        return fd

    def _not_a_lock(self, what: str) -> str:
        if what == "a symbolic link":
            fix = f"delete the link {self.path} (the file it points to stays)"
        elif what.startswith("a hard link"):
            fix = f"delete the name {self.path} (the file's other names stay)"
        else:
            fix = f"move {self.path} away"
        return (
            f"--trainer.default_root_dir: the fit lock {self.path} is {what}, and a fit writes its PID into its "
            f"lock; {fix} and run again"
        )

    def _lock(self, fd: int) -> None:
        if fcntl is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                holder = _read_pid(fd)  # no flock on this filesystem: the PID decides
                if holder is None or holder == os.getpid() or not _pid_alive(holder):
                    return
        raise RunFolderError(
            f"--trainer.default_root_dir: {self.root} is in use by another fit (pid {_read_pid(fd)}, "
            f"lock {self.path}); wait for it to end or stop it, or train into another "
            f"--trainer.default_root_dir (if no fit runs there, delete {self.path})"
        )

    def release(self) -> None:
        if self._fd is None:
            return
        remove_written(
            self.path, root=self.root, names=(LOCK_NAME,)
        )  # before closing: nobody may lock it once we let go
        os.close(self._fd)
        self._fd = None
        self._remove_created()

    def _remove_created(self) -> None:
        for folder in self._created:
            if not remove_empty_folder(folder):  # only if still empty
                break
        self._created = []


class RunConfigRecord(SaveConfigCallback):
    """Save a fit's configuration without replacing an earlier one (see the module docstring)."""

    _folder: str | None = None
    written_to: Path | None = None
    """The record this fit wrote (global rank 0), once it has."""

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # the base class writes here, before the checkpoint is restored and checked; only find the
        # folder now (``log_dir`` is a collective call, so every rank makes it)
        if trainer.state.fn == TrainerFn.FITTING and self.save_to_log_dir and self._folder is None:
            self._folder = trainer.log_dir

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._record(trainer, pl_module)

    @override
    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._record(trainer, pl_module)

    def _record(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.already_saved or trainer.state.fn != TrainerFn.FITTING:
            return
        self.already_saved = True
        if not trainer.is_global_zero:
            return
        if self._folder is not None:
            self.written_to = write_new_record(Path(self._folder), self.parser.dump(self.config, skip_none=False))
        self.save_config(trainer, pl_module, "fit")


class _DeferredSummaryWriter:
    """A ``SummaryWriter`` opened by its first use; ``flush`` / ``close`` before that do nothing."""

    def __init__(self, open_writer: Any) -> None:
        self._open_writer = open_writer
        self._writer: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._writer is None:
            if name in ("flush", "close"):
                return lambda *args, **kwargs: None
            self._writer = self._open_writer()
        return getattr(self._writer, name)


def run_name(module: Any) -> str:
    """What a run trains, as TensorBoard lists it: the model, the tree, the advantage estimator and
    the reward, e.g. ``shapes_tree-k3_mean_shapes`` (TreeGRPO's k=3 tree on the Shapes model) or
    ``tinysd3_flat-27x8sde_mean_brightness`` (DanceGRPO's 27 trajectories with 8 SDE steps each).
    None of these may change on resume, so a resumed run keeps its name."""
    model = type(module.adapter).__name__.removesuffix("Adapter").lower() or "model"
    tree = module.tree
    if tree.branch_steps:
        k = tree.branching if isinstance(tree.branching, int) else "-".join(map(str, tree.branching))
        shape = f"tree-k{k}" + (f"x{tree.num_trees}" if tree.num_trees > 1 else "")
    else:
        shape = f"flat-{tree.num_trees}x{len(tree.sde_steps)}sde"
    reward = getattr(module.reward, "name", None) or type(module.reward).__name__.lower()
    name = f"{model}_{shape}_{module.advantage.method}_{reward}"
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name)


def event_folder(tensorboard: Path) -> Path:
    """The folder that holds a run's TensorBoard event files: ``tensorboard/<run name>/``, or
    ``tensorboard`` itself for a run folder written before runs were named."""
    if any(tensorboard.glob("events.out.tfevents.*")):
        return tensorboard
    named = sorted(p for p in tensorboard.iterdir() if p.is_dir()) if tensorboard.is_dir() else []
    return named[0] if len(named) == 1 else tensorboard


class RunTensorBoardLogger(TensorBoardLogger):
    """``TensorBoardLogger`` whose event file is opened when something is first logged. Lightning
    reads ``logger.experiment`` in the setup of every command, which would otherwise create an
    event file before the command has done anything.

    The events go to ``<log_dir>/<run_name>`` (the config records stay in ``log_dir``), unless
    ``log_dir`` already holds event files of a run written before runs were named: its curves go on
    there."""

    def __init__(self, *args: Any, run_name: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_name = run_name

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._experiment is None:
            self._experiment = _DeferredSummaryWriter(self._open_writer)
        return self._experiment

    @override
    @rank_zero_only
    def save(self) -> None:
        # Lightning writes hparams.yaml once, at the first save: an empty one ({}) when the module
        # logs no hyper-parameters (this one saves none); the run's config record is config.yaml
        if self.hparams:
            super().save()
        else:
            self.experiment.flush()

    def _open_writer(self) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        if self.root_dir:
            self._fs.makedirs(self.root_dir, exist_ok=True)
        folder = Path(self.log_dir)
        if self.run_name and not any(folder.glob("events.out.tfevents.*")):
            folder = folder / self.run_name
        return SummaryWriter(log_dir=str(folder), **self._kwargs)


def write_new_record(folder: Path, text: str) -> Path:
    """Write ``text`` to the first free name of ``config.yaml``, ``config-2.yaml``, ... in ``folder``
    (created exclusively, so two writers never share a name)."""
    folder.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        path = folder / ("config.yaml" if n == 1 else f"config-{n}.yaml")
        try:
            with open(path, "x", encoding="utf-8") as f:
                f.write(text)
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")


__all__ = [
    "LOCK_NAME",
    "RUN_OUTPUTS",
    "RunConfigRecord",
    "RunFolderError",
    "RunLock",
    "RunTensorBoardLogger",
    "event_folder",
    "run_name",
    "RUN_OUTPUT_NAMES",
    "check_new_run",
    "clear_run",
    "earlier_outputs",
    "launch_rank",
    "write_new_record",
]
