"""Removing and replacing files: the one place the package removes or replaces a file (reading a user's file, only
a regular one and up to a bound: :mod:`.reads`, whose helpers this module gives too).

What the project may remove is what it wrote, and it knows what it wrote from a manifest it wrote
itself (:class:`Manifest`): the relative path of every file and the sha256 of its content. A file
of the same name whose content is not the one recorded (edited, replaced, or never written by the
project: a manifest edited to name it cannot give its hash) is not the project's, and stays.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

# the bounded, regular-file-only reads of user-given files (.reads), for the importers of this module
from .reads import (  # noqa: F401
    FileTooLarge,
    MiB,
    NotARegularFile,
    kind_of,
    read_limited,
    read_text_limited,
    regular_file,
    show_size,
)

#: the manifest of what the project wrote in a folder (a run folder: its fits' outputs)
MANIFEST_NAME = ".lit_treegrpo-written.json"
#: the largest manifest read back (a few hundred bytes per file written)
MAX_MANIFEST_BYTES = 16 * MiB


class NotWrittenHere(ValueError):
    """A removal or replacement the project may not make: the path, why, what to do (one line)."""


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


# ------------------------------------------------------------------------ what the project wrote
_HASHES: dict[tuple[int, int, int, int], str] = {}  # (device, inode, size, mtime) -> sha256 of the whole file


def file_sha256(path: str | Path, *, size: int | None = None) -> str:
    """The sha256 of the file ``path`` (hex), or of its first ``size`` bytes; ``OSError`` as the
    system says. A whole file's hash is remembered for the process by its inode, size and mtime (a
    rename keeps them), so that a large checkpoint is read once."""
    info = os.stat(path, follow_symlinks=False)
    whole = size is None or size == info.st_size
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    if whole and key in _HASHES:
        return _HASHES[key]
    digest = hashlib.sha256()
    left = info.st_size if size is None else size
    with open(path, "rb") as f:
        while left > 0:
            chunk = f.read(min(left, 4 * MiB))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    if whole:
        _HASHES[key] = digest.hexdigest()
    return digest.hexdigest()


class HashingWriter:
    """A file opened for writing, which hashes what is written through it in order (for a writer
    such as ``torch.save`` that writes a file front to back): :meth:`remember` then gives the file
    its hash without reading it back (:func:`file_sha256`). A seek makes the hash unknown."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self._digest = hashlib.sha256()
        self._written = 0
        self._in_order = True

    def write(self, data: Any) -> int:
        written = self._f.write(data)
        self._digest.update(data)
        self._written += written
        return written

    def flush(self) -> None:
        self._f.flush()

    def tell(self) -> int:
        return self._written

    def seek(self, *args: Any) -> int:
        self._in_order = False
        return self._f.seek(*args)

    def remember(self, path: str | Path) -> None:
        """Record the hash of ``path`` (the file written, flushed) as it is now."""
        info = os.stat(path, follow_symlinks=False)
        if self._in_order and info.st_size == self._written:
            _HASHES[(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)] = self._digest.hexdigest()


def safe_relative(rel: Any) -> bool:
    """Whether ``rel`` is a relative path of the ``a/b/c`` form, inside its folder (no ``..``, no
    root, no empty part): the only form a manifest's entries take."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\0" in rel:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


class Manifest:
    """The files the project wrote in ``folder``: relative path (``a/b``) -> ``{"sha256": ...,
    "bytes": ..., "grows": bool}``, kept in ``folder/<name>`` (:data:`MANIFEST_NAME`), written
    atomically by :meth:`save`. A file is the project's (:meth:`verified`) when it is a regular
    file there, reached through no link, whose content has the recorded sha256; for a file that
    ``grows`` (a TensorBoard event file, appended to after it was recorded), when its first
    ``bytes`` bytes have it. A manifest that cannot be read counts as empty: nothing is the
    project's, so nothing is removed."""

    def __init__(self, folder: str | Path, entries: Mapping[str, Mapping[str, Any]] | None = None, *,
                 name: str = MANIFEST_NAME) -> None:  # fmt: skip
        self.folder = Path(folder)
        self.name = name
        self.entries: dict[str, dict[str, Any]] = {}
        for rel, entry in (entries or {}).items():
            if safe_relative(rel) and isinstance(entry, Mapping) and isinstance(entry.get("sha256"), str):
                self.entries[rel] = dict(entry)
        self.unreadable: str | None = None  # why the file could not be read, if it could not

    @classmethod
    def read(cls, folder: str | Path, name: str = MANIFEST_NAME) -> Manifest:
        """The manifest kept in ``folder`` (empty when there is none, or it cannot be read)."""
        path = Path(folder) / name
        if not os.path.lexists(path):
            return cls(folder, name=name)
        try:
            check_no_link(path, folder)
            data = json.loads(read_text_limited(path, MAX_MANIFEST_BYTES, str(path)))
            files = data.get("files") if isinstance(data, dict) else None
            if not isinstance(files, dict):
                raise ValueError("no 'files' mapping")
        except (OSError, ValueError, NotWrittenHere) as err:
            manifest = cls(folder, name=name)
            manifest.unreadable = str(err).splitlines()[0] if str(err) else type(err).__name__
            return manifest
        return cls(folder, files, name=name)

    @property
    def path(self) -> Path:
        return self.folder / self.name

    def __contains__(self, rel: object) -> bool:
        return rel in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.entries))

    def __len__(self) -> int:
        return len(self.entries)

    def verified(self, rel: str) -> bool:
        """Whether ``folder/rel`` is the file the project recorded there (see the class docstring)."""
        entry = self.entries.get(rel)
        if entry is None:
            return False
        path = self.folder / rel
        try:
            check_no_link(path, self.folder)
            info = os.lstat(path)
        except (OSError, NotWrittenHere):
            return False
        if not _is_regular(info.st_mode):
            return False
        recorded = entry.get("bytes")
        size = recorded if isinstance(recorded, int) and recorded >= 0 else None
        if size is not None and (info.st_size < size if entry.get("grows") else info.st_size != size):
            return False
        try:
            return file_sha256(path, size=size) == entry["sha256"]
        except OSError:
            return False

    def record(self, rel: str, *, grows: bool = False) -> None:
        """Record ``folder/rel`` as written by the project, as it is now."""
        if not safe_relative(rel):
            raise NotWrittenHere(f"{rel!r} is no path inside {self.folder}; a manifest names only its folder's files")
        path = self.folder / rel
        check_no_link(path, self.folder)
        size = os.lstat(path).st_size
        entry: dict[str, Any] = {"sha256": file_sha256(path, size=size), "bytes": size}
        if grows:
            entry["grows"] = True
        self.entries[rel] = entry

    def forget(self, rels: Iterable[str]) -> None:
        for rel in rels:
            self.entries.pop(rel, None)

    def subset(self, rels: Iterable[str], folder: str | Path | None = None) -> Manifest:
        """The entries of ``rels``, as the manifest of ``folder`` (this one's by default)."""
        return Manifest(folder or self.folder, {r: self.entries[r] for r in rels if r in self.entries}, name=self.name)

    def save(self) -> None:
        """Write the manifest atomically (a file beside it, then one rename); an empty one removes
        the file."""
        if not self.entries:
            if os.path.lexists(self.path):
                remove_written(self.path, root=self.folder, names=(self.name,))
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"written_by": "lit_treegrpo", "files": self.entries}, indent=1, sort_keys=True) + "\n"
        write_atomically(self.path, text.encode())


def write_atomically(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a file beside it and one rename, so that ``path`` is never
    seen half-written (a kill leaves the old one, or the new one)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name[:64]}.{os.getpid()}.tmp")
    check_no_link(tmp, path.parent)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        replace_with_written(tmp, path)
    finally:
        if os.path.lexists(tmp):
            remove_written(tmp, root=path.parent, names=(tmp.name,))


def _is_regular(mode: int) -> bool:
    return stat.S_ISREG(mode)


def remove_verified(manifest: Manifest, rel: str) -> bool:
    """Remove ``manifest.folder/rel`` if it is the file the manifest recorded (:meth:`Manifest.verified`);
    returns whether it did. Anything else there stays."""
    path = manifest.folder / rel
    check_no_link(path, manifest.folder)
    if not manifest.verified(rel):
        return False
    os.unlink(path)
    return True


def set_aside(path: str | Path, dest: str | Path, *, root: str | Path) -> None:
    """Move the file ``path`` of ``root`` to ``dest`` in ``root`` (its folders created), never
    through a link and never onto anything: a rename, so nothing is copied or lost."""
    path, dest = Path(path), Path(dest)
    check_no_link(path, root)
    check_no_link(dest, root)
    if os.path.lexists(dest):
        raise NotWrittenHere(f"{dest} already exists; this project does not write over it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(path, dest)


def remove_emptied_folders(path: str | Path, *, stop: str | Path) -> None:
    """Remove the folders from ``path``'s up to ``stop`` (not included) that are left empty."""
    top = Path(os.path.abspath(stop))
    folder = Path(os.path.abspath(path)).parent
    check_no_link(folder, top)
    while folder != top and top in folder.parents:
        if not remove_empty_folder(folder):
            return
        folder = folder.parent


def files_under(folder: str | Path) -> Iterator[tuple[str, os.stat_result]]:
    """``(relative path, lstat)`` of every file below ``folder``, links included (as files),
    never followed: a linked folder is listed as the link, not walked."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return
    for top, dirs, names in os.walk(folder, followlinks=False):
        here = Path(top)
        for name in sorted(names) + sorted(d for d in dirs if (here / d).is_symlink()):
            path = here / name
            with contextlib.suppress(OSError):
                yield path.relative_to(folder).as_posix(), os.lstat(path)
        dirs.sort()
