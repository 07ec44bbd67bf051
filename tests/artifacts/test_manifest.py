"""What the project may delete is what its manifest verifies: the path and the content's sha256 it
recorded when it wrote the file (lit_treegrpo.common.files.Manifest), never a name alone."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from lit_treegrpo.common.files import MANIFEST_NAME, HashingWriter, Manifest, file_sha256, remove_verified


def test_a_file_is_the_projects_only_with_the_content_it_recorded(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    ours, theirs = tmp_path / "checkpoints" / "last.ckpt", tmp_path / "checkpoints" / "keep_me.ckpt"
    ours.write_bytes(b"weights")
    theirs.write_bytes(b"the user's")
    manifest = Manifest(tmp_path)
    manifest.record("checkpoints/last.ckpt")
    manifest.entries["checkpoints/keep_me.ckpt"] = {"sha256": "0" * 64}  # a manifest edited by hand
    manifest.save()
    read = Manifest.read(tmp_path)
    assert read.verified("checkpoints/last.ckpt") and not read.verified("checkpoints/keep_me.ckpt")
    assert not remove_verified(read, "checkpoints/keep_me.ckpt") and theirs.read_bytes() == b"the user's"
    ours.write_bytes(b"weights, edited")  # changed since it was written: no longer the project's
    assert not read.verified("checkpoints/last.ckpt") and not remove_verified(read, "checkpoints/last.ckpt")
    ours.write_bytes(b"weights")
    assert remove_verified(read, "checkpoints/last.ckpt") and not ours.exists()


def test_a_manifest_names_only_files_inside_its_folder_reached_through_no_link(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"outside")
    root = tmp_path / "run"
    root.mkdir()
    (root / "link").symlink_to(tmp_path / "secret")
    digest = file_sha256(tmp_path / "secret")
    (root / MANIFEST_NAME).write_text(
        json.dumps(
            {"files": {"../secret": {"sha256": digest}, "/etc/passwd": {"sha256": digest}, "link": {"sha256": digest}}}
        )
    )
    read = Manifest.read(root)
    assert list(read) == ["link"] and not read.verified("link")  # the paths outside were never read in
    (root / MANIFEST_NAME).write_text("{not json")
    assert not Manifest.read(root) and Manifest.read(root).unreadable  # unreadable: nothing is the project's


def test_an_event_file_appended_to_after_it_was_recorded_is_still_the_projects(tmp_path: Path) -> None:
    events = tmp_path / "events.out.tfevents.1.host"
    events.write_bytes(b"first records")
    manifest = Manifest(tmp_path)
    manifest.record(events.name, grows=True)
    with open(events, "ab") as f:
        f.write(b", then more (a fit killed before it recorded them)")
    assert manifest.verified(events.name)
    events.write_bytes(b"first recordz and more")  # its recorded bytes changed: not the project's
    assert not manifest.verified(events.name)
    manifest.record("events.out.tfevents.1.host")  # a file that does not grow must keep its size too
    with open(events, "ab") as f:
        f.write(b"!")
    assert not manifest.verified(events.name)


def test_a_checkpoints_hash_is_taken_as_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    with open(path, "wb") as f:
        hashing = HashingWriter(f)
        torch.save({"w": torch.arange(1000.0)}, hashing)
    hashing.remember(path)
    assert file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
