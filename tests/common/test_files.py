"""Rule 1 (docs/failure_modes.md): no command removes or replaces a file it did not write. Every
removal and replacement of the package goes through lit_treegrpo.common.files, which refuses a link
on the way, a path outside its folder and a name the project does not write; and inputs are read
only up to a bound (rule 2)."""

from __future__ import annotations

import ast
import os
import socket
from pathlib import Path

import pytest

from lit_treegrpo.common.files import (
    FileTooLarge,
    NotARegularFile,
    NotWrittenHere,
    clear_written,
    fresh_folder,
    move_written,
    read_limited,
    read_text_limited,
    regular_file,
    remove_empty_folder,
    remove_written,
    remove_written_tree,
    replace_with_written,
)

REPO = Path(__file__).resolve().parents[2]
HELPER = REPO / "lit_treegrpo" / "common" / "files.py"
#: calls that remove, rename or replace a file, by the name called
REMOVALS = {"rmtree", "remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace", "move"}


def removals(source: str) -> list[tuple[int, str]]:
    """(line, call) of every call in ``source`` that may remove or replace a file. ``replace`` with
    two or more arguments, or keywords, is ``str.replace`` / ``dataclasses.replace`` unless it is
    ``os.replace``; ``Path.replace`` takes one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name not in REMOVALS:
            continue
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
        if name == "replace" and owner != "os" and (len(node.args) != 1 or node.keywords):
            continue
        if name == "remove" and owner not in ("os", "shutil"):
            continue  # list.remove / set.remove
        found.append((node.lineno, ast.unparse(func)))
    return found


def test_the_scan_finds_every_kind_of_removal() -> None:
    source = (
        "import os, shutil\n"
        "shutil.rmtree(p)\nos.remove(p)\nos.unlink(p)\npath.unlink()\nos.replace(a, b)\npath.replace(b)\n"
        "path.rename(b)\nos.rmdir(p)\nshutil.move(a, b)\n"
        "'x'.replace('a', 'b')\ndataclasses.replace(obj, a=1)\nitems.remove(3)\n"
    )
    assert [line for line, _ in removals(source)] == [2, 3, 4, 5, 6, 7, 8, 9, 10]


def test_every_removal_in_the_package_goes_through_the_one_helper() -> None:
    modules = sorted((REPO / "lit_treegrpo").rglob("*.py")) + sorted((REPO / "callbacks").rglob("*.py"))
    elsewhere = {
        str(path.relative_to(REPO)): found
        for path in modules
        if path != HELPER and (found := removals(path.read_text()))
    }
    assert not elsewhere, f"remove or replace files through lit_treegrpo.common.files only: {elsewhere}"
    # and the helper's every removal is guarded: each function that removes checks the path first
    tree = ast.parse(HELPER.read_text())
    for function in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        calls = {ast.unparse(c.func) for c in ast.walk(function) if isinstance(c, ast.Call)}
        if removals(ast.unparse(function)):
            guards = {
                "check_no_link",
                "Path(folder).is_symlink",
                "written.is_symlink",
                "target.is_symlink",
                "target.exists",
            }
            assert calls & guards, f"{function.name} removes without refusing a link"


def test_a_file_is_removed_only_in_its_folder_by_a_name_the_project_writes(tmp_path: Path) -> None:
    root = tmp_path / "run"
    (root / "samples").mkdir(parents=True)
    ours, theirs = root / "samples" / "step_000001.png", root / "samples" / "holiday.png"
    ours.write_bytes(b"grid")
    theirs.write_bytes(b"mine")
    assert remove_written(ours, root=root, names=("step_*.png",)) and not ours.exists()
    assert not remove_written(ours, root=root, names=("step_*.png",))  # already gone
    with pytest.raises(NotWrittenHere, match="writes no file of that name"):
        remove_written(theirs, root=root, names=("step_*.png",))
    outside = tmp_path / "step_000002.png"
    outside.write_bytes(b"elsewhere")
    with pytest.raises(NotWrittenHere, match="lies outside"):
        remove_written(outside, root=root, names=("step_*.png",))
    (root / "samples" / "step_x.png").mkdir()
    with pytest.raises(NotWrittenHere, match="is a folder"):
        remove_written(root / "samples" / "step_x.png", root=root, names=("step_*.png",))
    assert theirs.read_bytes() == b"mine" and outside.exists()


def test_nothing_is_removed_or_replaced_through_a_link(tmp_path: Path) -> None:
    root, target = tmp_path / "run", tmp_path / "elsewhere"
    root.mkdir()
    target.mkdir()
    (target / "last.ckpt").write_bytes(b"old run")
    (root / "checkpoints").symlink_to(target)
    with pytest.raises(NotWrittenHere, match="is a symbolic link"):
        remove_written(root / "checkpoints" / "last.ckpt", root=root, names=("*.ckpt",))
    with pytest.raises(NotWrittenHere, match="is a symbolic link"):
        clear_written(root / "checkpoints", root=root, names=("*.ckpt",))
    with pytest.raises(NotWrittenHere, match="is a symbolic link"):
        remove_written_tree(root / "checkpoints", root=root)
    (root / "new.tmp").write_bytes(b"new")
    (root / "last.ckpt").symlink_to(target / "last.ckpt")
    with pytest.raises(NotWrittenHere, match="is a symbolic link"):
        replace_with_written(root / "new.tmp", root / "last.ckpt")
    assert (target / "last.ckpt").read_bytes() == b"old run" and (root / "checkpoints").is_symlink()
    assert not remove_empty_folder(root / "checkpoints")  # a link is never taken for an empty folder


def test_clearing_keeps_other_names_and_links_and_removes_only_emptied_folders(tmp_path: Path) -> None:
    root = tmp_path / "run"
    board = root / "tensorboard" / "tiny_run"
    board.mkdir(parents=True)
    (board / "events.out.tfevents.1.host").write_bytes(b"e")
    (root / "tensorboard" / "config.yaml").write_text("a: 1")
    (root / "tensorboard" / "notes.txt").write_text("mine")
    (tmp_path / "outside.txt").write_text("outside")
    (root / "tensorboard" / "link").symlink_to(tmp_path / "outside.txt")
    names = ("events.out.tfevents.*", "config.yaml")
    kept = clear_written(root / "tensorboard", root=root, names=names)
    assert sorted(p.name for p in kept) == ["link", "notes.txt"]
    assert not board.exists() and (root / "tensorboard" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "outside.txt").read_text() == "outside"


def test_a_replacement_moves_a_new_file_beside_its_target_onto_nothing_foreign(tmp_path: Path) -> None:
    (tmp_path / ".last.ckpt.1.tmp").write_bytes(b"new")
    (tmp_path / "last.ckpt").write_bytes(b"old")
    replace_with_written(tmp_path / ".last.ckpt.1.tmp", tmp_path / "last.ckpt")
    assert (tmp_path / "last.ckpt").read_bytes() == b"new"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "new").write_bytes(b"x")
    with pytest.raises(NotWrittenHere, match="not beside"):
        replace_with_written(tmp_path / "sub" / "new", tmp_path / "elsewhere")
    (tmp_path / "staging").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(NotWrittenHere, match="a folder with files in it"):
        replace_with_written(tmp_path / "staging", tmp_path / "out")
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def test_a_move_never_lands_on_anything(tmp_path: Path) -> None:
    (tmp_path / "new").write_bytes(b"new")
    (tmp_path / "taken").write_bytes(b"the user's")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for target in ("taken", "dangling"):
        with pytest.raises(NotWrittenHere, match="already exists; this project does not write over it"):
            move_written(tmp_path / "new", tmp_path / target)
    move_written(tmp_path / "new", tmp_path / "sub_free")
    assert (tmp_path / "sub_free").read_bytes() == b"new" and (tmp_path / "taken").read_bytes() == b"the user's"


def test_a_fresh_folder_never_takes_a_name_that_exists(tmp_path: Path) -> None:
    assert fresh_folder(tmp_path, "predictions") == tmp_path / "predictions"
    (tmp_path / "predictions-2").write_text("a file of the user's")
    (tmp_path / "predictions-3").symlink_to(tmp_path / "nowhere")  # a dangling link also takes the name
    assert fresh_folder(tmp_path, "predictions") == tmp_path / "predictions-4"
    assert (tmp_path / "predictions-2").read_text() == "a file of the user's"
    assert os.path.islink(tmp_path / "predictions-3")


def test_a_file_is_read_only_up_to_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    path.write_bytes(b"x" * 101)
    assert read_limited(path, 101, "--data.prompts") == b"x" * 101
    with pytest.raises(FileTooLarge, match=rf"^--data.prompts: {path} is larger than 100 bytes, the most"):
        read_limited(path, 100, "--data.prompts")


def _special(kind: str, tmp_path: Path) -> Path:
    """A path in ``tmp_path`` with a ``kind`` of thing there that is no regular file."""
    path = tmp_path / f"prompts-{kind.replace(' ', '_')}.txt"
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "device":
        os.symlink("/dev/zero", path)  # a link to one: the status of what it points to decides
    elif kind == "folder":
        path.mkdir()
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()  # the socket file stays
    else:
        assert kind == "link to nothing"
        os.symlink(tmp_path / "gone", path)
    return path


@pytest.mark.parametrize("kind", ["FIFO", "device", "folder", "socket", "link to nothing"])
def test_what_is_no_regular_file_is_told_by_its_status_and_never_opened(tmp_path: Path, monkeypatch, kind: str) -> None:
    path = _special(kind, tmp_path)
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda *args, **kwargs: opened.append(args) or real_open(*args, **kwargs))
    there = "a symbolic link to nothing" if kind == "link to nothing" else f"a {kind}"
    wanted = "not a prompt file" if kind == "link to nothing" else "not a prompt file (a regular file)"
    with pytest.raises(NotARegularFile) as refused:
        regular_file(path, "a prompt file", "give a .txt file", option="--data.prompts")
    assert str(refused.value) == f"--data.prompts: {path} is {there}, {wanted}; give a .txt file"
    # every bounded read goes through it: one line naming the option, the path and what is there, no open
    for read in (read_limited, read_text_limited):
        with pytest.raises(NotARegularFile, match=rf"^--data.prompts: {path} is {there}, not a regular file; give"):
            read(path, 100, "--data.prompts")
    assert not opened
    assert regular_file(tmp_path / "missing.txt", "a prompt file", "") is False  # nothing there: the caller says so
    (tmp_path / "ok.txt").write_text("a cat\n")
    assert regular_file(tmp_path / "ok.txt") and read_limited(tmp_path / "ok.txt", 100, "--data.prompts") == b"a cat\n"
