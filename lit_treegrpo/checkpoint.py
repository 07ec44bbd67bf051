"""Checkpoint files that survive a kill: atomic writes, and corrupt files reported in one line.

Lightning's ``TorchCheckpointIO`` serialises into memory, then writes through an fsspec
transaction, which for a local path means a temporary file in the *system* temp folder moved onto
the target with ``shutil.move`` at commit. That is atomic only when the temp folder and the
checkpoint folder share a filesystem (otherwise the move copies into the target, and a kill during
the copy leaves a truncated ``last.ckpt``), and nothing is fsynced, so a node that loses power
after the rename can come back with an empty file. :class:`AtomicCheckpointIO` writes a temporary
file beside the target, fsyncs it, ``os.replace``-s it onto the target (atomic on POSIX and
Windows) and fsyncs the folder: at every instant the target is the old checkpoint or the new one.

:func:`check_checkpoint` reads a checkpoint's zip directory (and, before a resume, every entry's
CRC) so that a truncated or garbage file is reported with the fix instead of failing deep inside
``torch.load`` after the model has loaded, or being half-read; :func:`check_lightning_checkpoint`
then unpickles it as the trainer will (``weights_only``, tensors memory-mapped, not read) and
refuses what is no Lightning checkpoint, or what the safe unpickler refuses.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from .errors import explain_os_error

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
    """``torch.save(checkpoint, path)`` such that ``path`` is never seen half-written.

    Write ``.<name>.<pid>.tmp`` in the same folder, flush and fsync it, ``os.replace`` it onto
    ``path``, fsync the folder. A failure (or a kill) before the replace leaves ``path`` as it was;
    the temporary file of a killed writer is removed by the next save to the same path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in _stale_temp_files(path):  # only global rank 0 writes, so none is in use
        stale.unlink()
    tmp = _temp_path(path)
    try:
        with open(tmp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:
        cause = _os_error_in(err)
        if cause is None:  # a RuntimeError of torch.save itself: not the disk's doing
            raise
        kept = f"the previous {path.name} is intact" if path.exists() else f"no {path.name} was written"
        raise CheckpointWriteError(
            f"cannot write the checkpoint {path}: {explain_os_error(cause)} ({kept})"
        ) from err
    finally:
        tmp.unlink(missing_ok=True)  # gone after the replace; a partial file after a failure
    if os.name == "posix":  # make the rename itself durable (directories cannot be opened on Windows)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def check_checkpoint(path: str | Path, *, option: str = "--ckpt_path", verify_data: bool = True) -> None:
    """Raise :class:`CorruptCheckpointError` (one line: the file, what is wrong, the fix) unless
    ``path`` is a complete torch zip checkpoint. ``verify_data`` also checks every entry's CRC,
    which reads the whole file. A folder (a distributed checkpoint) is left to its loader."""
    path = Path(path)
    if path.is_dir():
        return
    if not path.is_file():
        raise FileNotFoundError(f"{option}: no checkpoint file at {path}; check the path")
    problem = _zip_problem(path, verify_data)
    if problem is None:
        return
    others = sorted(p.name for p in path.parent.glob("*.ckpt") if p.name != path.name)
    earlier = f" ({', '.join(others[:3])}{' ...' if len(others) > 3 else ''})" if others else ""
    raise CorruptCheckpointError(
        f"{option}: {path} is truncated or corrupt ({problem}); delete it and resume from an "
        f"earlier checkpoint in {path.parent}{earlier}, or start over without --ckpt_path"
    )


def check_lightning_checkpoint(path: str | Path, *, option: str = "--ckpt_path") -> None:
    """Raise :class:`CorruptCheckpointError` unless ``path`` (a complete torch zip file, see
    :func:`check_checkpoint`) unpickles with ``weights_only=True``, as Lightning loads it, into a
    Lightning checkpoint. Tensors are memory-mapped, so this reads the pickle only."""
    path = Path(path)
    fix = "pass a checkpoint written by fit (<root>/checkpoints/last.ckpt), or last"
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:  # torch's safe unpickler refused an object in the file
        raise CorruptCheckpointError(
            f"{option}: {path} holds objects that torch.load refuses to unpickle safely "
            f"({_refusal(err)}); it was not written by this project's fit: {fix}"
        ) from err
    except (RuntimeError, EOFError) as err:  # a zip that is a torch file in name only
        raise CorruptCheckpointError(f"{option}: {path} cannot be read by torch.load ({_refusal(err)}); {fix}") from err
    if not isinstance(checkpoint, dict) or any(key not in checkpoint for key in LIGHTNING_KEYS):
        holds = (
            f"the keys {', '.join(repr(k) for k in list(checkpoint)[:5])}" if isinstance(checkpoint, dict)
            else f"a {type(checkpoint).__name__}"
        )
        raise CorruptCheckpointError(
            f"{option}: {path} is a torch file but no Lightning checkpoint (it holds {holds}, not "
            f"{' and '.join(repr(k) for k in LIGHTNING_KEYS)}); {fix}"
        )


def _refusal(err: BaseException) -> str:
    """The informative part of torch's unpickling errors, which open with a paragraph of advice."""
    text = str(err)
    refused = re.search(r"Unsupported global: GLOBAL [\w.]+", text)
    if refused:
        return refused.group(0)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for line in lines if "Unpickler error" in line), lines[0] if lines else type(err).__name__)


def _zip_problem(path: Path, verify_data: bool) -> str | None:
    """What is wrong with ``path`` as a torch zip archive, or None."""
    size = path.stat().st_size
    if size == 0:
        return "the file is empty"
    try:
        with zipfile.ZipFile(path) as archive:
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
    """``TorchCheckpointIO`` with atomic, fsynced local writes (:func:`atomic_save`) and a
    one-line error for a corrupt file on load. Remote paths (``s3://`` ...) keep Lightning's
    own code. The CLI installs it for every run unless the trainer is given another CheckpointIO."""

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local_file_protocol(path):
            super().save_checkpoint(checkpoint, path, storage_options)  # its own errors and remote code
            return
        atomic_save(checkpoint, path)

    @override
    def load_checkpoint(
        self,
        path: Any,
        map_location: Callable | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        if _is_local_file_protocol(path) and Path(path).is_file():
            check_checkpoint(path, verify_data=False)  # the CLI verified the CRCs before the model loaded
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)


__all__ = [
    "AtomicCheckpointIO",
    "CheckpointWriteError",
    "CorruptCheckpointError",
    "atomic_save",
    "check_checkpoint",
    "check_lightning_checkpoint",
]
