"""Reading a file a user gave (a config, a prompt file, a checkpoint, a card): only a regular file, told by its status
(:func:`regular_file`; a FIFO would make the read wait for ever, a device never end), and only up to a bound
(:func:`read_limited`), each refusal in one line naming the option, the path and the fix."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

MiB = 1 << 20


class FileTooLarge(ValueError):
    """A file over the size the project reads of its kind (one line naming it and the bound)."""


class NotARegularFile(ValueError):
    """Something other than a regular file where one is read (a FIFO, a device, a socket, a folder): one line naming
    the option, the path, what is there and the fix."""


#: the fix said when a path given to be read is no regular file
READ_FIX = (
    "give the path of a regular file (this project reads no FIFO, device, socket or folder: such a read can wait "
    "or run for ever)"
)


def kind_of(mode: int) -> str:
    """What a file of ``mode`` (``os.stat``'s ``st_mode``) that is no regular file is: ``a FIFO``, ``a device`` ..."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "no regular file"


def regular_file(
    path: str | Path, what: str = "", fix: str = READ_FIX, *, option: str = "", error: type[Exception] = NotARegularFile
) -> bool:
    """Whether ``path`` is a regular file (a link is followed; False: nothing is there), told by ``os.stat``, never by
    opening it: opening a FIFO waits for a writer, reading a device may never end, and opening some devices acts.
    Anything else there raises ``error``: ``[option: ]path is a FIFO, not <what> (a regular file); <fix>``. An
    ``OSError`` of the status itself (a parent that is a file, no permission, a loop of links) is raised as it is."""
    where = f"{option}: " if option else ""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            raise error(f"{where}{path} is a symbolic link to nothing, not {what or 'a regular file'}; {fix}") from None
        return False
    if not stat.S_ISREG(mode):
        wanted = f"{what} (a regular file)" if what else "a regular file"
        raise error(f"{where}{path} is {kind_of(mode)}, not {wanted}; {fix}")
    return True


def open_regular(path: str | Path, what: str, fix: str = READ_FIX) -> BinaryIO:
    """``path`` opened for reading in binary, once :func:`regular_file` has found a regular file there (a missing one
    is ``FileNotFoundError``); :class:`NotARegularFile` names ``what`` (the option) otherwise. The file is opened
    without blocking and checked again, open, so that one swapped for a FIFO in between cannot make it wait."""
    regular_file(path, option=what, fix=fix)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFile(f"{what}: {path} is {kind_of(mode)}, not a regular file; {fix}")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_limited(path: str | Path, limit: int, what: str) -> bytes:
    """The bytes of the file ``path``; :class:`FileTooLarge` when it holds more than ``limit`` bytes (read only that
    far), :class:`NotARegularFile` when it is a FIFO, device, socket or folder (:func:`regular_file`: never opened),
    ``OSError`` as the system says."""
    with open_regular(path, what) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(
            f"{what}: {path} is larger than {show_size(limit)}, the most this project reads of such a file; "
            "give a smaller file (split it, or check that it is the file you meant)"
        )
    return data


def read_text_limited(path: str | Path, limit: int, what: str) -> str:
    """:func:`read_limited` decoded as UTF-8; a file that is not is refused in one line."""
    data = read_limited(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{what}: {path} is not UTF-8 text ({err.reason} at byte {err.start}); re-save it as UTF-8"
        ) from None


def show_size(n: int) -> str:
    """``4194304`` -> ``4 MiB``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"
