"""Helpers for turning exceptions into the one-line messages the CLI and the fault policy print."""

from __future__ import annotations

import errno


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message, or its type's name when the message is empty."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


_DISK_FULL = "free space on that disk, or choose a folder on another one"
_OS_FIXES = {
    errno.ENOSPC: _DISK_FULL,
    errno.EDQUOT: _DISK_FULL,
    errno.EACCES: "check its permissions, or choose another path",
    errno.EPERM: "check its permissions, or choose another path",
    errno.EROFS: "that filesystem is read-only; choose a path on another one",
    errno.ENOTDIR: "a part of that path is a file, not a folder; move the file or choose another path",
    errno.EISDIR: "it is a folder where a file is expected; give a file",
    errno.EEXIST: "something is already there; move it or choose another path",
    errno.ENOENT: "no such file or folder; check the path",
    errno.EIO: "the device reported an I/O error; check the disk (or network filesystem)",
    errno.ENAMETOOLONG: "the name is too long; choose a shorter path",
}


def explain_os_error(err: OSError) -> str:
    """One line for an ``OSError``: the path(s), what the system said, and a fix."""
    if err.errno is None or err.strerror is None:
        return first_line(err)
    paths = " -> ".join(str(p) for p in (err.filename, err.filename2) if p is not None)
    code = errno.errorcode.get(err.errno, str(err.errno))
    fix = _OS_FIXES.get(err.errno, "check the path, the disk and the network")
    return f"{paths + ': ' if paths else ''}{err.strerror} ({code}); {fix}"


#: what a full or read-only disk answers a ``write`` with, which names no file (an ``open`` names its path)
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


class WriteError(OSError):
    """A file a command writes could not be written (a full disk, a read-only folder): the message is one line naming
    the path, what the system said and the fix (:func:`write_error`); ``errno`` is the system's."""


def write_error(message: str, err: OSError, kind: type[WriteError] = WriteError) -> WriteError:
    """A ``kind`` saying ``message`` (the path, and :func:`explain_os_error` of ``err``), with ``err``'s errno and
    ``err`` as its cause."""
    error = kind(message)
    error.errno, error.__cause__ = err.errno, err
    return error
