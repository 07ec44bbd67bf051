"""Rule 1 (docs/failure_modes.md) for ``export``: it writes a new or empty folder; an earlier export
there is replaced only with ``--overwrite true``, and then only the files its card records with their
sha256 (an edited card cannot name a file of the user's); the new export is built beside the old one
and swapped in once complete, under a lock, in a staging folder of a short name."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from lit_treegrpo.artifacts import export_folder
from lit_treegrpo.artifacts.export import CARD_FILE, STAGING, ExportError, ExportLock, check_out, export
from lit_treegrpo.artifacts.export_folder import _swap_in
from lit_treegrpo.common.files import file_sha256


def _card(folder: Path, files: list[str], **extra: Any) -> None:
    """The card of the export in ``folder`` (its README written first), recording every file's sha256."""
    (folder / "README.md").write_text(f"card of {folder.name}")
    hashes = {p.relative_to(folder).as_posix(): file_sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}
    (folder / CARD_FILE).write_text(json.dumps({"files": files, "sha256": hashes, **extra}))


def _earlier(out: Path, files: list[str]) -> None:
    """An export's folder as ``export`` leaves it, its card listing ``files``."""
    out.mkdir(parents=True)
    for name in files:
        (out / name).write_bytes(b"old weights")
    _card(out, files)


def _staged(out: Path, files: list[str]) -> Path:
    """A complete new export, built where ``export`` builds it."""
    folder = out / STAGING / "new"
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_bytes(b"new weights")
    _card(folder, files)
    return folder


def test_an_earlier_export_is_replaced_only_with_overwrite_and_only_its_own_files(tmp_path: Path, caplog) -> None:
    out = tmp_path / "exp"
    _earlier(out, ["pytorch_lora_weights.safetensors", "ema"])
    (out / "notes.txt").write_text("the user's")
    with pytest.raises(
        ExportError,
        match=r"holds an earlier export \(export.json\); give a new or empty folder, or pass --overwrite true",
    ):
        check_out(out)
    assert check_out(out, overwrite=True) == out
    _staged(out, ["transformer"])
    caplog.set_level("INFO")
    _swap_in(out, "--out")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", CARD_FILE, "notes.txt", "transformer"]
    assert (out / "notes.txt").read_text() == "the user's" and (out / "README.md").read_text() == "card of new"
    assert not (out / STAGING).exists()
    assert f"--out {out}: replaced the earlier export; kept notes.txt, which no export wrote" in caplog.text


def test_an_edited_card_cannot_name_the_users_files(tmp_path: Path, caplog) -> None:
    # export --overwrite true once deleted whatever export.json's files listed: photos/ and notes.txt
    out = tmp_path / "exp"
    _earlier(out, ["pytorch_lora_weights.safetensors"])
    (out / "photos").mkdir()
    (out / "photos" / "cat.jpg").write_bytes(b"the user's photo")
    (out / "notes.txt").write_text("the user's notes")
    card = json.loads((out / CARD_FILE).read_text())
    card["files"] += ["photos", "notes.txt"]
    card["sha256"]["notes.txt"] = "0" * 64  # a hash made up for it
    (out / CARD_FILE).write_text(json.dumps(card))
    check_out(out, overwrite=True)
    _staged(out, ["pytorch_lora_weights.safetensors"])
    caplog.set_level("INFO")
    _swap_in(out, "--out")
    assert (out / "photos" / "cat.jpg").read_bytes() == b"the user's photo"
    assert (out / "notes.txt").read_text() == "the user's notes"
    assert (out / "pytorch_lora_weights.safetensors").read_bytes() == b"new weights"
    assert f"--out {out}: replaced the earlier export; kept notes.txt, photos, which no export wrote" in caplog.text


def test_an_export_whose_card_records_no_hashes_is_not_replaced(tmp_path: Path) -> None:
    out = tmp_path / "exp"
    _earlier(out, ["pytorch_lora_weights.safetensors"])
    (out / CARD_FILE).write_text(json.dumps({"files": ["pytorch_lora_weights.safetensors"]}))  # before hashes
    with pytest.raises(ExportError, match=r"records no sha256 of the files that export wrote \(an export from before"):
        check_out(out, overwrite=True)
    _earlier(tmp_path / "edited", ["pytorch_lora_weights.safetensors"])
    (tmp_path / "edited" / "README.md").write_text("my own notes on this export")
    with pytest.raises(ExportError, match="README.md there is not the one the earlier export wrote"):
        check_out(tmp_path / "edited", overwrite=True)
    assert (tmp_path / "edited" / "README.md").read_text() == "my own notes on this export"


def test_a_card_naming_a_path_or_nothing_is_refused_and_nothing_is_removed(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("outside the export")
    for card in ({"files": ["../secret"]}, {"files": "all"}, ["not", "a", "card"]):
        out = tmp_path / "exp"
        out.mkdir(exist_ok=True)
        (out / CARD_FILE).write_text(json.dumps(card))
        with pytest.raises(ExportError, match=rf"^--out {out}: {out / CARD_FILE} (lists|is not)"):
            check_out(out, overwrite=True)
    (out / CARD_FILE).write_text("{not json")
    with pytest.raises(ExportError, match="is not an export card"):
        check_out(out, overwrite=True)
    (out / CARD_FILE).write_text(json.dumps({"files": [], "sha256": {"../secret": "0" * 64}}))
    with pytest.raises(ExportError, match="records no sha256 of the files that export wrote"):
        check_out(out, overwrite=True)
    assert (tmp_path / "secret").read_text() == "outside the export"


def test_a_new_file_never_lands_on_one_the_earlier_export_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "exp"
    _earlier(out, ["pytorch_lora_weights.safetensors"])
    (out / "ema").write_text("the user's file, named like an export's folder")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    _staged(out, ["pytorch_lora_weights.safetensors", "ema"])
    with pytest.raises(ExportError, match="holds 'ema', which the earlier export did not write .* and this one would"):
        _swap_in(out, "--out")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # nothing moved


def test_a_second_export_into_a_folder_is_refused_while_one_writes_it(tmp_path: Path) -> None:
    out = tmp_path / "exp"
    lock = ExportLock(out)
    lock.take()  # an export in progress
    try:
        with pytest.raises(ExportError, match=rf"^--out {out}: another export is writing it \(pid {os.getpid()},"):
            check_out(out)
    finally:
        lock.release()
    assert not out.exists()  # the lock's folders go with it


class _Killed(BaseException):
    """The process killed at that point (nothing after it runs)."""


def test_an_export_stopped_while_it_swapped_in_is_completed_by_the_next(tmp_path: Path, monkeypatch, caplog) -> None:
    out = tmp_path / "exp"
    _earlier(out, ["pytorch_lora_weights.safetensors"])
    (out / "notes.txt").write_text("the user's")
    _staged(out, ["transformer"])

    def killed(out: Path, journal: Any) -> None:
        raise _Killed

    with monkeypatch.context() as patch:
        patch.setattr(export_folder, "_finish_swap", killed)
        with pytest.raises(_Killed):
            _swap_in(out, "--out")
    assert sorted(p.name for p in out.iterdir()) == [STAGING, "notes.txt"]  # the earlier export set aside
    caplog.set_level("INFO")
    assert check_out(out, overwrite=True) == out
    assert sorted(p.name for p in out.iterdir()) == ["README.md", CARD_FILE, "notes.txt", "transformer"]
    assert (out / "transformer").read_bytes() == b"new weights" and (out / "notes.txt").read_text() == "the user's"
    assert "completed the export into it that was stopped while it moved its files in" in caplog.text


@pytest.mark.parametrize("out", ["", "   "])
def test_an_empty_out_is_refused(out: str) -> None:
    with pytest.raises(ExportError, match="^--out: give the folder to write the export to"):
        check_out(out)


def test_out_as_a_link_is_refused_and_the_callback_names_its_own_option(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ExportError, match=r"is a symbolic link \(to .*real\); give the folder itself"):
        check_out(tmp_path / "link")
    _earlier(tmp_path / "exp", ["pytorch_lora_weights.safetensors"])
    with pytest.raises(ExportError, match=r"^ExportOnTrainEnd.out .*holds an earlier export"):
        check_out(tmp_path / "exp", option="ExportOnTrainEnd.out")


@pytest.fixture(scope="module")
def module() -> Any:
    from lit_treegrpo.core import TreeSpec
    from lit_treegrpo.models.tiny import TinySD3Adapter
    from lit_treegrpo.training.module import TreeGRPOModule

    return TreeGRPOModule(TinySD3Adapter(num_steps=4), "brightness", TreeSpec(4, branch_steps=(0,), branching=2))


def test_an_out_of_the_longest_legal_name_is_exported_and_replaced(module: Any, tmp_path: Path) -> None:
    # the staging folder was ".<name>.export-tmp" beside it: 266 characters, which no filesystem takes
    out = tmp_path / ("x" * 254)
    export(module, out)
    card = json.loads((out / CARD_FILE).read_text())
    written = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert set(card["sha256"]) == written - {CARD_FILE} and all(
        file_sha256(out / rel) == digest for rel, digest in card["sha256"].items()
    )
    (out / "notes.txt").write_text("the user's")
    export(module, out, overwrite=True, merged=True)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", CARD_FILE, "notes.txt", "transformer"]
    assert not (out / STAGING).exists() and not [p for p in tmp_path.iterdir() if p != out]


def test_export_overwrite_keeps_what_an_edited_card_lists(module: Any, tmp_path: Path, caplog) -> None:
    out = tmp_path / "exp"
    export(module, out)
    (out / "photos").mkdir()
    (out / "photos" / "cat.jpg").write_bytes(b"the user's photo")
    (out / "notes.txt").write_text("the user's notes")
    card = json.loads((out / CARD_FILE).read_text())
    card["files"] += ["photos", "notes.txt"]
    (out / CARD_FILE).write_text(json.dumps(card))
    caplog.set_level("INFO")
    export(module, out, overwrite=True, merged=True)
    assert (out / "photos" / "cat.jpg").read_bytes() == b"the user's photo"
    assert (out / "notes.txt").read_text() == "the user's notes"
    assert sorted(p.name for p in out.iterdir()) == ["README.md", CARD_FILE, "notes.txt", "photos", "transformer"]
    assert "replaced the earlier export; kept notes.txt, photos, which no export wrote" in caplog.text
