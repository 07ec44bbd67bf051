"""Checkpoint files that survive a kill: atomic writes, and corrupt files reported in one line."""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from ..common.errors import explain_os_error, first_line
from ..common.files import HashingWriter, remove_written, replace_with_written
from ..common.lightning_private import fsdp_lazy_load_replaced, is_local_path
from ..common.reads import regular_file

_TMP_SUFFIX = ".tmp"
#: what every Lightning checkpoint holds, whatever wrote it
LIGHTNING_KEYS = ("state_dict", "pytorch-lightning_version")


class CorruptCheckpointError(ValueError):
    """A checkpoint file is truncated or is not a torch checkpoint (a one-line message)."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a lost mount); the previous one is intact."""


def _os_error_in(err: BaseException) -> OSError | None:
    """The ``OSError`` behind ``err``: torch's zip writer reports a failed write as a
    ``RuntimeError`` raised while it handles the ``OSError`` of the file."""
    while err is not None:
        if isinstance(err, OSError):
            return err
        err = err.__cause__ or err.__context__
    return None


def _temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}{_TMP_SUFFIX}")


def _stale_temp_files(path: Path) -> list[Path]:
    """Temporary files of ``path`` left by a writer that was killed mid-write."""
    return sorted(path.parent.glob(f".{path.name}.*{_TMP_SUFFIX}"))


def atomic_save(checkpoint: dict[str, Any], path: str | Path) -> None:
    """``torch.save(checkpoint, path)`` such that ``path`` is never seen half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp_names = (f".{path.name}.*{_TMP_SUFFIX}",)
    for stale in _stale_temp_files(path):  # only global rank 0 writes, so none is in use
        remove_written(stale, root=path.parent, names=temp_names)
    tmp = _temp_path(path)
    try:
        with open(tmp, "wb") as f:
            hashing = HashingWriter(f)  # its sha256 for the run folder's manifest, without reading it back
            torch.save(checkpoint, hashing)
            f.flush()
            os.fsync(f.fileno())
        hashing.remember(tmp)
        replace_with_written(tmp, path)
    except (OSError, RuntimeError) as err:
        cause = _os_error_in(err)
        if cause is None:  # a RuntimeError of torch.save itself: not the disk's doing
            raise
        kept = f"the previous {path.name} is intact" if path.exists() else f"no {path.name} was written"
        raise CheckpointWriteError(f"cannot write the checkpoint {path}: {explain_os_error(cause)} ({kept})") from err
    finally:
        remove_written(
            tmp, root=path.parent, names=temp_names
        )  # gone after the replace; a partial file after a failure
    if os.name == "posix":  # make the rename itself durable (directories cannot be opened on Windows)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def check_checkpoint(path: str | Path, *, option: str = "--ckpt_path", verify_data: bool = True) -> None:
    """Raise :class:`CorruptCheckpointError` (one line: the file, what is wrong, the fix) unless ``path`` is a complete
    torch zip checkpoint."""
    path = Path(path)
    if path.is_dir():
        return
    _check_file(path, option)
    with open(path, "rb") as f:
        _check_zip(f, path, option, verify_data)


def read_checkpoint(
    path: str | Path,
    *,
    option: str = "--ckpt_path",
    verify_data: bool = True,
    lightning: bool = True,
    map_location: Any = "cpu",
) -> dict[str, Any]:
    """The checkpoint at ``path``, read once and safely: one open file is checked as a zip (:func:`check_checkpoint`;
    ``verify_data``: every CRC) and unpickled from the same file with ``weights_only=True``, tensors on the CPU
    (``map_location``)."""
    path = Path(path)
    _check_file(path, option)
    fix = "pass a checkpoint written by fit (<root>/checkpoints/last.ckpt), or last"
    with open(path, "rb") as f:
        _check_zip(f, path, option, verify_data)
        f.seek(0)
        try:
            checkpoint = torch.load(f, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as err:  # the safe unpickler refused an object; nothing of it ran
            f.seek(0)
            refused = refused_globals(f, err)
            what = f"the global {', '.join(refused)}" if refused else "a pickle instruction outside torch's allowlist"
            raise CorruptCheckpointError(
                f"{option}: {path} holds objects that the safe unpickler refuses ({what}); it was not written "
                f"by this project's fit and may be hostile, so it is not loaded: {fix}"
            ) from None  # torch's message advises re-running with weights_only=False
        except (RuntimeError, EOFError, ValueError) as err:  # a zip that is a torch file in name only
            raise CorruptCheckpointError(
                f"{option}: {path} cannot be read by torch.load ({_without_advice(err)}); {fix}"
            ) from err
    if lightning and (not isinstance(checkpoint, dict) or any(key not in checkpoint for key in LIGHTNING_KEYS)):
        holds = (
            f"the keys {', '.join(repr(k) for k in list(checkpoint)[:5])}"
            if isinstance(checkpoint, dict)
            else f"a {type(checkpoint).__name__}"
        )
        raise CorruptCheckpointError(
            f"{option}: {path} is a torch file but no Lightning checkpoint (it holds {holds}, not "
            f"{' and '.join(repr(k) for k in LIGHTNING_KEYS)}); {fix}"
        )
    return checkpoint


def check_lightning_checkpoint(path: str | Path, *, option: str = "--ckpt_path") -> None:
    """Raise :class:`CorruptCheckpointError` unless ``path`` reads as a Lightning checkpoint
    (:func:`read_checkpoint`, which the CLI uses to keep what it read)."""
    read_checkpoint(path, option=option, verify_data=False)


def refused_globals(f: Any, err: BaseException | None = None) -> list[str]:
    """The globals (``module.name``) in the torch file ``f`` that the safe unpickler does not allow, found by reading
    its pickle's opcodes (nothing is imported or run: torch's ``get_unsafe_globals_in_checkpoint``, torch >= 2.5);
    before torch 2.5, the name in the ``GLOBAL module.name`` of the refusal ``err``, which every version's wording
    holds."""
    find = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if find is not None:
        try:
            return sorted(find(f))
        except (ValueError, RuntimeError, pickle.UnpicklingError):  # not a torch zip after all
            return []
    refused = re.search(r"\bGLOBAL ([\w.]+)", str(err or ""))
    return [refused.group(1)] if refused else []


def _without_advice(err: BaseException) -> str:
    """The first line of torch's message without its sentences about ``weights_only`` (the advice
    to re-run with ``weights_only=False``, whatever the version's wording)."""
    sentences = re.split(r"(?<=[.!?])\s+", first_line(err))
    kept = [s for s in sentences if not re.search(r"weights[_ ]only|arbitrary code|trusted source", s, flags=re.I)]
    return " ".join(kept).strip() or f"{type(err).__name__} from torch's safe loader"


def _check_file(path: Path, option: str) -> None:
    """Refuse ``path`` unless it is a regular file, told by its status (a FIFO would make the read wait for ever, a
    device never end): :class:`~lit_treegrpo.common.reads.NotARegularFile` names what is there."""
    fix = "give a checkpoint file that fit wrote (<root>/checkpoints/*.ckpt)"
    if not regular_file(path, "a checkpoint file", fix, option=option):
        raise FileNotFoundError(f"{option}: no checkpoint file at {path}; check the path")


def _check_zip(f: Any, path: Path, option: str, verify_data: bool) -> None:
    """Raise :class:`CorruptCheckpointError` unless the open file ``f`` is a complete torch zip."""
    problem = _zip_problem(f, verify_data)
    if problem is None:
        return
    others = intact_checkpoints(path.parent, besides=path, most=3)
    earlier = (
        f"resume from an earlier checkpoint that reads as intact ({', '.join(str(p) for p in others)})"
        if others
        else f"resume from an earlier checkpoint (none in {path.parent} reads as intact)"
    )
    raise CorruptCheckpointError(
        f"{option}: {path} is truncated or corrupt ({problem}); delete it and {earlier}, or start over "
        "without --ckpt_path"
    )


def intact_checkpoints(folder: Path, *, besides: Path | None = None, most: int = 3) -> list[Path]:
    """Up to ``most`` ``*.ckpt`` files of ``folder`` (other than ``besides``) that read as Lightning checkpoints: a
    complete zip, unpickled by the safe unpickler (tensors memory-mapped, not read), with the keys every Lightning
    checkpoint holds."""
    found: list[Path] = []
    for candidate in sorted(folder.glob("*.ckpt")) if folder.is_dir() else []:
        if len(found) == most:
            break
        if besides is not None and candidate.name == besides.name:
            continue
        if not candidate.is_file() or candidate.is_symlink():
            continue
        with open(candidate, "rb") as f:
            if _zip_problem(f, verify_data=False) is not None:
                continue
        try:
            loaded = torch.load(str(candidate), map_location="cpu", weights_only=True, mmap=True)
        except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError, OSError):
            continue  # refused or unreadable: not a checkpoint to suggest
        if isinstance(loaded, dict) and all(key in loaded for key in LIGHTNING_KEYS):
            found.append(candidate)
    return found


def _zip_problem(f: Any, verify_data: bool) -> str | None:
    """What is wrong with the open file ``f`` as a torch zip archive, or None."""
    size = os.fstat(f.fileno()).st_size
    if size == 0:
        return "the file is empty"
    try:
        with zipfile.ZipFile(f) as archive:
            names = archive.namelist()
            broken = archive.testzip() if verify_data else None
    except zipfile.BadZipFile as err:  # no zip directory at the end: cut short, or not a checkpoint
        return f"{size} bytes without a complete zip directory: {err}"
    if broken is not None:
        return f"the entry {broken} fails its CRC check"
    if not any(name.endswith("/data.pkl") or name == "data.pkl" for name in names):
        return "the archive holds no data.pkl, so torch.save did not write it"
    return None


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with atomic, fsynced local writes (:func:`atomic_save`), recorded in the run folder's
    manifest by the fit that holds it (:func:`~.run_folder.checkpoint_saved`; a checkpoint is removed only if that
    manifest verifies it), and safe reads: every load is
    ``weights_only=True``, whatever the caller asks (Lightning passes the trainer's ``weights_only``, which it
    leaves to torch's default: unsafe before torch 2.6), a local file is read once through :func:`read_checkpoint`
    (a corrupt or hostile one in one line), and a checkpoint the CLI already read and verified is handed over
    (:meth:`preload`) instead of being read again."""

    def __init__(self) -> None:
        super().__init__()
        self._preloaded: tuple[str, dict[str, Any]] | None = None

    def preload(self, path: str | Path, checkpoint: dict[str, Any]) -> None:
        """The next load of ``path`` returns ``checkpoint`` (read from it, and verified, before the model loaded)
        instead of reading the file again: a file swapped since is never read."""
        self._preloaded = (os.path.abspath(path), checkpoint)

    def forget_preloaded(self) -> None:
        """Drop a preloaded checkpoint that was not asked for (a strategy that reads its files
        itself), so that it does not stay in memory for the whole run."""
        self._preloaded = None

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not is_local_path(path):
            super().save_checkpoint(checkpoint, path, storage_options)  # its own errors and remote code
            return
        atomic_save(checkpoint, path)
        from .run_outputs import checkpoint_saved

        checkpoint_saved(path)  # the fit recorded in its run folder's manifest; an earlier run set aside deleted

    @override
    def remove_checkpoint(self, path: Any) -> None:
        # ModelCheckpoint replacing a top-k file: only one the run folder's manifest verifies
        from .run_outputs import remove_checkpoint

        if not is_local_path(path) or remove_checkpoint(path) is None:
            super().remove_checkpoint(path)

    @override
    def load_checkpoint(
        self,
        path: Any,
        map_location: Callable | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        if not is_local_path(path):
            return super().load_checkpoint(path, map_location=map_location, weights_only=True)
        if self._preloaded is not None and os.path.abspath(path) == self._preloaded[0]:
            checkpoint, self._preloaded = self._preloaded[1], None
            return checkpoint
        if not Path(path).exists():
            return super().load_checkpoint(path, map_location=map_location, weights_only=True)  # its FileNotFoundError
        # the CLI verified the CRCs of a --ckpt_path before the model loaded
        return read_checkpoint(path, verify_data=False, lightning=False, map_location=map_location)


def guard_strategy_load(strategy: Any) -> None:
    """Make ``strategy.load_checkpoint`` (how Lightning restores a checkpoint) read safely whatever it is asked: always
    ``weights_only=True``, which reaches strategies that load files themselves (``ModelParallelStrategy``), and a
    refusal on the way becomes one :class:`CorruptCheckpointError` line."""
    load = strategy.load_checkpoint

    def load_checkpoint(checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        with _fsdp_reads_through_checkpoint_io(strategy):
            try:
                return load(checkpoint_path, weights_only=True)
            except pickle.UnpicklingError as err:  # a strategy's own torch.load refused an object
                refused = refused_globals(checkpoint_path, err) if Path(checkpoint_path).is_file() else []
                what = (
                    f"the global {', '.join(refused)}" if refused else "a pickle instruction outside torch's allowlist"
                )
                raise CorruptCheckpointError(
                    f"--ckpt_path: {checkpoint_path} holds objects that the safe unpickler refuses ({what}); it was "
                    "not written by this project's fit and may be hostile, so it is not loaded"
                ) from None
            finally:
                if isinstance(strategy.checkpoint_io, AtomicCheckpointIO):
                    strategy.checkpoint_io.forget_preloaded()

    strategy.load_checkpoint = load_checkpoint


@contextlib.contextmanager
def _fsdp_reads_through_checkpoint_io(strategy: Any) -> Iterator[None]:
    """Under ``FSDPStrategy``, its unrestricted unpickler replaced by the strategy's CheckpointIO."""
    from lightning.pytorch.strategies import fsdp

    if not isinstance(strategy, fsdp.FSDPStrategy):
        yield
        return
    checkpoint_io = strategy.checkpoint_io

    def safe_load(path: Any) -> Any:
        if isinstance(checkpoint_io, AtomicCheckpointIO):
            return checkpoint_io.load_checkpoint(path)
        return read_checkpoint(path, verify_data=False, lightning=False)

    with fsdp_lazy_load_replaced(safe_load):
        yield


__all__ = [
    "AtomicCheckpointIO",
    "CheckpointWriteError",
    "CorruptCheckpointError",
    "atomic_save",
    "check_checkpoint",
    "check_lightning_checkpoint",
    "guard_strategy_load",
    "read_checkpoint",
    "refused_globals",
]
