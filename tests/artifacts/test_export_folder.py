"""Rule 1 (docs/failure_modes.md) for ``export``: it writes a new or empty folder; an earlier export
there is replaced only with ``--overwrite true``, and then only the files its card says it wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_treegrpo.artifacts.export import CARD_FILE, ExportError, _move_into_place, check_out


def _earlier(out: Path, files: list[str]) -> None:
    """An export's folder as ``export`` leaves it, its card listing ``files``."""
    out.mkdir(parents=True)
    for name in files:
        (out / name).write_bytes(b"old weights")
    (out / CARD_FILE).write_text(json.dumps({"files": files}))
    (out / "README.md").write_text("old card")


def _staged(folder: Path, files: list[str]) -> Path:
    folder.mkdir()
    for name in files:
        (folder / name).write_bytes(b"new weights")
    (folder / CARD_FILE).write_text(json.dumps({"files": files}))
    (folder / "README.md").write_text("new card")
    return folder


def test_an_earlier_export_is_replaced_only_with_overwrite_and_only_its_own_files(tmp_path: Path) -> None:
    out = tmp_path / "exp"
    _earlier(out, ["pytorch_lora_weights.safetensors", "ema"])
    (out / "notes.txt").write_text("the user's")
    with pytest.raises(
        ExportError,
        match=r"holds an earlier export \(export.json\); give a new or empty folder, or pass --overwrite true",
    ):
        check_out(out)
    assert check_out(out, overwrite=True) == out
    _move_into_place(_staged(tmp_path / ".exp.export-tmp", ["transformer"]), out, "--out")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", CARD_FILE, "notes.txt", "transformer"]
    assert (out / "notes.txt").read_text() == "the user's" and (out / "README.md").read_text() == "new card"
    assert not (tmp_path / ".exp.export-tmp").exists()


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
    assert (tmp_path / "secret").read_text() == "outside the export"


def test_a_new_file_never_lands_on_one_the_earlier_export_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "exp"
    _earlier(out, ["pytorch_lora_weights.safetensors"])
    (out / "ema").write_text("the user's file, named like an export's folder")
    staging = _staged(tmp_path / ".exp.export-tmp", ["pytorch_lora_weights.safetensors", "ema"])
    with pytest.raises(ExportError, match="holds 'ema', which the earlier export did not write and this one would"):
        _move_into_place(staging, out, "--out")
    assert (out / "ema").read_text().startswith("the user's") and (out / CARD_FILE).exists()


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
