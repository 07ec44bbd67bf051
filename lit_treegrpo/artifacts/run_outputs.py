"""What a fit writes in its run folder, and what ``--overwrite true`` does with an earlier run's
files (see :mod:`.run_folder`'s docstring): the manifest that records them
(``<root>/.lit_treegrpo-written.json``), the fit's :class:`RunLock` that keeps it, and the earlier
run set aside in ``<root>/.set-aside/`` until the new fit's first checkpoint.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_info

from ..common.files import (
    MANIFEST_NAME,
    Manifest,
    NotWrittenHere,
    check_no_link,
    files_under,
    remove_emptied_folders,
    remove_empty_folder,
    remove_verified,
    set_aside,
)
from .locks import FolderLock, RunFolderError

#: the run sub-folders a fit writes, whose files ``--overwrite true`` sets aside
RUN_OUTPUTS = ("checkpoints", "tensorboard", "samples")
#: the names a fit writes in each of :data:`RUN_OUTPUTS` (sub-folders included): Lightning's
#: checkpoints, TensorBoard's event files, hyper-parameters and the config records, the sample
#: grids and trees (``step_000010.png``: the iteration's digits). A fit records in the manifest the
#: files of these names it writes; a file of another name is never the project's
RUN_OUTPUT_NAMES = {
    "checkpoints": ("*.ckpt",),
    "tensorboard": ("events.out.tfevents.*", "config.yaml", "config-*.yaml", "hparams.yaml"),
    "samples": ("step_[0-9]*.png", "step_[0-9]*.gif", "tree_[0-9]*.png"),
}
#: where ``--overwrite true`` sets the earlier run's files aside until the new fit's first checkpoint
SET_ASIDE = ".set-aside"
#: event files are appended to after they are recorded: their recorded bytes must still lead them
_GROWS = ("events.out.tfevents.*",)
#: the most files a message names
_NAMED = 20


def _written_name(rel: str) -> bool:
    """Whether ``rel`` (``checkpoints/last.ckpt``) has a name a fit writes in its sub-folder."""
    output, _, rest = rel.partition("/")
    name = rest.rsplit("/", 1)[-1]
    return bool(rest) and any(fnmatch.fnmatchcase(name, p) for p in RUN_OUTPUT_NAMES.get(output, ()))


def _in_the_way(rel: str) -> bool:
    """Whether a new fit writes at ``rel`` itself, or into its file: ``checkpoints/last.ckpt`` (else
    Lightning writes ``last-v1.ckpt`` beside it), the sample grids and trees, named by the iteration
    only, and an event file in ``tensorboard/`` itself (a run's from before runs were named, whose
    curves the new run's would continue)."""
    top = rel.count("/") == 1 and _written_name(rel)
    return rel == "checkpoints/last.ckpt" or (top and rel.startswith(("samples/", "tensorboard/events.")))


def _output_files(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """``(rel, lstat)`` of every file (and link) in the run sub-folders of ``root``."""
    for output in RUN_OUTPUTS:
        for rel, info in files_under(root / output):
            yield f"{output}/{rel}", info


def _key(info: os.stat_result) -> tuple[int, int, int]:
    return info.st_ino, info.st_size, info.st_mtime_ns


def _names(root: Path, rels: list[str]) -> str:
    shown = ", ".join(rels[:_NAMED])
    return shown + (f" and {len(rels) - _NAMED} more" if len(rels) > _NAMED else "")


def _count(n: int, what: str = "file") -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _not_recorded(root: Path, rels: list[str]) -> str:
    return (
        f"--overwrite true: {root} holds {_names(root, rels)}, where the new run writes, and "
        f"{'it is' if len(rels) == 1 else 'they are'} not recorded in {root / MANIFEST_NAME} as written by a fit "
        "there (with its sha256: a run from before manifests, or a file put there or changed since); "
        "this project moves or deletes only what it wrote: move "
        f"{'it' if len(rels) == 1 else 'them'} away yourself (or train into another "
        "--trainer.default_root_dir) and run again"
    )


def _where(root: str | Path) -> str:
    return os.path.realpath(root)


def clear_run(root: Path) -> list[Path]:
    """``--overwrite true``, once the new run is built: set the earlier run's files in ``root``
    aside (:meth:`RunLock.set_aside_earlier_run`; this process must hold the folder's lock); returns
    the files kept in place, which the manifest does not verify."""
    lock = _HELD.get(_where(root))
    if lock is None:
        raise RunFolderError(f"--overwrite true: {root} is not locked by this process; take its RunLock first")
    return lock.set_aside_earlier_run()


def checkpoint_saved(path: str | Path) -> None:
    """A checkpoint was written to ``path``: the fit that holds its run folder's lock in this process
    records what it wrote, and deletes an earlier run it set aside (:class:`RunLock`)."""
    lock = _HELD.get(_where(Path(path).parent.parent))
    if lock is not None and Path(path).parent.name == "checkpoints":
        lock.checkpoint_saved()


def remove_checkpoint(path: str | Path) -> bool | None:
    """Remove the checkpoint ``path`` (Lightning's ``ModelCheckpoint`` replacing a top-k file) if
    the manifest of its run folder verifies it; ``None`` when no fit of this process holds that
    folder (the caller removes it its own way)."""
    path = Path(path)
    lock = _HELD.get(_where(path.parent.parent))
    if lock is None or path.parent.name != "checkpoints":
        return None
    return lock.remove_checkpoint(path)


#: the run folders locked by this process (by real path): their fits' checkpoints report to them
_HELD: dict[str, RunLock] = {}


class RunLock(FolderLock):
    """``<root>/.fit.lock`` while a fit writes into ``root``, and what that fit writes there (see
    the module docstring).

    Besides the lock (:class:`FolderLock`), it notes the run files already in the folder when it
    is taken, so that :meth:`record` can add to the manifest exactly the files this fit wrote (new
    or changed since), and it holds an earlier run set aside by ``--overwrite true``
    (:meth:`set_aside_earlier_run`) until :meth:`checkpoint_saved` deletes it, or :meth:`release`
    (at the end of the command) deletes it after a fit that ended well or puts it back after one
    that failed before its first checkpoint."""

    def __init__(self, root: str | Path) -> None:
        super().__init__(root)
        self._before: dict[str, tuple[int, int, int]] = {}  # the run files there when the lock was taken
        self._recorded: dict[str, tuple[int, int, int]] = {}  # the files this fit recorded, as recorded
        self._aside: int | None = None  # the number of files set aside, while they are
        self._checkpoints: set[str] = set()  # the checkpoints this fit wrote

    def acquire(self) -> None:
        super().acquire()
        self._before = {rel: _key(info) for rel, info in _output_files(self.root)}
        _HELD[_where(self.root)] = self

    # ------------------------------------------------------------------ the manifest
    def record(self) -> None:
        """Add to the manifest the run files this fit wrote since the lock was taken (new, or
        changed since it was taken or last recorded), and drop the entries of files gone."""
        manifest = Manifest.read(self.root)
        changed = manifest.unreadable is not None and os.path.lexists(manifest.path)
        for rel, info in _output_files(self.root):
            if not stat.S_ISREG(info.st_mode) or not _written_name(rel):
                continue
            key = _key(info)
            if self._before.get(rel) == key or self._recorded.get(rel) == key:
                continue
            try:
                manifest.record(rel, grows=any(fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], p) for p in _GROWS))
            except (OSError, NotWrittenHere):
                continue  # gone meanwhile
            self._recorded[rel] = key
            if rel.startswith("checkpoints/"):
                self._checkpoints.add(rel)
            changed = True
        gone = [rel for rel in manifest if not os.path.lexists(self.root / rel)]
        manifest.forget(gone)
        if changed or gone:
            manifest.save()

    def checkpoint_saved(self) -> None:
        """A checkpoint of this fit is written: record it (and the rest written so far); the
        earlier run set aside, if any, is deleted now."""
        try:
            self.record()
            if self._aside is not None:
                self._delete_set_aside("this fit wrote its first checkpoint")
        except (OSError, NotWrittenHere) as err:  # the checkpoint is written: the run goes on
            rank_zero_info(f"--trainer.default_root_dir: {self.root}: cannot update what this fit wrote: {err}")

    def remove_checkpoint(self, path: Path) -> bool:
        """Remove the checkpoint ``path`` if the manifest verifies it (a fit wrote it, unchanged);
        else keep it, and say so."""
        rel = f"checkpoints/{path.name}"
        self.record()
        manifest = Manifest.read(self.root)
        if remove_verified(manifest, rel):
            manifest.forget([rel])
            manifest.save()
            self._checkpoints.discard(rel)
            return True
        if os.path.lexists(path):
            rank_zero_info(
                f"kept {path}, which the checkpoint callback replaces: it is not recorded in "
                f"{manifest.path} as a fit wrote it"
            )
        return False

    # ------------------------------------------------------------------ --overwrite true
    def set_aside_earlier_run(self) -> list[Path]:
        """Rename the earlier run's files (those the manifest verifies) into ``<root>/.set-aside/``,
        the manifest's entries with them; the others stay and are named. Returns those kept."""
        root, aside = self.root, self.root / SET_ASIDE
        try:
            for name in (*RUN_OUTPUTS, SET_ASIDE):
                check_no_link(root / name, root)  # a link made since the check before the model loaded
        except NotWrittenHere as err:
            raise RunFolderError(f"--overwrite true: {err}") from None
        if os.path.lexists(aside):
            raise RunFolderError(
                f"--overwrite true: {aside} exists, where this fit would set the earlier run aside; move it away "
                "and run again"
            )
        manifest = Manifest.read(root)
        ours: list[str] = []
        kept: list[str] = []
        for rel, info in _output_files(root):
            (ours if stat.S_ISREG(info.st_mode) and manifest.verified(rel) else kept).append(rel)
        in_the_way = [rel for rel in kept if _in_the_way(rel)]
        if in_the_way:
            raise RunFolderError(_not_recorded(root, in_the_way))
        if ours:
            manifest.subset(ours, folder=aside).save()  # first: what lies in .set-aside is known
            self._aside = 0
            try:
                for rel in ours:
                    set_aside(root / rel, aside / rel, root=root)
                    self._aside += 1
                    remove_emptied_folders(root / rel, stop=root)
            except (OSError, NotWrittenHere) as err:
                back, _ = put_back(root)
                self._aside = None
                raise RunFolderError(
                    f"--overwrite true: cannot set the earlier run aside in {aside} ({err}); put its "
                    f"{_count(len(back))} back, nothing deleted"
                ) from None
            manifest.forget(ours)
            manifest.save()
        said = (
            f"--overwrite true: set the earlier run's {_count(len(ours))} aside in {aside} until this fit writes "
            "its first checkpoint (then they are deleted; if it fails before, they are put back)"
            if ours
            else f"--overwrite true: {root} holds no files of an earlier run to set aside"
        )
        if kept:
            said += (
                f"; kept {_count(len(kept))} the earlier run did not write (not in {MANIFEST_NAME} with their "
                f"sha256): {_names(root, kept)}"
            )
        rank_zero_info(said)
        return [root / rel for rel in kept]

    def _delete_set_aside(self, why: str) -> None:
        count = self._aside or 0
        self._aside = None
        left = delete_set_aside(self.root)
        said = (
            f"--overwrite true: {why}; deleted the earlier run's {_count(count)} set aside in {self.root / SET_ASIDE}"
        )
        if left:
            said += f"; kept {_names(self.root, left)} there, which no fit wrote"
        rank_zero_info(said)

    def _put_back(self) -> None:
        """The fit failed before its first checkpoint: remove what it wrote, put the earlier run back."""
        count = self._aside or 0
        self._aside = None
        manifest = Manifest.read(self.root)
        mine = [rel for rel in sorted(self._recorded) if rel in manifest]
        removed = []
        for rel in mine:
            if remove_verified(manifest, rel):
                removed.append(rel)
                remove_emptied_folders(self.root / rel, stop=self.root)
        manifest.forget(removed)
        manifest.save()
        back, blocked = put_back(self.root)
        said = (
            f"--overwrite true: this fit stopped before its first checkpoint; put the earlier run's "
            f"{_count(len(back))} back in {self.root}"
            + (f" and removed the {_count(len(removed))} this fit wrote" if removed else "")
        )
        if blocked or len(back) < count:
            said += f"; {_names(self.root, blocked)} stay in {self.root / SET_ASIDE} (a file of the same name is in the way)"
        rank_zero_info(said)

    def release(self) -> None:
        """Record what this fit wrote; an earlier run still set aside is deleted when the command
        ends well or this fit wrote a checkpoint, and put back when it fails before one (read from
        the exception in flight: the CLI releases in a ``finally``); then the lock goes."""
        if not self.held:
            return
        failed = sys.exc_info()[0] is not None
        try:
            self.record()
            if self._aside is not None:
                if failed and not self._checkpoints:
                    self._put_back()
                else:
                    self._delete_set_aside("this fit " + ("wrote a checkpoint" if self._checkpoints else "ended"))
        except (OSError, NotWrittenHere, RunFolderError) as err:  # never hide the error in flight
            rank_zero_info(
                f"--trainer.default_root_dir: {self.root}: cannot finish what this fit wrote ({err}); the next fit "
                "there does"
            )
        finally:
            _HELD.pop(_where(self.root), None)
            super().release()


def put_back(root: Path) -> tuple[list[str], list[str]]:
    """Move the files of ``<root>/.set-aside`` that its manifest verifies back to their places in
    ``root`` (and their entries back into ``root``'s manifest); returns those put back and those
    that stay because something lies at their place. ``.set-aside`` goes once it is empty."""
    aside = root / SET_ASIDE
    held = Manifest.read(aside)
    manifest = Manifest.read(root)
    back: list[str] = []
    blocked: list[str] = []
    for rel in held:
        entry = held.entries[rel]
        if not held.verified(rel):
            if Manifest(root, {rel: entry}).verified(rel):
                manifest.entries[rel] = entry  # put back before a kill, its entry not yet
            continue
        if os.path.lexists(root / rel):
            blocked.append(rel)
            continue
        set_aside(aside / rel, root / rel, root=root)
        remove_emptied_folders(aside / rel, stop=aside)
        manifest.entries[rel] = entry
        back.append(rel)
    manifest.save()
    held.forget([rel for rel in held if rel not in blocked])
    held.save()
    remove_empty_folder(aside)
    return back, blocked


def delete_set_aside(root: Path) -> list[str]:
    """Delete the files of ``<root>/.set-aside`` that its manifest verifies, then the folders left
    empty; returns what stays there (no fit wrote it)."""
    aside = root / SET_ASIDE
    held = Manifest.read(aside)
    for rel in held:
        if remove_verified(held, rel):
            remove_emptied_folders(aside / rel, stop=aside)
    held.forget(list(held))
    held.save()
    left = [f"{SET_ASIDE}/{rel}" for rel, _ in files_under(aside)]
    remove_empty_folder(aside)
    return left


def recover_set_aside(root: Path) -> None:
    """``<root>/.set-aside`` left by an ``--overwrite`` fit that was killed: deleted when the new run
    had written its first checkpoint (the manifest verifies a checkpoint other than those set aside),
    else put back; a file in the way of one to put back is refused in one line. Under the folder's
    lock (a live fit there is refused, :class:`RunLock`)."""
    aside = root / SET_ASIDE
    try:
        check_no_link(aside, root)
    except NotWrittenHere as err:
        raise RunFolderError(f"--trainer.default_root_dir: {err}") from None
    lock = RunLock(root)
    lock.acquire()
    try:
        _recover(root, aside)
    except NotWrittenHere as err:  # a link made in the run folder meanwhile
        raise RunFolderError(f"--trainer.default_root_dir: {err}") from None
    finally:
        lock.release()


def _recover(root: Path, aside: Path) -> None:
    """Under the lock: put the set-aside run back, or delete it after the new run's checkpoint."""
    held = Manifest.read(aside)
    if not held and not any(True for _ in files_under(aside)):
        remove_empty_folder(aside)
        return
    if not held:
        why = held.unreadable or f"no {MANIFEST_NAME} in it"
        raise RunFolderError(
            f"--trainer.default_root_dir: {aside} is not a run set aside by this project ({why}); move it away "
            "and run again"
        )
    manifest = Manifest.read(root)
    new_checkpoint = any(
        rel.startswith("checkpoints/") and held.entries.get(rel) != manifest.entries[rel] and manifest.verified(rel)
        for rel in manifest
    )
    if new_checkpoint:
        left = delete_set_aside(root)
        said = (
            f"--trainer.default_root_dir: deleted the earlier run that a fit with --overwrite true set aside in "
            f"{aside}; that fit wrote its checkpoint before it stopped"
        )
        rank_zero_info(said + (f"; kept {_names(root, left)} there, which no fit wrote" if left else ""))
        return
    back, blocked = put_back(root)
    if blocked:
        raise RunFolderError(
            f"--trainer.default_root_dir: {aside} holds the earlier run that a fit with --overwrite true set "
            f"aside and was stopped before its first checkpoint; {_names(root, blocked)} cannot go back, as files "
            "of the same names lie there (written by that fit, or since): delete those and run again to get the "
            f"earlier run back, or delete {aside} to keep what lies there"
        )
    rank_zero_info(
        f"--trainer.default_root_dir: put back in {root} the earlier run's {_count(len(back))} that a fit with "
        "--overwrite true set aside and was stopped before its first checkpoint"
    )


__all__ = [
    "RUN_OUTPUTS",
    "RUN_OUTPUT_NAMES",
    "SET_ASIDE",
    "RunLock",
    "checkpoint_saved",
    "clear_run",
    "delete_set_aside",
    "put_back",
    "recover_set_aside",
    "remove_checkpoint",
]
