"""Checkpoint files: a write interrupted by an error or a SIGKILL leaves the previous checkpoint
intact, and truncated or garbage files are reported in one line before any model loads."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lit_treegrpo.artifacts.checkpoint import AtomicCheckpointIO, CorruptCheckpointError, atomic_save, check_checkpoint
from tests.artifacts.test_safe_reads import ShellMarker, hostile_checkpoint

REPO = Path(__file__).resolve().parents[2]


def _state(step: int, size: int = 1000) -> dict:
    return {"step": step, "w": torch.arange(size, dtype=torch.float32) * step}


def test_a_write_that_fails_halfway_leaves_the_previous_checkpoint_intact(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "checkpoints" / "last.ckpt"
    io_plugin = AtomicCheckpointIO()
    io_plugin.save_checkpoint(_state(1), path)
    before = path.read_bytes()
    real_save = torch.save

    def half_then_fail(obj, f):  # the disk fills up halfway through the new checkpoint
        buffer = io.BytesIO()
        real_save(obj, buffer)
        f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", half_then_fail)
    with pytest.raises(OSError) as raised:
        io_plugin.save_checkpoint(_state(2, size=100_000), path)
    monkeypatch.undo()
    assert str(raised.value) == (
        f"cannot write the checkpoint {path}: No space left on device (ENOSPC); free space on that disk, "
        "or choose a folder on another one (the previous last.ckpt is intact)"
    )
    assert path.read_bytes() == before  # bitwise the previous checkpoint
    assert io_plugin.load_checkpoint(path)["step"] == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]  # the partial file is gone


def test_a_full_disk_reported_by_torchs_zip_writer_is_one_oserror(tmp_path: Path, monkeypatch) -> None:
    # on a real full disk torch.save raises a RuntimeError ("unexpected pos ...") while closing the
    # archive, in the handling of the file's OSError; a RuntimeError alone is no disk problem
    def full_disk(obj, f):
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            # as torch raises it: without `from`, the OSError only in its __context__
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # noqa: B904

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(
        OSError,
        match=r"cannot write the checkpoint .*last.ckpt: No space left on device \(ENOSPC\).*\(no last.ckpt was written\)",
    ):
        atomic_save(_state(1), tmp_path / "last.ckpt")

    def bug(obj, f):
        raise RuntimeError("a bug in torch.save")

    monkeypatch.setattr(torch, "save", bug)
    with pytest.raises(RuntimeError, match="a bug in torch.save"):
        atomic_save(_state(1), tmp_path / "last.ckpt")
    assert list(tmp_path.iterdir()) == []


_KILLED_WRITER = """
import io, sys, time, torch
from pathlib import Path
from lit_treegrpo.artifacts.checkpoint import AtomicCheckpointIO
path, marker = Path(sys.argv[1]), Path(sys.argv[2])
plugin = AtomicCheckpointIO()
plugin.save_checkpoint({"step": 1, "w": torch.arange(1000.0)}, path)
real_save = torch.save
def stall(obj, f):  # write half of the new checkpoint, then wait to be killed
    buffer = io.BytesIO()
    real_save(obj, buffer)
    f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    f.flush()
    marker.touch()
    time.sleep(600)
torch.save = stall
plugin.save_checkpoint({"step": 2, "w": torch.zeros(200_000)}, path)
"""


@pytest.mark.slow  # a real process killed mid-write
def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    path, marker = tmp_path / "checkpoints" / "last.ckpt", tmp_path / "writing"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(path), str(marker)],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the writer never started its second checkpoint"
        time.sleep(0.02)
    before = path.read_bytes()  # the first checkpoint, complete: it was renamed into place
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    partial = [p for p in path.parent.iterdir() if p.name != "last.ckpt"]
    assert len(partial) == 1 and partial[0].name.startswith(".last.ckpt.") and partial[0].stat().st_size > 0
    assert path.read_bytes() == before
    check_checkpoint(path)  # complete, every CRC right
    assert torch.load(path, weights_only=True)["step"] == 1
    AtomicCheckpointIO().save_checkpoint(_state(3), path)  # the next save clears the killed one's file
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]
    assert torch.load(path, weights_only=True)["step"] == 3


def _corrupt(tmp_path: Path, kind: str) -> Path:
    folder = tmp_path / "checkpoints"
    folder.mkdir(parents=True)
    # an earlier checkpoint to point at, and two that advice must never name: a hostile pickle and a
    # truncated file
    torch.save({"state_dict": _state(1), "pytorch-lightning_version": "2.6.6"}, folder / "epoch=0-step=2.ckpt")
    hostile_checkpoint(folder / "epoch=0-step=1.ckpt", tmp_path / "marker", ShellMarker)
    (folder / "epoch=0-step=3.ckpt").write_bytes((folder / "epoch=0-step=2.ckpt").read_bytes()[:300])
    path = folder / "last.ckpt"
    if kind == "truncated":
        torch.save(_state(2, size=10_000), path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif kind == "garbage":
        path.write_bytes(b"this is not a checkpoint\n" * 40)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "bit flip":
        torch.save(_state(2, size=10_000), path)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF  # inside the tensor data: the zip directory is still fine
        path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("truncated", "without a complete zip directory"),
        ("garbage", "1000 bytes without a complete zip directory: File is not a zip file"),
        ("empty", "the file is empty"),
        ("bit flip", "fails its CRC check"),
    ],
)
def test_a_corrupt_checkpoint_is_reported_with_the_file_and_the_fix(tmp_path: Path, kind: str, problem: str) -> None:
    path = _corrupt(tmp_path, kind)
    with pytest.raises(CorruptCheckpointError) as err:
        check_checkpoint(path)
    message = str(err.value)
    assert message.startswith(f"--ckpt_path: {path} is truncated or corrupt (")
    assert problem in message
    # only the file that reads as a checkpoint is suggested, never the hostile or the truncated one
    assert message.endswith(
        f"); delete it and resume from an earlier checkpoint that reads as intact ({path.parent / 'epoch=0-step=2.ckpt'}), "
        "or start over without --ckpt_path"
    )
    assert "step=1" not in message and "step=3" not in message and "\n" not in message
    assert not (tmp_path / "marker").exists()  # nothing of the hostile file ran


def test_advice_names_no_checkpoint_when_none_reads_as_intact(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    hostile_checkpoint(folder / "other.ckpt", tmp_path / "marker", ShellMarker)
    torch.save({"w": torch.zeros(2)}, folder / "plain.ckpt")  # a torch file, but no Lightning checkpoint
    (folder / "last.ckpt").write_bytes(b"garbage" * 10)
    with pytest.raises(CorruptCheckpointError) as err:
        check_checkpoint(folder / "last.ckpt")
    assert f"resume from an earlier checkpoint (none in {folder} reads as intact)" in str(err.value)
    assert "other.ckpt" not in str(err.value) and "plain.ckpt" not in str(err.value)
    assert not (tmp_path / "marker").exists()


def test_the_plugin_refuses_to_load_a_corrupt_file(tmp_path: Path) -> None:
    path = _corrupt(tmp_path, "truncated")
    with pytest.raises(CorruptCheckpointError, match="is truncated or corrupt"):
        AtomicCheckpointIO().load_checkpoint(path)


def test_the_cli_installs_atomic_checkpoints_unless_given_its_own(tmp_path: Path) -> None:
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    from lit_treegrpo.cli import TreeGRPOCLI

    tiny = str(REPO / "configs" / "tiny.yaml")
    cli = TreeGRPOCLI(args=["--config", tiny, "--trainer.default_root_dir", str(tmp_path)], run=False)
    assert type(cli.trainer.strategy.checkpoint_io) is AtomicCheckpointIO
    own = '{"class_path": "lightning.pytorch.plugins.io.TorchCheckpointIO"}'
    cli = TreeGRPOCLI(
        args=["--config", tiny, "--trainer.plugins", own, "--trainer.default_root_dir", str(tmp_path)], run=False
    )
    assert type(cli.trainer.strategy.checkpoint_io) is TorchCheckpointIO
