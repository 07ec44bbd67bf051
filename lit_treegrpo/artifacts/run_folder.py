"""What a fit may do to its run folder (``--trainer.default_root_dir``): nothing it did not write.

- What a fit wrote is what its manifest says: ``<root>/.lit_treegrpo-written.json``
  (:class:`~lit_treegrpo.common.files.Manifest`) holds the relative path and the sha256 of every
  file the fits in the folder wrote in its run sub-folders (:data:`RUN_OUTPUTS`: checkpoints,
  TensorBoard's event files and config records, sample grids and trees). The fit holding the lock
  records the files it wrote (new or changed since it took the lock, of the names in
  :data:`RUN_OUTPUT_NAMES`) after each checkpoint and when it ends, atomically. A file of those
  names that the manifest does not list with its content (yours, edited, or from a run before
  manifests) is not the project's: it is never deleted or moved.
- :func:`check_new_run`: a fit without ``--ckpt_path`` into a folder that already holds
  ``checkpoints/last.ckpt`` is refused. Lightning would otherwise write ``last-v1.ckpt`` beside the
  old ``last.ckpt``, and a later ``--ckpt_path last`` would resume the *older* run. So is one into
  a folder holding an earlier fit's outputs without a checkpoint (a fit stopped before it saved):
  its sample grids would be written over.
- ``--overwrite true`` starts over there instead (:func:`clear_run`, once the new run's model and
  trainer are built): the earlier run's files that the manifest verifies are *set aside*, renamed
  into ``<root>/.set-aside/`` (:data:`SET_ASIDE`), not deleted; every other file stays where it is
  and is named. When the new fit writes its first checkpoint the set-aside files are deleted; when
  it fails before that, the files it wrote are removed and the earlier run's are put back (said in
  one line). A folder a fit killed in between left behind is put back (or, after the new run's
  first checkpoint, deleted) by the next fit in the folder. A file the manifest does not verify
  where the new run writes (``checkpoints/last.ckpt``, ``samples/step_000000.png``, ...) is refused
  before anything loads: it would be written over, or beside it (``last-v1.ckpt``). Nothing is
  moved or removed through a link (a sub-folder that is one is refused before anything loads).
- :class:`RunLock`: one live fit per folder. ``<root>/.fit.lock`` holds the writer's PID under an
  advisory ``flock``, which the kernel drops when the process dies however it dies, so the lock
  of a killed fit is taken over by the next one; where the filesystem has no ``flock`` the PID
  itself decides (a dead PID's lock is taken over). The lock is opened without following a link
  and only as a regular file of its own: a ``.fit.lock`` that is a symbolic or hard link (or a
  folder, FIFO, ...) is refused, never truncated, so the file behind it is left as it was. Every
  fit takes it but the processes a launcher starts beside rank 0 (:func:`launch_rank`); a rank
  variable in the environment of a process that no launcher started is ignored, and said.
- :class:`RunConfigRecord`: the fit's configuration is saved once its first training step has
  completed (or its first checkpoint is written), never over an earlier record: ``config.yaml``
  for the first fit in the folder, ``config-2.yaml``, ``config-3.yaml``, ... for each later
  (resumed) one. ``validate`` / ``test`` / ``predict`` save none, and a command that fails before
  training writes no record.
- :class:`RunTensorBoardLogger`: opens its event file when something is first logged, not when
  a command starts, so that a command stopped or refused before that leaves no empty event file;
  the file lies in ``<root>/tensorboard/<run name>/``, the name saying what ran (:func:`run_name`),
  so that TensorBoard lists the run by it. :func:`event_folder` finds it. A write it cannot make (a full disk, a
  read-only folder) is one :class:`LogWriteError` naming that folder; ``validate`` / ``test`` raise it after
  their results are printed (``defer_write_failures``).
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from typing_extensions import override

from ..common.errors import WriteError, explain_os_error, write_error
from ..common.files import Manifest, NotWrittenHere, check_no_link
from .locks import LOCK_NAME, FolderLock, RunFolderError, fcntl
from .run_outputs import (
    RUN_OUTPUT_NAMES,
    RUN_OUTPUTS,
    SET_ASIDE,
    RunLock,
    _in_the_way,
    _not_recorded,
    _output_files,
    _written_name,
    checkpoint_saved,
    clear_run,
    delete_set_aside,
    put_back,
    recover_set_aside,
    remove_checkpoint,
)


def check_new_run(root: Path, ckpt_path: str | None, overwrite: bool) -> None:
    """Refuse a fit that would start a second run on top of the one already in ``root``, or write
    over an earlier fit's outputs; with ``overwrite``, one whose run sub-folder is a link, or that
    would write where a file the manifest does not verify lies. An earlier run that a killed
    ``--overwrite`` fit left set aside is first put back (or deleted, see :func:`recover_set_aside`)."""
    if overwrite and ckpt_path is not None:
        # --ckpt_path last is inside what --overwrite sets aside; any other resumes a run, not a new one
        raise RunFolderError(
            f"--overwrite true starts a new run, --ckpt_path {ckpt_path} resumes one; give only one of them"
        )
    if os.path.lexists(root / SET_ASIDE):
        recover_set_aside(root)
    if overwrite:
        for name in (*RUN_OUTPUTS, SET_ASIDE):
            try:
                check_no_link(root / name, root)
            except NotWrittenHere as err:
                raise RunFolderError(f"--overwrite true: {err}") from None
        manifest = Manifest.read(root)
        in_the_way = [
            rel
            for rel, info in _output_files(root)
            if _in_the_way(rel) and not (stat.S_ISREG(info.st_mode) and manifest.verified(rel))
        ]
        if in_the_way:
            raise RunFolderError(_not_recorded(root, in_the_way))
        return
    if ckpt_path is not None:
        return
    outputs = ", ".join(f"{name}/" for name in RUN_OUTPUTS)
    last = root / "checkpoints" / "last.ckpt"
    if last.exists():
        raise RunFolderError(
            f"--trainer.default_root_dir: {root} already holds a run ({last}); resume it with "
            "--ckpt_path last, train into another --trainer.default_root_dir, or pass --overwrite true "
            f"to set aside the files a fit wrote in its {outputs} and start over"
        )
    written = earlier_outputs(root)
    if written:
        raise RunFolderError(
            f"--trainer.default_root_dir: {root} holds an earlier fit's outputs ({written[0]}"
            f"{f' and {len(written) - 1} more' if len(written) > 1 else ''}) but no checkpoint to resume, and a "
            "new fit would write over them; train into another --trainer.default_root_dir, or pass "
            f"--overwrite true to set aside the files a fit wrote in its {outputs} and start over"
        )


def earlier_outputs(root: Path) -> list[Path]:
    """The files of ``root`` that a new fit would write over: checkpoints, sample grids and trees
    (:data:`RUN_OUTPUT_NAMES`; TensorBoard's event files and the config records are new files for
    every command, so a ``validate`` before the first fit leaves nothing in the way)."""
    return sorted(
        root / rel
        for rel, info in _output_files(root)
        if not rel.startswith("tensorboard/") and stat.S_ISREG(info.st_mode) and _written_name(rel)
    )


# ------------------------------------------------------------------------ the launch rank
#: the variables a launcher sets to a process's rank, in the order they are read
_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK", "NODE_RANK", "LOCAL_RANK")


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def launched_beside_others() -> bool:
    """Whether a launcher started this process as one of several: ``torchrun`` and Lightning's own
    DDP launcher set ``WORLD_SIZE`` > 1 and ``MASTER_ADDR``, SLURM's ``srun`` ``SLURM_NTASKS`` > 1,
    LSF's ``jsrun`` ``JSM_NAMESPACE_SIZE`` > 1 (as Lightning's cluster environments read them)."""
    world = _env_int("WORLD_SIZE") or 0
    return (
        (world > 1 and bool(os.environ.get("MASTER_ADDR")))
        or (_env_int("SLURM_NTASKS") or 0) > 1
        or (_env_int("JSM_NAMESPACE_SIZE") or 0) > 1
    )


def launch_rank() -> int:
    """The global rank this process was launched as: non-zero for the processes that Lightning's
    DDP launcher, ``torchrun`` or SLURM start beside rank 0, which must leave the folder to it.

    A non-zero rank variable (``RANK``, ``LOCAL_RANK``, ...) in the environment of a process that
    no launcher started (:func:`launched_beside_others`) is a stray: it is ignored, and said in one
    line. The process is rank 0, which takes the run folder's lock and checks, and Lightning's
    rank-zero output (read from the same variable when Lightning was imported) is made rank 0's."""
    ranks = [(name, value) for name in _RANK_VARIABLES if (value := _env_int(name))]
    if not ranks:
        return 0
    if launched_beside_others():
        return ranks[0][1]
    rank_zero_only.rank = 0  # Lightning's and lightning_utilities' (one function)
    stray = ", ".join(f"{name}={value}" for name, value in ranks)
    rank_zero_info(
        f"{stray} in the environment, but no launcher started this process beside others (no WORLD_SIZE > 1 "
        "with MASTER_ADDR, no SLURM_NTASKS > 1): ignored, this fit runs as the only process (rank 0) and takes "
        f"its run folder's lock; unset {' '.join(name for name, _ in ranks)} (torchrun and --trainer.devices N "
        "set the ranks themselves)"
    )
    return 0


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


class LogWriteError(WriteError):
    """A logger could not write its files (a full disk, a read-only folder, a file where its folder should be): one
    line naming the folder, what the system said and the fix."""


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


class _DeferredSummaryWriter:
    """A ``SummaryWriter`` opened by its first use; ``flush`` / ``close`` before that do nothing.

    A write it cannot make raises :class:`LogWriteError` naming its folder (TensorBoard's own ``OSError`` names no
    path when the disk is full, and comes from its writer thread at the next write or flush); ``close`` flushes
    first, so that a failure of the thread's last write is raised too. After a failure the writer writes nothing
    more and its ``flush`` / ``close`` do nothing (the failure was raised). Under its logger's
    ``defer_write_failures`` the failure is kept in :attr:`failure` instead of raised, for the command to raise
    once its results are out (:meth:`RunTensorBoardLogger.raise_write_failure`), and every later write is skipped."""

    def __init__(self, logger: RunTensorBoardLogger) -> None:
        self._logger = logger  # opens the writer, names its folder, says whether to defer (read at a failure)
        self._writer: Any = None
        self.failure: LogWriteError | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy / pickle protocol lookups: no writer's to give
            raise AttributeError(name)
        if self.failure is not None:
            return _nothing  # said once (or kept, deferred); nothing more is written
        if self._writer is None:
            if name in ("flush", "close"):
                return _nothing
            self._writer = self._written(self._logger._open_writer)
            if self._writer is None:  # the failure is kept (deferred)
                return _nothing
        attr = getattr(self._writer, name)
        if not callable(attr):
            return attr
        if name == "close":
            return lambda: self._written(self._flushed_close)
        return lambda *args, **kwargs: self._written(attr, *args, **kwargs)

    def _flushed_close(self) -> None:
        self._writer.flush()  # raises what the writer thread met: its close alone would not
        self._writer.close()

    def _written(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except OSError as err:
            if err.errno is None:
                raise  # not the system's answer to a write (PIL's encoder errors are OSErrors too)
            message = f"cannot write the TensorBoard events in {self._logger._event_folder()}: {explain_os_error(err)}"
            self.failure = failure = write_error(message, err, LogWriteError)
            if self._logger.defer_write_failures:
                return None
            raise failure from err


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

    def __init__(self, *args: Any, run_name: str = "", defer_write_failures: bool = False, **kwargs: Any) -> None:
        """``defer_write_failures``: a write that fails (a full disk, a read-only folder) is kept, and every later one
        skipped, until :meth:`raise_write_failure` (validate / test: their results are printed first, set by the
        CLI); else it raises :class:`LogWriteError` at once."""
        super().__init__(*args, **kwargs)
        self.run_name = run_name
        self.defer_write_failures = defer_write_failures

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._experiment is None:
            self._experiment = _DeferredSummaryWriter(self)
        return self._experiment

    @property
    def write_failure(self) -> LogWriteError | None:
        """The write that failed, kept under ``defer_write_failures``; None when none did."""
        experiment = self._experiment
        return experiment.failure if isinstance(experiment, _DeferredSummaryWriter) else None

    def raise_write_failure(self, note: str = "") -> None:
        """Raise the write failure kept under ``defer_write_failures``, if there was one, with ``note`` added."""
        failure = self.write_failure
        if failure is not None and isinstance(failure.__cause__, OSError):
            raise write_error(f"{failure}{note}", failure.__cause__, LogWriteError) from failure.__cause__

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        try:
            super().log_metrics(metrics, step)
        except ValueError as err:
            # Lightning words any failure of add_scalar as a value it cannot log: a failed write is said as such
            failure = err.__cause__
            if isinstance(failure, LogWriteError):
                raise failure from failure.__cause__
            raise

    @override
    @rank_zero_only
    def save(self) -> None:
        # Lightning writes hparams.yaml once, at the first save: an empty one ({}) when the module
        # logs no hyper-parameters (this one saves none); the run's config record is config.yaml
        if self.hparams:
            super().save()
        else:
            self.experiment.flush()

    def _event_folder(self) -> Path:
        """Where the events go: ``<log_dir>/<run_name>``, or ``log_dir`` when it holds an unnamed run's events."""
        folder = Path(self.log_dir)
        if self.run_name and not any(folder.glob("events.out.tfevents.*")):
            folder = folder / self.run_name
        return folder

    def _open_writer(self) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        if self.root_dir:
            self._fs.makedirs(self.root_dir, exist_ok=True)
        return SummaryWriter(log_dir=str(self._event_folder()), **self._kwargs)


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
    "RUN_OUTPUT_NAMES",
    "SET_ASIDE",
    "FolderLock",
    "LogWriteError",
    "RunConfigRecord",
    "RunFolderError",
    "RunLock",
    "RunTensorBoardLogger",
    "check_new_run",
    "checkpoint_saved",
    "clear_run",
    "delete_set_aside",
    "earlier_outputs",
    "event_folder",
    "fcntl",
    "launch_rank",
    "launched_beside_others",
    "put_back",
    "recover_set_aside",
    "remove_checkpoint",
    "run_name",
    "write_new_record",
]
