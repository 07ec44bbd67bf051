"""One writer per folder: an advisory lock file holding the writer's PID (:class:`FolderLock`).

The kernel drops an ``flock`` when its process dies, however it dies, so the lock of a killed
writer is taken over by the next one; where the filesystem has no ``flock`` the PID itself decides
(a dead PID's lock is taken over). The lock is opened without following a link and only as a
regular file of its own: a lock name taken by a symbolic or hard link (or a folder, FIFO, ...) is
refused, never truncated, so the file behind it is left as it was. A fit's run folder
(:class:`~.run_outputs.RunLock`) and an export's folder (:class:`~.export_folder.ExportLock`) each
word their refusals.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..common.files import remove_empty_folder, remove_written

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; no lock is taken there
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".fit.lock"
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # POSIX; elsewhere FolderLock._open checks for a link first


class RunFolderError(Exception):
    """The run folder cannot be used by this command (one line: the folder, why, the ways forward)."""


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


class FolderLock:
    """``<root>/<name>`` while one writer writes into ``root`` (see the module docstring, :class:`RunLock`).

    :meth:`acquire` creates ``root`` if needed (``OSError`` when it cannot: a file in the way, no
    permission) and raises :class:`RunFolderError` naming the PID of a live holder, or when the
    lock's name is taken by a link or by no regular file (:meth:`_open`). :meth:`release`
    removes the lock file and the folders that :meth:`acquire` created, if they are still empty,
    so that a command that failed before writing anything leaves no trace. Subclasses word the
    refusals (:meth:`_in_use`, :meth:`_not_a_lock`)."""

    name = LOCK_NAME

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.path = self.root / self.name
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

    @property
    def held(self) -> bool:
        return self._fd is not None

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
        """Open (or create) the lock file itself, never what a link there points to: a writer puts
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

    def _fix_for(self, what: str) -> str:
        if what == "a symbolic link":
            return f"delete the link {self.path} (the file it points to stays)"
        if what.startswith("a hard link"):
            return f"delete the name {self.path} (the file's other names stay)"
        return f"move {self.path} away"

    def _not_a_lock(self, what: str) -> str:
        return (
            f"--trainer.default_root_dir: the fit lock {self.path} is {what}, and a fit writes its PID into its "
            f"lock; {self._fix_for(what)} and run again"
        )

    def _in_use(self, pid: int | None) -> str:
        return (
            f"--trainer.default_root_dir: {self.root} is in use by another fit (pid {pid}, "
            f"lock {self.path}); wait for it to end or stop it, or train into another "
            f"--trainer.default_root_dir (if no fit runs there, delete {self.path})"
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
        raise RunFolderError(self._in_use(_read_pid(fd)))

    def release(self) -> None:
        if self._fd is None:
            return
        remove_written(
            self.path, root=self.root, names=(self.name,)
        )  # before closing: nobody may lock it once we let go
        os.close(self._fd)
        self._fd = None
        self._remove_created()

    def _remove_created(self) -> None:
        for folder in self._created:
            if not remove_empty_folder(folder):  # only if still empty
                break
        self._created = []


__all__ = ["LOCK_NAME", "FolderLock", "RunFolderError"]
