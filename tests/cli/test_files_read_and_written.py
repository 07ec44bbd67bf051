"""Every entry point gets the same rules (issue "Found by a fuzzer"): a FIFO or a device where a file is read is
refused by its status, in one line naming the option, instead of a read that waits or runs for ever; a write the
disk refuses (full, read-only, a file where a folder goes) is one line naming the path and the fix, not
TensorBoard's thread traceback; and ``validate`` prints its results before such a failure is said."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from PIL import Image
from tensorboard.compat.tensorflow_stub.io import gfile

from tests.cli.test_cli import QUIET, TINY, _log_to_this_stderr, _main_error, run_cli

#: generous: each case fails before any model loads (seconds); a read of a FIFO never ends
NO_HANG_S = 120
FULL = "No space left on device (ENOSPC); free space on that disk, or choose a folder on another one"


def _one_error_line(result) -> str:
    """The one ``error:`` line a real process printed last, with status 2 and no traceback."""
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == lines[-1:], result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "usage:" not in result.stderr
    return errors[0]


@pytest.mark.parametrize(
    ("where", "option", "noun"),
    [
        ("--config", "--config", "a config file"),
        ("--data.prompts", "--data.prompts", "a prompt file"),
        # the check of the command line's, where a config sets it
        pytest.param("a config's data.prompts", "--data.prompts", "a prompt file", marks=pytest.mark.slow),
        ("--ckpt_path", "--ckpt_path", "a checkpoint file"),
        # <root>/checkpoints/last.ckpt a FIFO (the check of the given path's)
        pytest.param("--ckpt_path last", "--ckpt_path last", "a checkpoint file", marks=pytest.mark.slow),
        # a section's value, which the parser itself would read as a config file (it takes FIFOs on purpose)
        ("--data", "--data", "a regular file"),
        # /dev/zero, whose read never ends (the check of the FIFO's)
        pytest.param("--ckpt_path a device", "--ckpt_path", "a checkpoint file", marks=pytest.mark.slow),
    ],
)
def test_a_fifo_or_device_where_a_file_is_read_is_refused_in_one_line(
    tmp_path: Path, where: str, option: str, noun: str
) -> None:
    root = tmp_path / "run"
    fifo = root / "checkpoints" / "last.ckpt" if where == "--ckpt_path last" else tmp_path / "input.yaml"
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    path, kind = ("/dev/zero", "a device") if where.endswith("device") else (str(fifo), "a FIFO")
    given = option.split() + ([] if where == "--ckpt_path last" else [path])
    if where.startswith("a config's"):
        config = tmp_path / "prompts.yaml"
        config.write_text(f"data:\n  prompts: {path}\n")
        given = ["--config", str(config)]
    before = sorted(tmp_path.rglob("*"))
    result = run_cli("fit", "--config", str(TINY), *given, *QUIET, root=root, timeout=NO_HANG_S)
    line = _one_error_line(result)
    assert line.startswith(f"error: {option}: {path} is {kind}, not {noun}"), line
    assert sorted(tmp_path.rglob("*")) == before  # refused before the run took (or created) its folder


def _full_event_disk(monkeypatch) -> None:
    """TensorBoard's event files land on a full disk: the write of their bytes fails as ``write`` does then, with
    ENOSPC and no file name (from TensorBoard's writer thread)."""
    write = gfile.LocalFileSystem._write

    def full(self, filename, file_content, mode):
        if "events.out.tfevents" in str(filename):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(self, filename, file_content, mode)

    monkeypatch.setattr(gfile.LocalFileSystem, "_write", full)


def test_a_full_disk_under_tensorboard_is_one_line_naming_the_event_folder(tmp_path, capsys, monkeypatch) -> None:
    _full_event_disk(monkeypatch)
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--trainer.max_steps", "1",
                       "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    # no "Exception in thread" traceback of the writer thread (_main_error: no "Traceback" at all)
    folder = tmp_path / "tensorboard" / "tinysd3_tree-k2_mean_brightness"
    assert line.startswith(f"error: cannot write the TensorBoard events in {folder}: {FULL}"), line


def test_a_png_the_full_disk_refuses_is_one_line_naming_the_run_folder(tmp_path, capsys, monkeypatch) -> None:
    save = Image.Image.save

    def full(self, fp, *args, **kwargs):  # PIL writes a PNG to disk: the write fails, naming no file
        if isinstance(fp, (str, os.PathLike)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return save(self, fp, *args, **kwargs)  # TensorBoard's in-memory PNGs

    monkeypatch.setattr(Image.Image, "save", full)
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--trainer.max_steps", "1",
                       "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert line.startswith(
        f"error: fit could not write its outputs in {tmp_path} (--trainer.default_root_dir): {FULL}"
    ), line


def test_validate_prints_its_results_before_a_failed_write_is_said(tmp_path, capsys, monkeypatch) -> None:
    from lit_treegrpo.cli import DEBUG_ENV, main

    _full_event_disk(monkeypatch)
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    _log_to_this_stderr(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "--config", str(TINY), *QUIET, "--trainer.default_root_dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2, err[-2000:]
    assert "Reward/held_out" in out and "val/reward" in out, out  # the results, printed
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == err.strip().splitlines()[-1:] and "Traceback" not in err, err[-2000:]
    folder = tmp_path / "tensorboard" / "tinysd3_tree-k2_mean_brightness"
    assert errors[0].startswith(
        f"error: cannot write the TensorBoard events in {folder}: {FULL} (validate printed its results above; "
        "they are not in TensorBoard)"
    ), errors[0]


def test_validate_into_a_folder_below_a_file_prints_its_results_then_one_line(tmp_path: Path) -> None:
    # a real process, a real failure: the run folder cannot be created (ENOTDIR), as on a read-only disk (EROFS)
    (tmp_path / "file").write_text("not a folder")
    root = tmp_path / "file" / "run"
    result = run_cli("validate", "--config", str(TINY), *QUIET, root=root, timeout=600)
    assert "Reward/held_out" in result.stdout, result.stdout[-2000:]
    line = _one_error_line(result)
    assert line.startswith(
        f"error: cannot write the TensorBoard events in {root / 'tensorboard' / 'tinysd3_tree-k2_mean_brightness'}: "
        f"{root}: Not a directory (ENOTDIR); a part of that path is a file, not a folder; move the file or choose "
        "another path (validate printed its results above; they are not in TensorBoard)"
    ), line
