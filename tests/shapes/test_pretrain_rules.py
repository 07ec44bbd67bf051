"""The pre-training's command line keeps the main one's rules (lit_treegrpo.shapes.pretrain_rules): every bad value
is one ``error:`` line and exit status 2 before anything is built; its --model.export_dir has one owner (the run
lock), the model is built beside it and moved in once complete, and a file it did not write is never replaced."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lit_treegrpo.cli.user_errors import UserError
from lit_treegrpo.shapes import pretrain
from lit_treegrpo.shapes.model import METADATA_FILE
from lit_treegrpo.shapes.pretrain import main
from lit_treegrpo.shapes.pretrain_rules import (
    STAGING,
    PretrainLock,
    check_export_dir,
    staging_folder,
    take_export_dir,
    write_model_folder,
)

from .test_pretrain import REPO, pretrain_args

MODEL_FILES = ["scheduler", METADATA_FILE, "text_encoder", "tokenizer", "transformer"]
DEBUG_HINT = "  (set LIT_TREEGRPO_DEBUG=1 for the traceback)"


@pytest.fixture
def nothing_built(monkeypatch):
    """Building the model or the scene stream fails the test: a refusal must come first."""

    def never(*args, **kwargs):
        raise AssertionError("the model or the data was built before the options were checked")

    monkeypatch.setattr(pretrain, "build_components", never)
    monkeypatch.setattr(pretrain.SceneStream, "__init__", never)


def refused(capsys, args: list[str]) -> str:
    """Run ``main(args)``: it must exit with status 2 after one ``error:`` line and no traceback; returns the line."""
    with pytest.raises(SystemExit) as stop:
        main(args)
    err = capsys.readouterr().err
    assert stop.value.code == 2, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert lines[0].endswith(DEBUG_HINT)
    return lines[0].removeprefix("error: ").removesuffix(DEBUG_HINT)


# ------------------------------------------------------------------------ values
BAD_VALUES = [
    # (command-line options, or a YAML config's text; the message's start)
    (["--model.lr", "-1"], "--model.lr must be > 0, got -1.0"),
    (["--model.lr", "0"], "--model.lr must be > 0, got 0.0"),
    (["--model.lr", "nan"], "--model.lr: expected float, got 'nan'; fix the value"),
    (["--model.lr", "inf"], "--model.lr: expected float, got 'inf'; fix the value"),
    (["--model.lr", "1e400"], "--model.lr: not a finite number; no option of the pre-training takes nan or inf"),
    ("model:\n  lr: .nan\n", "--model.lr: not a finite number"),
    ("model:\n  lr: .inf\n", "--model.lr: not a finite number"),
    ("model:\n  eval_guidance: .inf\n", "--model.eval_guidance: not a finite number"),
    ("model:\n  model:\n    shift: .nan\n", "--model.model.shift: not a finite number"),
    ("data:\n  caption_dropout: .nan\n", "--data.caption_dropout: not a finite number"),
    ("trainer:\n  limit_val_batches: .nan\n", "--trainer.limit_val_batches: not a finite number"),
    (["--model.weight_decay", "-0.1"], "--model.weight_decay must be >= 0, got -0.1"),
    (["--model.grad_clip", "0"], "--model.grad_clip must be > 0, got 0.0"),
    (["--model.ema_decay", "1"], "--model.ema_decay must be in [0, 1), got 1.0"),
    (["--model.final_lr_ratio", "2"], "--model.final_lr_ratio must be in [0, 1], got 2.0"),
    (["--data.caption_dropout", "-0.5"], "--data.caption_dropout must be in [0, 1], got -0.5"),
    # steps
    (["--trainer.max_steps", "-1"], "--trainer.max_steps must be >= 1 (the scene stream is infinite"),
    (["--trainer.max_steps", "0"], "--trainer.max_steps must be >= 1 (the scene stream is infinite"),
    (["--model.warmup_steps", "-3"], "--model.warmup_steps must be >= 0, got -3"),
    (["--model.eval_steps", "0"], "--model.eval_steps must be >= 1, got 0"),
    (["--model.eval_samples", "-2"], "--model.eval_samples must be >= 1, got -2"),
    (["--trainer.val_check_interval", "0"], "--trainer.val_check_interval 0: give the training steps"),
    (["--trainer.accumulate_grad_batches", "0"], "--trainer.accumulate_grad_batches must be >= 1, got 0"),
    # sizes
    (["--data.batch_size", "0"], "--data.batch_size must be >= 1, got 0"),
    (["--data.batch_size", "-8"], "--data.batch_size must be >= 1, got -8"),
    (["--model.model.num_layers", "0"], "--model.model.num_layers must be >= 1, got 0"),
    (["--model.model.image_size", "-16"], "--model.model.image_size must be >= 1, got -16"),
    (["--model.model.patch_size", "0"], "--model.model.patch_size must be >= 1, got 0"),
    (["--model.model.patch_size", "3"], "--model.model.image_size=16 must be a multiple of --model.model.patch_size=3"),
    (["--model.model.text_width", "6"], "--model.model.text_width must be a multiple of 4"),
    (["--model.model.max_tokens", "1"], "--model.model.max_tokens must be >= 9 (the grammar's longest prompt"),
    (["--model.model.shift", "0"], "--model.model.shift must be > 0, got 0.0"),
    (["--data.image_size", "8"], "--data.image_size=8 but --model.model.image_size=16; set both to the same value"),
    # work past the main command line's bounds (an evaluation of 10^12 model calls ran for hours before)
    (
        ["--model.eval_samples", "1000000", "--model.eval_steps", "1000000"],
        "--model.eval_samples 1,000,000 x --model.eval_steps 1,000,000: each evaluation would cost",
    ),
    (
        ["--data.batch_size", "10000000"],
        "--data.batch_size 10,000,000 x --data.image_size 16 squared: one batch would be",
    ),
    # seeds, and options that would be accepted and then ignored
    (["--model.seed", str(2**70)], "--model.seed must be in [-2**63, 2**64 - 2] (torch's seeds)"),
    (["--seed_everything", str(2**40)], "--seed_everything must be true, false or a whole number in [0, 4294967295]"),
    (["--trainer.gradient_clip_val", "1"], "--trainer.gradient_clip_val: the pre-training clips its gradients"),
    (["--optimizer", "torch.optim.SGD"], "--optimizer: the pre-training builds AdamW"),
    (["--trainer.max_step", "3"], "--trainer.max_step: no such option; did you mean --trainer.max_steps?"),
]


@pytest.mark.parametrize("given, message", BAD_VALUES, ids=[str(i) for i, _ in enumerate(BAD_VALUES)])
def test_every_bad_value_is_one_line_and_status_2_before_anything_is_built(
    tmp_path: Path, capsys, nothing_built, given, message
) -> None:
    if isinstance(given, str):
        (tmp_path / "bad.yaml").write_text(given)
        given = ["--config", str(tmp_path / "bad.yaml")]
    line = refused(capsys, pretrain_args(tmp_path / "run", *given))
    assert line.startswith(message), line
    assert not (tmp_path / "run").exists()  # nothing written: no run folder, no model folder, no lock


def test_a_key_given_twice_names_the_file_and_its_lines(tmp_path: Path, capsys, nothing_built) -> None:
    (tmp_path / "twice.yaml").write_text("trainer:\n  max_steps: 3\n  max_steps: 5\n")
    line = refused(capsys, [*pretrain_args(tmp_path / "b"), "--config", str(tmp_path / "twice.yaml")])
    assert "twice.yaml" in line and "the key 'max_steps' is given twice in one mapping, at lines 2 and 3" in line


def test_the_debug_flag_keeps_the_traceback_and_a_bad_flag_is_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("LIT_TREEGRPO_DEBUG", "1")
    with pytest.raises(UserError, match=r"^--model.lr must be > 0, got -1.0$"):
        main(pretrain_args(tmp_path, "--model.lr", "-1"))
    monkeypatch.setenv("LIT_TREEGRPO_DEBUG", "maybe")
    assert refused(capsys, pretrain_args(tmp_path, "--model.lr", "-1")).startswith("LIT_TREEGRPO_DEBUG='maybe'")


# ------------------------------------------------------------------------ the export folder
def test_an_export_dir_that_is_a_file_a_fifo_or_a_link_is_refused_and_left_as_it_was(
    tmp_path: Path, capsys, nothing_built
) -> None:
    target = tmp_path / "model"
    target.write_text("a user's file")
    assert "model: is a file, not a folder; give a folder" in refused(capsys, pretrain_args(tmp_path))
    assert target.read_text() == "a user's file"
    target.unlink()
    os.mkfifo(target)
    assert "model: is a FIFO (named pipe), not a folder" in refused(capsys, pretrain_args(tmp_path))
    target.unlink()
    (tmp_path / "elsewhere").mkdir()
    target.symlink_to(tmp_path / "elsewhere")
    assert "model: is a symbolic link (to " in refused(capsys, pretrain_args(tmp_path))
    assert not any((tmp_path / "elsewhere").iterdir())
    under_a_file = ["--model.export_dir", str(tmp_path / "notes.txt" / "model")]
    (tmp_path / "notes.txt").write_text("mine")
    assert f"cannot create it, {tmp_path / 'notes.txt'} is a file" in refused(
        capsys, pretrain_args(tmp_path, *under_a_file)
    )
    assert refused(capsys, pretrain_args(tmp_path, "--model.export_dir", " ")).startswith("--model.export_dir: empty")


def test_an_export_dir_that_cannot_be_written_is_refused(tmp_path: Path, capsys, monkeypatch, nothing_built) -> None:
    parent = tmp_path / "locked"
    (parent / "model").mkdir(parents=True)
    access = os.access
    for export_dir, message in (
        (parent / "model", f"--model.export_dir {parent / 'model'}: is not writable"),
        (
            parent / "new" / "model",
            f"--model.export_dir {parent / 'new' / 'model'}: cannot be created, {parent} is not",
        ),
    ):
        folder = export_dir if export_dir.exists() else parent
        folder.chmod(0o555)
        try:
            with monkeypatch.context() as patch:
                if os.geteuid() == 0:  # root writes anywhere: what a user without the permission meets
                    patch.setattr(os, "access", lambda p, mode, f=folder: Path(p) != f and access(p, mode))
                line = refused(capsys, pretrain_args(tmp_path, "--model.export_dir", str(export_dir)))
        finally:
            folder.chmod(0o755)
        assert line.startswith(message), line
    assert sorted(p.name for p in parent.iterdir()) == ["model"] and not any((parent / "model").iterdir())


def test_an_earlier_model_and_a_killed_fits_unfinished_model_are_never_written_over(
    tmp_path: Path, capsys, nothing_built
) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "shapes_world.json").write_text("an earlier pre-training's model")
    line = refused(capsys, pretrain_args(tmp_path))
    assert re.match(r"--model.export_dir .*model: holds files .*give a new or empty folder", line)
    assert (tmp_path / "model" / "shapes_world.json").read_text() == "an earlier pre-training's model"
    (tmp_path / "model" / "shapes_world.json").unlink()
    staging = staging_folder(tmp_path / "model")
    assert staging == tmp_path / "model" / ".pretrain-tmp" / "new"
    staging.mkdir(parents=True)
    (staging / "transformer").write_text("a killed run's")
    assert f"{staging} holds an earlier pre-training's unfinished or unplaced model" in refused(
        capsys, pretrain_args(tmp_path)
    )
    assert (staging / "transformer").read_text() == "a killed run's"


def test_a_second_fit_into_a_locked_export_dir_is_refused_and_a_dead_fits_lock_is_taken_over(
    tmp_path: Path, capsys, nothing_built
) -> None:
    export_dir = tmp_path / "model"
    lock = export_dir / STAGING / PretrainLock.name
    other = PretrainLock(export_dir)  # what a running pre-training holds (the project's folder lock)
    other.acquire()
    try:
        line = refused(capsys, pretrain_args(tmp_path))
        assert line.startswith(f"--model.export_dir {export_dir}: in use by another pre-training (pid {os.getpid()},")
        assert lock.read_text().strip() == str(os.getpid())  # the holder's lock is untouched
    finally:
        other.release()
    assert not export_dir.exists()  # the release removes the folders the lock created
    lock.parent.mkdir(parents=True)
    lock.write_text("999999999\n")  # a killed fit's: the kernel dropped its flock
    check_export_dir(export_dir)
    take_export_dir(export_dir).release()
    assert not any(export_dir.iterdir())
    (tmp_path / "mine.txt").write_text("mine")
    lock.parent.mkdir()
    lock.symlink_to(tmp_path / "mine.txt")  # never written through
    line = refused(capsys, pretrain_args(tmp_path))
    assert line.startswith(f"--model.export_dir {export_dir}: the pre-training's lock {lock} is a symbolic link"), line
    assert (tmp_path / "mine.txt").read_text() == "mine"


class _Part:
    """A component whose ``save_pretrained`` writes one file (save_components writes four of them)."""

    def save_pretrained(self, folder: Path) -> None:
        Path(folder).mkdir(parents=True)
        (Path(folder) / "weights").write_text("new")


PARTS = {name: _Part() for name in ("transformer", "text_encoder", "tokenizer", "scheduler")}


def test_the_model_is_built_in_the_folder_under_a_short_name_and_moved_in(tmp_path: Path) -> None:
    export_dir = tmp_path / ("m" * 255)  # the longest name a folder may have: the staging name does not grow with it
    assert staging_folder(export_dir) == export_dir / ".pretrain-tmp" / "new"
    assert write_model_folder(export_dir, PARTS, {"steps": 4}) == []
    assert sorted(p.name for p in export_dir.iterdir()) == MODEL_FILES  # no staging folder left
    assert (export_dir / "transformer" / "weights").read_text() == "new"


def test_a_users_file_in_the_export_dir_is_kept_and_one_the_model_would_replace_is_refused(tmp_path: Path) -> None:
    export_dir = tmp_path / "model"
    lock = take_export_dir(export_dir)  # the fit's own
    (export_dir / "notes.txt").write_text("mine")  # added while the fit ran
    assert write_model_folder(export_dir, PARTS, {}) == ["notes.txt"]
    lock.release()
    assert (export_dir / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in export_dir.iterdir()) == sorted(["notes.txt", *MODEL_FILES])
    other = tmp_path / "other"
    other.mkdir()
    (other / METADATA_FILE).write_text("mine")
    with pytest.raises(UserError, match=rf"^--model.export_dir {other}: holds '{METADATA_FILE}', which this "):
        write_model_folder(other, PARTS, {})
    assert (other / METADATA_FILE).read_text() == "mine"
    assert sorted(p.name for p in other.iterdir()) == [STAGING, METADATA_FILE]
    assert sorted(p.name for p in staging_folder(other).iterdir()) == MODEL_FILES  # the model is kept there


def test_a_file_added_to_the_export_dir_during_a_fit_survives_it(tmp_path: Path, capsys, monkeypatch) -> None:
    written = pretrain.write_model_folder

    def user_adds_files(export_dir, parts, metadata):  # while the fit runs, before its model is moved in
        (Path(export_dir) / "notes.txt").write_text("mine")
        return written(export_dir, parts, metadata)

    monkeypatch.setattr(pretrain, "write_model_folder", user_adds_files)
    main(pretrain_args(tmp_path))
    export_dir = tmp_path / "model"
    assert (export_dir / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in export_dir.iterdir()) == sorted(["notes.txt", *MODEL_FILES])  # the lock is gone
    assert not staging_folder(export_dir).exists()

    def user_adds_a_clash(export_dir, parts, metadata):
        (Path(export_dir) / METADATA_FILE).write_text("mine")
        return written(export_dir, parts, metadata)

    monkeypatch.setattr(pretrain, "write_model_folder", user_adds_a_clash)
    line = refused(capsys, pretrain_args(tmp_path / "b"))
    assert line.startswith(f"--model.export_dir {tmp_path / 'b' / 'model'}: holds '{METADATA_FILE}', which")
    assert (tmp_path / "b" / "model" / METADATA_FILE).read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "b" / "model").iterdir()) == [STAGING, METADATA_FILE]
    assert sorted(p.name for p in staging_folder(tmp_path / "b" / "model").iterdir()) == MODEL_FILES


@pytest.mark.slow  # three pre-training processes
def test_two_concurrent_fits_into_one_export_dir_the_second_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", "lit_treegrpo.shapes.pretrain"]
    export_dir = ["--model.export_dir", str(tmp_path / "model")]
    first = subprocess.Popen(
        [*command, *pretrain_args(tmp_path / "a", "--trainer.max_steps", "1000000", *export_dir)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "model" / STAGING / PretrainLock.name).exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first fit did not start"
            time.sleep(0.5)
        second = subprocess.run(
            [*command, *pretrain_args(tmp_path / "b", *export_dir)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"in use by another pre-training (pid {first.pid}," in errors[0]
        assert first.poll() is None  # the first goes on
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    assert [p.name for p in (tmp_path / "model").iterdir()] == [STAGING]  # a killed fit's lock, nothing else
    assert [p.name for p in (tmp_path / "model" / STAGING).iterdir()] == [PretrainLock.name]
    third = subprocess.run(
        [*command, *pretrain_args(tmp_path / "c", *export_dir)], cwd=REPO, env=env, capture_output=True, timeout=600
    )
    assert third.returncode == 0, third.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == MODEL_FILES
