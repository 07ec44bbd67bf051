"""The folder an export writes (``--out DIR``), and an earlier export there (see :mod:`.export`).

The export is built in ``DIR/.export-tmp/new`` under ``DIR/.export-tmp/lock`` (:class:`ExportLock`) and
swapped in once complete (:func:`_swap_in`): the earlier export's files that its card's ``sha256``
verifies, and the card, are set aside in ``DIR/.export-tmp/old``, the new ones moved in, the
set-aside ones deleted; the moves are written down first (``swap.json``), so that an export killed
on the way is completed by the next one (:func:`recover`).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..common.files import (
    Manifest,
    MiB,
    NotWrittenHere,
    files_under,
    move_written,
    read_text_limited,
    remove_emptied_folders,
    remove_empty_folder,
    remove_verified,
    remove_written,
    remove_written_tree,
    safe_relative,
    set_aside,
    write_atomically,
)
from .locks import FolderLock, RunFolderError

CARD_FILE = "export.json"
CARD_TEXT = "README.md"
#: the largest card read back (an earlier export's, to know what it wrote); a card is a few KiB
MAX_CARD_BYTES = 1 * MiB
#: the card's record of what the export wrote: relative path -> sha256
HASHES = "sha256"
#: where an export is built, and the earlier one set aside, inside ``DIR`` (a short name, so that
#: any ``DIR`` a filesystem allows takes it)
STAGING = ".export-tmp"
_NEW, _OLD, _SWAP = "new", "old", "swap.json"


class ExportError(ValueError):
    """The export cannot be made as asked (one line: the option and the fix)."""


# ------------------------------------------------------------------------ the folder
def check_out(out: str | Path | None, *, overwrite: bool = False, option: str = "--out") -> Path:
    """``out`` as a path an export may write: new, empty, or (``overwrite``) an earlier export, whose
    card must say what it wrote (:func:`earlier_export`)."""
    if out is None or not str(out).strip():
        raise ExportError(f"{option}: give the folder to write the export to, e.g. {option} exports/my_run")
    path = Path(out).expanduser()
    if path.is_symlink():
        raise ExportError(
            f"{option} {path}: is a symbolic link (to {os.readlink(path)}); give the folder itself, so that "
            "nothing is written or replaced through the link"
        )
    if path.exists() and not path.is_dir():
        raise ExportError(f"{option} {path}: is a file; give a folder (it is created if missing)")
    if os.path.lexists(path / STAGING):
        recover(path, option)  # an export into it that was stopped
    if path.is_dir() and any(path.iterdir()):
        if not (path / CARD_FILE).is_file():
            raise ExportError(
                f"{option} {path}: the folder holds files and no earlier export ({CARD_FILE}); give a new or empty folder"
            )
        if not overwrite:
            raise ExportError(
                f"{option} {path}: holds an earlier export ({CARD_FILE}); give a new or empty folder, or pass "
                "--overwrite true to replace the files that export wrote (other files stay)"
            )
        earlier_export(path, option)
        recorded = earlier_hashes(path, option)
        if (path / CARD_TEXT).exists() and not recorded.verified(CARD_TEXT):
            raise ExportError(
                f"{option} {path}: {CARD_TEXT} there is not the one the earlier export wrote (its {CARD_FILE} "
                f"records another sha256), and this export writes one; move it away, or give another {option}"
            )
    ancestor = path.parent if path.parent != Path("") else Path(".")
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ExportError(f"{option} {path}: cannot create it, {ancestor} is a file; give another folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ExportError(f"{option} {path}: cannot create it, {ancestor} is not writable; give a folder you can write")
    return path


def earlier_export(out: Path, option: str = "--out") -> list[str]:
    """The names of what the earlier export in ``out`` wrote, from its card (its ``files``, the card
    and its text); a card that cannot be read, or names a path rather than an entry of ``out``, is
    refused in one line."""
    card_path = out / CARD_FILE
    fix = f"move the folder's files away yourself, or give another {option}"
    try:
        card = json.loads(read_text_limited(card_path, MAX_CARD_BYTES, f"{option} {out}"))
    except json.JSONDecodeError as err:
        raise ExportError(f"{option} {out}: {card_path} is not an export card ({err.msg}); {fix}") from None
    files = card.get("files") if isinstance(card, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise ExportError(f"{option} {out}: {card_path} lists no files it wrote; {fix}")
    names = [*files, CARD_FILE, CARD_TEXT]
    odd = [n for n in names if n in ("", ".", "..") or "/" in n or os.sep in n or (os.altsep and os.altsep in n)]
    if odd:
        raise ExportError(f"{option} {out}: {card_path} lists {odd[0]!r}, which no export writes; {fix}")
    return list(dict.fromkeys(names))


def earlier_hashes(out: Path, option: str = "--out") -> Manifest:
    """What the earlier export in ``out`` wrote, as its card records it (``sha256``: relative path ->
    hash), to verify against the files there; a card without that record (an export from before
    this version, or edited) is refused in one line: nothing of it can be told the project's."""
    card_path = out / CARD_FILE
    try:
        card = json.loads(read_text_limited(card_path, MAX_CARD_BYTES, f"{option} {out}"))
    except json.JSONDecodeError as err:
        raise ExportError(f"{option} {out}: {card_path} is not an export card ({err.msg})") from None
    hashes = card.get(HASHES) if isinstance(card, dict) else None
    if not isinstance(hashes, dict) or not all(safe_relative(k) and isinstance(v, str) for k, v in hashes.items()):
        raise ExportError(
            f"{option} {out}: {card_path} records no sha256 of the files that export wrote (an export from "
            "before this version, or an edited card), and this project replaces only the files it can tell it "
            f"wrote; move the folder's files away yourself, or give another {option}"
        )
    return Manifest(out, {rel: {HASHES: digest} for rel, digest in hashes.items()})


class ExportLock(FolderLock):
    """``DIR/.export-tmp/lock`` while an export writes ``DIR``: a second one is refused, and the
    folder of a killed one (its lock free) is recovered (:func:`recover`)."""

    name = "lock"

    def __init__(self, out: Path, option: str = "--out") -> None:
        super().__init__(out / STAGING)
        self.out, self.option = out, option

    def _in_use(self, pid: int | None) -> str:
        return (
            f"{self.option} {self.out}: another export is writing it (pid {pid}, lock {self.path}); wait for it "
            f"to end, or give another {self.option} (if no export runs, delete {self.root})"
        )

    def _not_a_lock(self, what: str) -> str:
        return (
            f"{self.option} {self.out}: the export lock {self.path} is {what}, and an export writes its PID into "
            f"its lock; {self._fix_for(what)} and run again"
        )

    def take(self) -> None:
        """:meth:`acquire`, its refusals as :class:`ExportError`."""
        if self.root.is_symlink():
            raise ExportError(
                f"{self.option} {self.out}: {self.root} is a symbolic link, where an export builds its files; "
                "delete the link (what it points to stays) and run again"
            )
        try:
            self.acquire()
        except RunFolderError as err:
            raise ExportError(str(err)) from None

    def release(self) -> None:
        super().release()
        remove_empty_folder(self.root)  # the staging folder, once nothing is left in it


def recover(out: Path, option: str = "--out") -> None:
    """``out/.export-tmp`` left by an export that was stopped: its swap completed when it had
    written down the moves to make (its files were complete), else its unfinished files removed.
    Under the export lock (a live export into ``out`` is refused)."""
    lock = ExportLock(out, option)
    lock.take()
    try:
        _recover_locked(out, option)
    finally:
        lock.release()


def _recover_locked(out: Path, option: str) -> None:
    from lightning.pytorch.utilities import rank_zero_info

    staging = out / STAGING
    if (staging / _SWAP).exists():
        try:
            journal = json.loads(read_text_limited(staging / _SWAP, MAX_CARD_BYTES, f"{option} {out}"))
            _finish_swap(out, journal)
        except (ValueError, KeyError, TypeError, NotWrittenHere) as err:
            raise ExportError(
                f"{option} {out}: cannot complete the export that was stopped while it moved its files in "
                f"({err}); its files are in {staging}: move what you need from there, delete it, and run again"
            ) from None
        rank_zero_info(f"{option} {out}: completed the export into it that was stopped while it moved its files in")
    elif os.path.lexists(staging / _NEW):
        remove_written_tree(staging / _NEW, root=out)
        rank_zero_info(f"{option} {out}: removed the unfinished files of an export into it that was stopped")


def _freed(out: Path, entry: str, ours: set[str]) -> bool:
    """Whether the top-level ``entry`` of ``out`` goes with the earlier export's files ``ours``: one
    of them, or a real folder holding only them."""
    path = out / entry
    if entry in ours or entry == CARD_FILE:
        return True
    if path.is_symlink() or not path.is_dir():
        return False
    inside = list(files_under(path))  # a folder of the user's, empty or not, stays
    return bool(inside) and all(stat_is_file(info) and f"{entry}/{rel}" in ours for rel, info in inside)


def stat_is_file(info: os.stat_result) -> bool:
    return stat.S_ISREG(info.st_mode)


def _prune(folder: Path) -> None:
    """Remove the empty folders below ``folder`` (and it, if left empty)."""
    if folder.is_symlink() or not folder.is_dir():
        return
    for top, _, _ in sorted(os.walk(folder, followlinks=False), key=lambda t: -len(Path(t[0]).parts)):
        remove_empty_folder(top)


def _swap_in(out: Path, option: str) -> None:
    """The complete new export in ``out/.export-tmp/new`` into ``out``: the earlier export's files that
    its card's ``sha256`` verifies (and the card) are set aside in ``.export-tmp/old``, the new ones
    moved in, the set-aside ones deleted. What else is in ``out`` stays and is named; a new entry
    that would land on it is refused before anything moves."""
    from lightning.pytorch.utilities import rank_zero_info

    staging = out / STAGING
    new_names = sorted(os.listdir(staging / _NEW))
    present = sorted(name for name in os.listdir(out) if name != STAGING)
    earlier = (out / CARD_FILE).is_file() and not (out / CARD_FILE).is_symlink()
    recorded = earlier_hashes(out, option) if earlier else Manifest(out)
    ours = [rel for rel in recorded if not rel.startswith(f"{STAGING}/") and recorded.verified(rel)]
    freed = {name for name in present if _freed(out, name, set(ours))} if earlier else set()
    kept = [name for name in present if name not in freed]
    clash = [name for name in new_names if name in kept]
    if clash:
        raise ExportError(
            f"{option} {out}: holds {clash[0]!r}, which the earlier export did not write (its {CARD_FILE} records "
            "no sha256 of it, or another) and this one would; move it away, or give another folder"
        )
    journal = {"old": {rel: recorded.entries[rel][HASHES] for rel in ours}, "card": earlier, "new": new_names}
    write_atomically(staging / _SWAP, json.dumps(journal, indent=1).encode())
    try:
        for rel in ours:
            set_aside(out / rel, staging / _OLD / rel, root=out)
            remove_emptied_folders(out / rel, stop=out)
        if earlier:
            set_aside(out / CARD_FILE, staging / _OLD / CARD_FILE, root=out)
        for name in freed:
            _prune(out / name)
    except (OSError, NotWrittenHere) as err:
        raise ExportError(
            f"{option} {out}: cannot set the earlier export aside ({err}); run the export again to complete it"
        ) from None
    try:
        _finish_swap(out, journal)
    except NotWrittenHere as err:
        raise ExportError(f"{option} {out}: {err}; move it away and run the export again to complete it") from None
    if kept:
        rank_zero_info(
            f"{option} {out}: replaced the earlier export; kept {', '.join(kept)}, which no export wrote "
            f"({CARD_FILE} records no sha256 of theirs)"
            if earlier
            else f"{option} {out}: kept {', '.join(kept)}"
        )


def _finish_swap(out: Path, journal: Mapping[str, Any]) -> None:
    """Move the new export's entries (``journal["new"]``, the card last) from ``.export-tmp/new`` into
    ``out``, then delete the earlier export set aside in ``.export-tmp/old``: the files whose sha256
    ``journal["old"]`` records, and the earlier card; ``journal`` goes last. Each step is skipped
    when done, so that a swap stopped anywhere completes."""
    staging = out / STAGING
    new, old = staging / _NEW, staging / _OLD
    names = [str(n) for n in journal["new"]]
    for name in sorted(names, key=lambda n: n == CARD_FILE):
        if not safe_relative(name) or "/" in name:
            raise NotWrittenHere(f"{staging / _SWAP} names {name!r}, which no export writes")
        if os.path.lexists(new / name):
            move_written(new / name, out / name)
    remove_empty_folder(new)
    aside = Manifest(old, {str(rel): {HASHES: str(digest)} for rel, digest in dict(journal["old"]).items()})
    for rel in aside:
        if remove_verified(aside, rel):
            remove_emptied_folders(old / rel, stop=old)
    if journal.get("card") and os.path.lexists(old / CARD_FILE):
        remove_written(old / CARD_FILE, root=old, names=(CARD_FILE,))
    _prune(old)
    remove_written(staging / _SWAP, root=staging, names=(_SWAP,))
    remove_empty_folder(staging)  # unless the lock is in it (its release removes it)


__all__ = [
    "CARD_FILE",
    "CARD_TEXT",
    "HASHES",
    "STAGING",
    "ExportError",
    "ExportLock",
    "check_out",
    "earlier_export",
    "earlier_hashes",
    "recover",
]
