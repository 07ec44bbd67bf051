"""Removing, replacing and reading files: the one place the package removes or replaces a file."""

from __future__ import annotations

import fnmatch
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

MiB = 1 << 20


class NotWrittenHere(ValueError):
    """A removal or replacement the project may not make: the path, why, what to do (one line)."""


class FileTooLarge(ValueError):
    """A file over the size the project reads of its kind (one line naming it and the bound)."""


def check_no_link(path: str | Path, root: str | Path) -> None:
    """Refuse ``path`` unless it lies in ``root`` and no folder or file below ``root`` on the way
    to it is a symbolic link (``root`` itself may be one: the user chose it)."""
    top, target = Path(os.path.abspath(root)), Path(os.path.abspath(path))
    try:
        parts = target.relative_to(top).parts
    except ValueError:
        raise NotWrittenHere(f"{path} lies outside {root}, where this command writes; it is left in place") from None
    current = top
    for part in parts:
        current = current / part
        if current.is_symlink():
            raise NotWrittenHere(
                f"{current} is a symbolic link (to {os.readlink(current)}); this project removes only what it "
                "wrote in its own folders, never through a link: replace the link by a real folder, or "
                "choose another folder"
            )


def _named(path: Path, names: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(path.name, pattern) for pattern in names)


def remove_written(path: str | Path, *, root: str | Path, names: Sequence[str]) -> bool:
    """Remove the file ``path`` of ``root`` if its name is one of ``names`` (glob patterns: what the project writes
    there); returns whether there was one."""
    path = Path(path)
    check_no_link(path, root)
    if not _named(path, names):
        raise NotWrittenHere(
            f"{path}: this project writes no file of that name there ({', '.join(names)}); left in place"
        )
    if path.is_dir():
        raise NotWrittenHere(f"{path} is a folder where this project writes a file; left in place")
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def clear_written(folder: str | Path, *, root: str | Path, names: Sequence[str]) -> list[Path]:
    """Remove from ``folder`` (and its sub-folders) every file whose name is one of ``names``, then the folders left
    empty, ``folder`` included; returns what was kept (files of other names, and links, which are never followed)."""
    folder = Path(folder)
    check_no_link(folder, root)
    if not folder.is_dir():
        return []
    kept: list[Path] = []
    for entry in sorted(folder.iterdir()):
        if entry.is_symlink():
            kept.append(entry)
        elif entry.is_dir():
            kept += clear_written(entry, root=root, names=names)
        elif _named(entry, names):
            os.unlink(entry)
        else:
            kept.append(entry)
    remove_empty_folder(folder)
    return kept


def remove_written_tree(folder: str | Path, *, root: str | Path) -> None:
    """Remove ``folder`` of ``root``, a folder the project wrote as a whole (an unfinished export's
    staging folder, an earlier export's weights), without following a link inside it."""
    check_no_link(folder, root)
    if Path(folder).exists():
        shutil.rmtree(folder)  # refuses a link at the top, and removes links inside as links


def remove_empty_folder(folder: str | Path) -> bool:
    """Remove ``folder`` if it is empty (a folder the project created and wrote nothing into);
    returns whether it did. A folder that holds anything, or a link, stays."""
    if Path(folder).is_symlink():
        return False
    try:
        os.rmdir(folder)
    except OSError:  # not empty (or gone): nothing to remove
        return False
    return True


def replace_with_written(written: str | Path, target: str | Path) -> None:
    """Move ``written``, a file or folder this process has just written beside ``target`` (in the same folder), onto
    ``target`` in one atomic rename."""
    written, target = Path(written), Path(target)
    if os.path.abspath(written.parent) != os.path.abspath(target.parent):
        raise NotWrittenHere(f"{written} is not beside {target}; an atomic replacement moves a file within its folder")
    if written.is_symlink() or target.is_symlink():
        link = written if written.is_symlink() else target
        raise NotWrittenHere(
            f"{link} is a symbolic link; this project replaces only what it wrote, never through a link"
        )
    if target.is_dir() and any(target.iterdir()):
        raise NotWrittenHere(f"{target} is a folder with files in it; this project replaces only what it wrote")
    os.replace(written, target)


def move_written(written: str | Path, target: str | Path) -> None:
    """Move ``written``, a file or folder this process has just written, to ``target``, where
    nothing may be: an existing file, folder or link there is refused, never replaced."""
    written, target = Path(written), Path(target)
    if written.is_symlink():
        raise NotWrittenHere(f"{written} is a symbolic link; this project moves only what it wrote")
    if target.exists() or target.is_symlink():
        raise NotWrittenHere(f"{target} already exists; this project does not write over it")
    os.rename(written, target)


def fresh_folder(parent: str | Path, name: str) -> Path:
    """Create and return the first of ``parent/name``, ``parent/name-2``, ``name-3``, ... that does not exist,
    exclusively (two commands never share one), so that nothing already there is written over."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        folder = parent / (name if n == 1 else f"{name}-{n}")
        try:
            folder.mkdir()
        except FileExistsError:
            n += 1
            continue
        return folder


def read_limited(path: str | Path, limit: int, what: str) -> bytes:
    """The bytes of the file ``path``; :class:`FileTooLarge` when it holds more than ``limit`` bytes (read only that
    far), ``OSError`` as the system says."""
    with open(path, "rb") as f:
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
