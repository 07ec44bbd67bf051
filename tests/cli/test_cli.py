"""The command line end to end: real subprocesses of ``python -m lit_treegrpo`` on tiny models."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_treegrpo.training import memory_guard

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny.yaml"
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def run_cli(*args: str, root: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("LIT_TREEGRPO_DEBUG", None)
    extra = ["--trainer.default_root_dir", str(root)] if root is not None else []
    return subprocess.run(
        [sys.executable, "-m", "lit_treegrpo", *args, *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout,
    )


def fit(root: Path, *args: str, config: Path = TINY) -> subprocess.CompletedProcess:
    result = run_cli("fit", "--config", str(config), *QUIET, *args, root=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def scalars(root: Path, tag: str) -> list[tuple[int, float]]:
    values = []
    for events in sorted((root / "tensorboard").rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0, "images": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            values += [(e.step, e.value) for e in acc.Scalars(tag)]
    return values


def trainable(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


def test_tiny_fit_logs_a_sample_grid_and_reward_scalars(tmp_path: Path) -> None:
    fit(tmp_path, "--trainer.max_steps", "4", "--trainer.val_check_interval", "2")
    events = sorted((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file"
    acc = EventAccumulator(str(events[0]), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    assert "samples" in acc.Tags()["images"]
    grid = acc.Images("samples")[-1]
    assert grid.width > 32 and grid.height > 32
    for tag in ("reward", "loss", "reward/mean", "val/reward", "nfe/rollout", "time/rollout_s"):
        assert tag in acc.Tags()["scalars"], tag
    assert len(acc.Scalars("reward")) == 4
    # 2 prompts x 4 leaves x (1 + 2 + 2 + 4) evaluations of the k=2 tree over 4 steps
    assert {e.value for e in acc.Scalars("nfe/rollout")} == {2 * (1 + 2 + 4 + 4)}
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    state = trainable(ckpt)
    assert state and all("lora_" in k for k in state)  # only the trainable weights are saved
    assert ckpt.stat().st_size < 2_000_000


@pytest.mark.slow  # real processes killed and resumed: minutes on 2 cores
def test_resume_with_ckpt_path_last_continues_exactly(tmp_path: Path) -> None:
    full, part = tmp_path / "full", tmp_path / "part"
    args = ("--trainer.val_check_interval", "100", "--trainer.limit_val_batches", "0")
    fit(full, "--trainer.max_steps", "6", *args)
    fit(part, "--trainer.max_steps", "3", *args)
    first_record = (part / "tensorboard" / "config.yaml").read_bytes()
    resumed = fit(part, "--trainer.max_steps", "6", "--ckpt_path", "last", *args)
    assert "Resuming from" in resumed.stdout + resumed.stderr
    # each fit keeps its own record of how it was run; the first is never replaced
    assert (part / "tensorboard" / "config.yaml").read_bytes() == first_record
    records = sorted(p.name for p in (part / "tensorboard").glob("config*.yaml"))
    assert records == ["config-2.yaml", "config.yaml"], records
    assert "ckpt_path: last" in (part / "tensorboard" / "config-2.yaml").read_text()
    assert "max_steps: 6" in (part / "tensorboard" / "config-2.yaml").read_text()
    a, b = trainable(full / "checkpoints" / "last.ckpt"), trainable(part / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed parameters differ from the uninterrupted run"
    losses_full = [v for _, v in scalars(full, "loss")]
    losses_part = [v for _, v in scalars(part, "loss")]
    assert len(losses_full) == 6 and losses_part == losses_full


@pytest.mark.slow  # a real process; the same refusal in-process: test_model_free_errors_come_before_any_model_loads
def test_ckpt_path_last_without_a_checkpoint_fails_clearly(tmp_path: Path) -> None:
    result = run_cli("fit", "--config", str(TINY), *QUIET, "--ckpt_path", "last", root=tmp_path)
    assert result.returncode == 2
    assert "no checkpoint at" in result.stderr and "last.ckpt" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.tree.branch_steps", "[3]"], "last denoising step"),
        (["--model.tree.num_steps", "6"], "tree.num_steps=6 but the adapter samples with num_steps=4"),
        (["--model.reward", "no_such_reward"], "unknown reward 'no_such_reward'"),
        (["--data.prompts", "/no/such/prompts.txt"], "--data.prompts"),
        (["--model.minibatches", "0"], "minibatches must be >= 1"),
        (  # a callback's own check, not jsonargparse's "does not validate against any of the Union subtypes"
            ["--trainer.callbacks+=lit_treegrpo.callbacks.PruningSchedule", "--trainer.callbacks.ratio=2"],
            "--trainer.callbacks: PruningSchedule.ratio must be in (0, 1], got 2.0",
        ),
        (
            ["--trainer.callbacks+=lit_treegrpo.callbacks.PruningSchedule"] * 2,
            "--trainer.callbacks has 2 PruningSchedule callbacks; a fit has one pruning: keep one",
        ),
    ],
)
def test_user_errors_are_one_line_without_traceback(tmp_path: Path, capsys, monkeypatch, args, message) -> None:
    line = _main_error(
        monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, *args, "--trainer.default_root_dir", str(tmp_path)
    )
    assert message in line, line


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ["--model.tree.branching", "3"],
            "error: --model.tree.branching: the checkpoint {ckpt} was trained with 2, this run has 3; "
            "resume with 2, or start a new run (--overwrite true or another --trainer.default_root_dir)",
        ),
        (
            ["--model.adapter", "lit_treegrpo.models.tiny.TinySD15Adapter", "--model.adapter.init_args.num_steps", "4"],
            "error: --model.adapter: the checkpoint {ckpt} was trained with TinySD3Adapter, this run has TinySD15Adapter; "
            "resume with TinySD3Adapter",
        ),
    ],
)
def test_resuming_with_another_tree_or_model_is_refused(tmp_path: Path, capsys, change, message) -> None:
    from lit_treegrpo.cli import main

    base = ["fit", "--config", str(TINY), *QUIET, "--trainer.limit_val_batches", "0"]
    main([*base, "--trainer.max_steps", "1", "--trainer.default_root_dir", str(tmp_path)])
    before = snapshot(tmp_path)
    message = message.format(ckpt=tmp_path / "checkpoints" / "last.ckpt")
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                *base,
                "--trainer.max_steps",
                "2",
                "--ckpt_path",
                "last",
                *change,
                "--trainer.default_root_dir",
                str(tmp_path),
            ]
        )
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    # refused (before the model loads: the resume rules, docs/configs.md): no config record, event file or lock left behind
    assert snapshot(tmp_path) == before
    if "--model.adapter" in change:
        return
    # the same refusal as a new run in a new folder leaves no folder at all
    with pytest.raises(SystemExit):
        main([*base, "--trainer.max_steps", "2", "--ckpt_path", str(tmp_path / "checkpoints" / "last.ckpt"), *change,
              "--trainer.default_root_dir", str(tmp_path / "new")])  # fmt: skip
    assert message in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def _log_to_this_stderr(monkeypatch) -> None:
    """Point the libraries' stream handlers (lightning, transformers, ...) at this test's
    captured stderr: the first import created them with an earlier test's, since closed."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)]
    for logger in loggers:
        for handler in logger.handlers:
            if type(handler) is logging.StreamHandler:
                monkeypatch.setattr(handler, "stream", sys.stderr)
                if "flush" in vars(handler):  # transformers binds its handler's flush to that stderr's
                    monkeypatch.setattr(handler, "flush", sys.stderr.flush)


def _main_error(monkeypatch, capsys, *args: str, code: int = 2) -> str:
    """Run ``cli.main`` with ``args`` expecting an error: exit status ``code`` (2: a user error),
    one ``error:`` line and nothing else of jsonargparse's (no usage block) or Python's (no
    traceback)."""
    from lit_treegrpo.cli import DEBUG_ENV, main

    monkeypatch.delenv(DEBUG_ENV, raising=False)
    _log_to_this_stderr(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    err = capsys.readouterr().err
    assert exit_info.value.code == code, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-2000:]
    assert "usage:" not in err and "Traceback" not in err, err[-2000:]
    return errors[0]


BAD_YAML = """model:
  tree:
    branchin: 3
"""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.nope", "1"], "--model.nope: no such option; --model takes accumulate, adapter, advantage"),
        (["--model.tree.branchng", "3"], "--model.tree.branchng: no such option; did you mean --model.tree.branching?"),
        (
            ["--model.tree.max_batch", "4"],
            "--model.tree.max_batch: this option moved to --model.rollout.max_batch; rename it there",
        ),
        (
            ["--model.shared_noise", "true"],
            "--model.shared_noise: this option moved to --model.tree.shared_noise; rename it there",
        ),
        (["--trainer.max_step", "3"], "--trainer.max_step: no such option; did you mean --trainer.max_steps?"),
        (
            ["--config", "BAD_YAML"],
            "--model.tree.branchin (a command-line option or a config key): no such option; did you mean --model.tree.branching?",
        ),
        (["--model.minibatches", "abc"], "--model.minibatches: expected int, got 'abc'; fix the value"),
        (["--model.tree.branching", "two"], "--model.tree.branching: 'two' is none of int, tuple[int, ...]"),
        (
            ["--model.advantage.method", "median"],
            "--model.advantage.method: expected one of 'mean', 'logprob_softmax', 'branch_fusion', 'parent_relative', 'softmax_tb', got 'median'; did you mean mean?",
        ),
        (
            ["--model.adapter.init_args.num_step", "4"],
            "--model.adapter.init_args.num_step: lit_treegrpo.models.tiny.TinySD3Adapter takes no option 'num_step'; did you mean num_steps?",
        ),
        (["--model.faults.nonfinite", "skp"], "got 'skp'; did you mean skip?"),
        (
            ["--model.optimizer.lr", "nan"],
            "--model.optimizer.init_args.lr: 'nan' is none of float, Tensor; fix the value",
        ),
        (
            ["--model.adapter.init_args.noise_level", "nan"],
            "--model.adapter.init_args.noise_level: expected float, got 'nan'; fix the value",
        ),
    ],
)
def test_parse_errors_are_one_line_naming_the_option_and_the_fix(
    tmp_path: Path, capsys, monkeypatch, no_model, args, message
) -> None:
    if "BAD_YAML" in args:
        (tmp_path / "bad.yaml").write_text(BAD_YAML)
        args = [str(tmp_path / "bad.yaml") if a == "BAD_YAML" else a for a in args]
    line = _main_error(
        monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, *args, "--trainer.default_root_dir", str(tmp_path)
    )
    assert message in line, line
    assert "`python -m lit_treegrpo fit --help` lists every option" in line


def test_the_debug_switch_shows_the_traceback(tmp_path: Path, monkeypatch, no_model) -> None:
    from lit_treegrpo.cli import DEBUG_ENV, main
    from lit_treegrpo.cli.user_errors import UserError

    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(UserError, match="--model.tree.branchng: no such option"):  # raised, not printed
        main(["fit", "--config", str(TINY), "--model.tree.branchng", "3", "--trainer.default_root_dir", str(tmp_path)])


@pytest.mark.slow  # a real process; in-process: test_parse_errors_are_one_line_naming_the_option_and_the_fix
def test_a_parse_error_in_a_real_process_is_one_line(tmp_path: Path) -> None:
    result = run_cli("fit", "--config", str(TINY), *QUIET, "--model.tree.branchng", "3", root=tmp_path)
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("error: --model.tree.branchng: no such option; did you mean --model.tree.branching?")
    ), result.stderr[-2000:]
    assert [
        line for line in result.stderr.splitlines() if line.startswith("error:")
    ] == result.stderr.strip().splitlines()[-1:]
    assert "usage:" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.tree.branch_steps", "[3]"], "--model.tree: branch_steps contains the last denoising step 3"),
        (
            ["--model.rollout.max_leaves", "32"],
            "--model.rollout.max_leaves: no longer an option; the memory guard refuses",
        ),
        (["--model.tree.num_steps", "6"], "--model.tree.num_steps=6 but the adapter samples with num_steps=4"),
        (["--model.tree.branch_steps", "[]"], "--model.tree has no stochastic step, so nothing would train"),
        (["--model.minibatches", "0"], "--model.minibatches must be >= 1, got 0"),
        (["--model.grad_clip", "0"], "--model.grad_clip must be > 0 or null"),
        (["--model.advantage.clip", "-1"], "--model.advantage: advantage.clip must be > 0 or null"),
        (
            ["--model.pruning.ratio", "0.5"],
            "--model.pruning.ratio: no longer an option; the PruningSchedule callback owns the pruning",
        ),
        (
            ["--model.loss", "lit_treegrpo.core.ClippedPolicyLoss", "--model.loss.clip_range", "0"],
            "--model.loss: loss.clip_range must be > 0",
        ),
        (
            ["--model.loss.kl_beta", "0.1", "--model.adapter.init_args.lora", "null"],
            "--model.loss.kl_beta > 0 needs the adapter's lora",
        ),
        (["--model.faults.nonfinite", "ignore"], "--model.faults.nonfinite: expected one of 'error', 'skip'"),
        (["--model.memory_guard.fraction", "1.5"], "--model.memory_guard: memory_guard.fraction must be in (0, 1]"),
        (
            ["--model.reward", "{hps: 0.5, nope: 0.5}"],
            "--model.reward: unknown reward 'nope'; known rewards: aesthetic,",
        ),
        (
            ["--model.reward_kwargs", "{hps: {}}"],
            "--model.reward: reward_kwargs names ['hps'], which are not among the rewards ['brightness']",
        ),
        (
            ["--data.prompts", "/no/such/prompts.txt"],
            "--data.prompts: '/no/such/prompts.txt' is neither a file nor a built-in prompt set",
        ),
        (["--data.batch_size", "0"], "--data.batch_size must be >= 1, got 0"),
        (
            ["--data.global_batch_size", "3", "--trainer.devices", "2", "--trainer.strategy", "ddp"],
            "--data.global_batch_size 3 is not divisible by the 2 data-parallel processes (--trainer.devices x --trainer.num_nodes); use a multiple of 2 (2 or 4)",
        ),
        (["--data.global_batch_size", "4"], "--data.batch_size 2 and --data.global_batch_size 4 disagree"),
        (["--ckpt_path", "last"], "--ckpt_path last: no checkpoint at"),
        (["--ckpt_path", ""], "--ckpt_path: empty; give a checkpoint file, or last, or leave the option out"),
        (
            ["--data.batch_size", "100000000"],
            "--data.batch_size 100000000 asks for 100000000 prompts per training step, but "
            "'shapes' has 22 training prompts after holding out 2 for validation; use --data.batch_size 22 or less",
        ),
        (
            ["--model.optimizer.lr", ".nan"],
            "--model.optimizer.init_args.lr: nan is not a value any option accepts; give a finite number",
        ),
        (
            ["--model.tree.branching", "1"],
            "--model.tree has one leaf per prompt (num_trees 1, branching 1), so every "
            "advantage would be 0 and nothing would train; give branching >= 2 or num_trees >= 2",
        ),
        (
            ["--model.reward", "{brightness: 0, shapes: 0}"],
            "--model.reward: reward {'brightness': 0.0, 'shapes': 0.0}: every reward "
            "weight is 0, so every advantage would be 0 and nothing would train; give one a non-zero weight",
        ),
    ],
)
def test_model_free_errors_come_before_any_model_loads(
    tmp_path: Path, capsys, monkeypatch, no_model, args, message
) -> None:
    line = _main_error(
        monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, *args, "--trainer.default_root_dir", str(tmp_path)
    )
    assert message in line, line


@pytest.mark.parametrize("how", ["last", "path"])
def test_a_corrupt_checkpoint_is_refused_in_one_line_before_any_model_loads(
    tmp_path: Path, capsys, monkeypatch, no_model, how
) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    if how == "last":  # a last.ckpt cut short (a full disk, a kill during a non-atomic write)
        torch.save({"w": torch.zeros(10_000)}, folder / "last.ckpt")
        (folder / "last.ckpt").write_bytes((folder / "last.ckpt").read_bytes()[:20_000])
        given, path, option = "last", folder / "last.ckpt", "--ckpt_path last"
    else:  # some other file passed by mistake
        path = tmp_path / "notes.ckpt"
        path.write_text("step 100: reward 0.41\n")
        given, option = str(path), "--ckpt_path"
    from tests.artifacts.test_safe_reads import ShellMarker, hostile_checkpoint  # (it imports this module)

    # planted beside it, a hostile file named like a checkpoint: advice never points at it
    hostile = hostile_checkpoint(path.parent / "epoch=0-step=9.ckpt", tmp_path / "marker", ShellMarker)
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--ckpt_path", given,
                       "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert line.startswith(f"error: {option}: {path} is truncated or corrupt ("), line
    assert (
        f"delete it and resume from an earlier checkpoint (none in {path.parent} reads as intact), or start over "
        "without --ckpt_path" in line
    )
    assert str(hostile) not in line and not (tmp_path / "marker").exists()


class Opaque:
    """An object torch's safe unpickler refuses (it is no tensor, container or number)."""


def _bad_input(kind: str, tmp_path: Path) -> tuple[list[str], str]:
    """Arguments that feed the bad input ``kind``, and the start of the one line it must give."""
    if kind == "root dir below a file":
        (tmp_path / "file").write_text("not a folder")
        root = tmp_path / "file" / "run"
        return ["--trainer.default_root_dir", str(root)], (
            f"--trainer.default_root_dir: cannot create or lock {root}: {root}: Not a directory (ENOTDIR); a part of "
            "that path is a file, not a folder; move the file or choose another path"
        )
    if kind == "YAML syntax":
        bad = tmp_path / "broken.yaml"
        bad.write_text("model:\n  tree: [\n")
        return ["--config", str(bad)], f"--config {bad}: not valid YAML: "  # then PyYAML's words (C or Python parser)
    if kind == "checkpoint folder":  # advice names only a file that reads as a checkpoint: not the empty last.ckpt
        (tmp_path / "old" / "checkpoints").mkdir(parents=True)
        (tmp_path / "old" / "checkpoints" / "last.ckpt").write_bytes(b"")
        good = tmp_path / "old" / "checkpoints" / "step=2.ckpt"
        torch.save({"state_dict": {}, "pytorch-lightning_version": "2.6.6"}, good)
        return ["--ckpt_path", str(tmp_path / "old")], (
            f"--ckpt_path: {tmp_path / 'old'} is a folder; give a checkpoint file such as {good}, or last"
        )
    if kind == "folder of hostile files":
        from tests.artifacts.test_safe_reads import ShellMarker, hostile_checkpoint  # (it imports this module)

        (tmp_path / "old").mkdir()
        hostile_checkpoint(tmp_path / "old" / "last.ckpt", tmp_path / "marker", ShellMarker)
        return ["--ckpt_path", str(tmp_path / "old")], (
            f"--ckpt_path: {tmp_path / 'old'} is a folder; give a checkpoint file, or last  (set"
        )
    path = tmp_path / "other.ckpt"
    if kind == "torch file, no Lightning checkpoint":
        torch.save({"w": torch.zeros(3)}, path)
        return ["--ckpt_path", str(path)], (
            f"--ckpt_path: {path} is a torch file but no Lightning checkpoint (it holds the keys 'w', not 'state_dict' and "
            "'pytorch-lightning_version'); pass a checkpoint written by fit"
        )
    assert kind == "unpickling refused"
    torch.save({"state_dict": {}, "pytorch-lightning_version": "2.6.6", "extra": Opaque()}, path)
    return ["--ckpt_path", str(path)], (
        f"--ckpt_path: {path} holds objects that the safe unpickler refuses (the global tests.cli.test_cli.Opaque); it was "
        "not written by this project's fit and may be hostile, so it is not loaded"
    )


@pytest.mark.parametrize(
    "kind",
    [
        "root dir below a file",
        "YAML syntax",
        "checkpoint folder",
        "folder of hostile files",
        "torch file, no Lightning checkpoint",
        "unpickling refused",
    ],
)
def test_file_errors_are_one_line_before_any_model_loads(
    tmp_path: Path, capsys, monkeypatch, no_model, kind: str
) -> None:
    args, message = _bad_input(kind, tmp_path)
    line = _main_error(
        monkeypatch,
        capsys,
        "fit",
        "--config",
        str(TINY),
        *QUIET,
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        *args,
    )
    assert line.startswith(f"error: {message}"), line
    if kind == "YAML syntax":
        assert line.endswith("at line 3, column 1; fix the file  (set LIT_TREEGRPO_DEBUG=1 for the traceback)"), line


def _full_disk(obj: Any, f: Any) -> None:
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize(
    ("kind", "args", "message"),
    [
        (
            "Lightning's MisconfigurationException",
            ["--trainer.profiler", "nope"],
            "error: the trainer's settings (--trainer.*): When passing string value for the `profiler` parameter of `Trainer`, it can only be one of",
        ),
        (
            "a model not in the hub cache, offline",
            ["--model.reward", "clip_score", "--model.reward_kwargs", "{clip_score: {model: nobody/no-such-clip}}"],
            "error: cannot load CLIPScore model from 'nobody/no-such-clip': not a local path, and the hub copy could not be read",
        ),
        (
            "a full disk during the save",
            ["--trainer.max_steps", "1"],
            "error: cannot write the checkpoint ROOT/checkpoints/last.ckpt: No space left on device (ENOSPC); free space on that disk",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v else "",
)
def test_environment_errors_are_one_line_with_status_2(
    tmp_path: Path, capsys, monkeypatch, kind: str, args: list[str], message: str
) -> None:
    if kind == "a full disk during the save":
        monkeypatch.setattr(torch, "save", _full_disk)
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--trainer.limit_val_batches", "0",
                       "--trainer.default_root_dir", str(tmp_path), *args)  # fmt: skip
    assert line.replace(str(tmp_path), "ROOT").startswith(message), line


def test_each_predict_writes_a_folder_of_its_own_and_nothing_there_is_written_over(tmp_path: Path) -> None:
    from PIL import Image

    from lit_treegrpo.cli import main

    (tmp_path / "predictions").write_text("a file of the user's where the first predict would go")
    args = ["predict", "--config", str(TINY), *QUIET, "--trainer.default_root_dir", str(tmp_path)]
    main(args)
    first = {p.name: p.read_bytes() for p in (tmp_path / "predictions-2").iterdir()}
    assert len(first) == 2 and all(name.endswith(".png") for name in first)
    main([*args, "--model.adapter.init_args.seed", "7"])  # other weights: other images, in the next folder
    second = {p.name: p.read_bytes() for p in (tmp_path / "predictions-3").iterdir()}
    assert second.keys() == first.keys() and second != first
    assert {p.name: p.read_bytes() for p in (tmp_path / "predictions-2").iterdir()} == first  # nothing replaced
    assert (tmp_path / "predictions").read_text().startswith("a file of the user's")
    assert Image.open(next((tmp_path / "predictions-3").iterdir())).size == (32, 32)


def test_a_bug_keeps_its_traceback(tmp_path: Path, monkeypatch) -> None:
    from lit_treegrpo.cli import DEBUG_ENV, main

    monkeypatch.delenv(DEBUG_ENV, raising=False)
    raising = '{"class_path": "tests.probes.FlakyReward", "init_args": {"raise_on": [0]}}'
    with pytest.raises(RuntimeError, match=r"reward service unavailable \(call 0\)"):  # not turned into a line
        main(["fit", "--config", str(TINY), *QUIET, "--model.reward", raising, "--trainer.callbacks=[]",
              "--trainer.limit_val_batches", "0", "--trainer.default_root_dir", str(tmp_path)])  # fmt: skip


def test_a_tree_that_cannot_fit_is_refused_before_the_first_batch_is_drawn(tmp_path: Path, capsys, monkeypatch) -> None:
    from lit_treegrpo.data.prompt_stream import PromptStream

    drawn = []
    batch = PromptStream.batch
    monkeypatch.setattr(PromptStream, "batch", lambda self, k: drawn.append(k) or batch(self, k))
    monkeypatch.setattr(memory_guard, "available_memory", lambda device, processes=1: (1000, "measured"))  # 1 kB
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET,
                       "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert line.startswith("error: memory guard: one rollout needs about "), line
    assert "but 1 kB is available (measured; x 0.9 = 900 B); lower --data.batch_size" in line
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()
    assert drawn == []  # the estimate came before the prompt stream drew anything


def test_a_training_pass_that_cannot_fit_one_parent_is_refused_in_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    from lit_treegrpo.core.memory import cond_row_bytes, held_tree_bytes, rollout_memory, training_memory
    from lit_treegrpo.core.spec import TreeSpec
    from lit_treegrpo.models.tiny import TinySD3Adapter
    from lit_treegrpo.training.memory_guard import probe_training

    # configs/tiny.yaml's run, estimated as the guard does: a budget the rollout fits and one parent
    # of the training pass (AdamW's two moments to come) does not
    adapter, spec = (
        TinySD3Adapter(seed=0, num_steps=4, guidance_scale=1.0),
        TreeSpec(4, branch_steps=(0, 1), branching=2),
    )
    cond = adapter.encode_prompts(["a red circle"])
    noise = adapter.initial_noise(1, torch.Generator().manual_seed(0))
    trainable = sum(p.numel() * p.element_size() for p in adapter.trainable_parameters())
    one = training_memory(
        probe_training(adapter, spec, cond, noise),
        checkpointing=False,
        trainable_bytes=trainable,
        optimizer_state_bytes=2 * trainable,
        held_bytes=held_tree_bytes(spec, 2, (4, 16, 16), torch.float32, cond_bytes=cond_row_bytes(cond)),
    ).total(1)
    budget = (one - 1000) / 0.9
    assert rollout_memory(spec, 2, (4, 16, 16), torch.float32, cond_bytes=cond_row_bytes(cond)).total < budget * 0.9
    monkeypatch.setattr(memory_guard, "available_memory", lambda device, processes=1: (int(budget), "measured"))
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET,
                       "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert line.startswith(
        "error: memory guard: the training pass cannot fit even one parent per forward: it needs about "
    ), line
    assert "turn on --model.adapter.init_args.gradient_checkpointing" in line and "lower --data.batch_size" in line
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()


def test_a_run_that_keeps_skipping_stops_with_one_line_and_status_1(tmp_path: Path, capsys, monkeypatch) -> None:
    always_nan = '{"class_path": "tests.probes.FlakyReward", "init_args": {"nan_on": [0, 1, 2, 3, 4, 5, 6, 7]}}'
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--model.reward", always_nan,
                       "--model.faults.nonfinite", "skip",
                       "--data.batch_size", "1", "--trainer.callbacks=[]", "--trainer.limit_val_batches", "0",
                       "--trainer.default_root_dir", str(tmp_path), code=1)  # fmt: skip
    assert line.startswith(
        "error: 3 training steps in a row were skipped (at most 3), up to iteration 2; "
        "last cause: non-finite rewards for prompts ['a "
    ), line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--model.reward", '{"class_path": "tests.probes.FlakyReward", "init_args": {"nan_on": [0]}}'],
            "error: reward 'flaky' gave non-finite scores for 4 of 8 images (indices [0, 1, 2, 3], prompts ['a ",
        ),
        (
            ["--model.loss", "tests.training.test_module._NaNLossAt", "--model.loss.at", "[0]"],
            "error: non-finite loss nan at iteration 0, micro-batch 0; no optimizer step was taken (set --model.faults.nonfinite skip",
        ),
    ],
)
def test_a_numerical_fault_under_the_error_policy_is_one_line_and_status_1(
    tmp_path: Path, capsys, monkeypatch, args, message
) -> None:
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, *args, "--trainer.callbacks=[]",
                       "--trainer.limit_val_batches", "0", "--trainer.default_root_dir", str(tmp_path), code=1)  # fmt: skip
    assert line.startswith(message), line


def test_a_reward_whose_extra_is_not_installed_is_refused_before_any_model_loads(
    tmp_path: Path, capsys, monkeypatch, no_model
) -> None:
    monkeypatch.setitem(sys.modules, "ImageReward", None)  # `import ImageReward` fails, installed or not
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--model.reward", "image_reward",
                       "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert line.startswith("error: --model.reward: reward 'image_reward' needs a package that is not installed")
    assert "pip install 'lit-treegrpo[image-reward]'" in line


def test_an_unknown_reward_is_refused_before_any_model_loads(tmp_path: Path, capsys, monkeypatch) -> None:
    from lit_treegrpo.cli import main
    from lit_treegrpo.models import tiny

    def never(*args, **kwargs):
        raise AssertionError("the adapter was built before the reward name was checked")

    monkeypatch.setattr(tiny, "tiny_sd3_pipeline", never)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(TINY), *QUIET, "--model.reward", "{hps: 0.5, nope: 0.5}",
              "--trainer.default_root_dir", str(tmp_path)])  # fmt: skip
    assert exit_info.value.code == 2
    assert "--model.reward: unknown reward 'nope'" in capsys.readouterr().err


@pytest.mark.slow  # a real process; in-process: test_user_errors_are_one_line_without_traceback
def test_a_user_error_in_a_real_process_is_one_line(tmp_path: Path) -> None:
    result = run_cli("fit", "--config", str(TINY), *QUIET, "--model.tree.branching", "0", root=tmp_path)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "branching must be >= 1" in errors[0]
    assert "Traceback" not in result.stderr


def test_fit_help_shows_the_options_docstrings() -> None:
    result = run_cli("fit", "--help", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    text = " ".join(result.stdout.split())
    for snippet in (
        "Children per node at each branch step",  # TreeSpec attribute docstring
        "Most nodes per model call",  # RolloutLimits attribute docstring
        "optimizer steps per inner epoch",  # TreeGRPOModule argument docstring
        "Training prompts: a .txt file",  # PromptDataModule argument docstring
        "``mean`` (TreeGRPO code)",  # AdvantageSettings attribute docstring
        "drops the prompts whose leaves got NaN / inf rewards",  # FaultPolicy attribute docstring
        "Refuse when the estimate exceeds this fraction",  # MemoryGuard attribute docstring
        "Prompts per training step over all data-parallel ranks",  # PromptDataModule.global_batch_size
    ):
        assert snippet in text, snippet
    # every model and data option carries a description, not just its type
    lines = result.stdout.splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        match = re.match(r"^  (--(?:model|data)\.[\w.]+)", line)
        if match:
            rest = line[match.end() :].strip()
            description = rest.split("  ", 1)[1].strip() if "  " in rest else lines[i + 1].strip()
            if not description or description.startswith(("(type:", "--")):
                undocumented.append(match.group(1))
    assert not undocumented, undocumented


def test_predict_writes_one_image_per_prompt(tmp_path: Path) -> None:
    result = run_cli("predict", "--config", str(TINY), *QUIET, root=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    images = sorted((tmp_path / "predictions").glob("*.png"))
    assert len(images) == 2  # data.val_size
    from PIL import Image

    assert Image.open(images[0]).size == (32, 32)


@pytest.mark.slow
def test_ddp_two_processes_match_one_process_with_the_same_global_batch(tmp_path: Path) -> None:
    # SGD: Adam's first steps are ~lr * sign(grad), which turns float noise in near-zero
    # gradients into full-size updates; SGD keeps the comparison about the gradients themselves
    sgd = ("--model.optimizer", "torch.optim.SGD", "--model.optimizer.lr", "10.0")
    common = ("--trainer.max_steps", "3", "--trainer.limit_val_batches", "0", *sgd)
    fit(tmp_path / "one", *common, "--data.batch_size", "2")
    probe = '{"class_path": "tests.probes.SaveRankParameters", "init_args": {"folder": "%s"}}'
    fit(
        tmp_path / "ddp",
        *common,
        "--data.batch_size", "1",
        "--trainer.strategy", "ddp",
        "--trainer.devices", "2",
        "--trainer.callbacks+", probe % (tmp_path / "ranks"),
    )  # fmt: skip
    one = trainable(tmp_path / "one" / "checkpoints" / "last.ckpt")
    ddp = trainable(tmp_path / "ddp" / "checkpoints" / "last.ckpt")
    assert any(v.abs().max() > 1e-3 for k, v in one.items() if "lora_B" in k)  # it trained
    for k in one:
        torch.testing.assert_close(ddp[k], one[k], atol=1e-5, rtol=0)
    rank0 = torch.load(tmp_path / "ranks" / "rank0.pt")
    rank1 = torch.load(tmp_path / "ranks" / "rank1.pt")
    assert rank0.keys() == rank1.keys() == one.keys()
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)  # the ranks agree bitwise


@pytest.mark.slow
def test_ddp_ranks_skip_together_when_one_ranks_reward_fails(tmp_path: Path) -> None:
    # rank 1 only: its reward raises on its 2nd call (the whole step is skipped on both ranks) and
    # gives NaN to one of its prompts on the 3rd (dropped there; both ranks still train). A rank
    # deciding alone would leave the other waiting in an all-reduce until the test times out.
    flaky = '{"class_path": "tests.probes.FlakyReward", "init_args": {"raise_on": [1], "nan_on": [2], "rank": 1}}'
    probe = '{"class_path": "tests.probes.SaveRankParameters", "init_args": {"folder": "%s"}}' % (tmp_path / "ranks")
    result = fit(
        tmp_path / "ddp",
        "--trainer.max_steps", "4",
        "--trainer.limit_val_batches", "0",
        "--trainer.strategy", "ddp",
        "--trainer.devices", "2",
        "--trainer.callbacks=[]",  # RewardMetrics needs every step's rewards; a skipped step has none
        "--trainer.callbacks+", probe,
        "--model.reward", flaky,
        "--model.faults.nonfinite", "skip",
    )  # fmt: skip
    assert "`max_steps=4` reached" in result.stderr  # finished, no rank left waiting
    saved = torch.load(tmp_path / "ddp" / "checkpoints" / "last.ckpt", weights_only=False)["lit_treegrpo"]
    assert saved["iteration"] == 5  # 4 updates took 5 rollouts
    assert saved["faults"]["skipped_steps"] == 1 and saved["faults"]["skipped_groups"] == 1
    rank0 = torch.load(tmp_path / "ranks" / "rank0.pt")
    rank1 = torch.load(tmp_path / "ranks" / "rank1.pt")
    assert rank0.keys() == rank1.keys() and all(torch.equal(rank0[k], rank1[k]) for k in rank0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_tiny_config_reward_rises_over_30_steps(tmp_path: Path, seed: int) -> None:
    fit(
        tmp_path,
        "--model.seed", str(seed),
        "--model.adapter.init_args.seed", str(seed),
        "--data.seed", str(seed),
        "--trainer.limit_val_batches", "0",
    )  # fmt: skip
    rewards = [v for _, v in scalars(tmp_path, "reward")]
    assert len(rewards) == 30
    first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
    assert last > first + 2e-3, (first, last)


FSDP2 = (
    '{"class_path": "lightning.pytorch.strategies.ModelParallelStrategy", "init_args": '
    '{"data_parallel_size": 2, "tensor_parallel_size": 1, "save_distributed_checkpoint": false}}'
)


@pytest.mark.slow
def test_fsdp2_trains_and_resumes_on_two_cpu_processes(tmp_path: Path) -> None:
    common = ("--trainer.limit_val_batches", "0", "--data.batch_size", "1", "--trainer.devices", "2")
    fit(tmp_path / "full", "--trainer.max_steps", "4", "--trainer.strategy", FSDP2, *common)
    fit(tmp_path / "part", "--trainer.max_steps", "2", "--trainer.strategy", FSDP2, *common)
    fit(tmp_path / "part", "--trainer.max_steps", "4", "--trainer.strategy", FSDP2, "--ckpt_path", "last", *common)
    full = trainable(tmp_path / "full" / "checkpoints" / "last.ckpt")
    part = trainable(tmp_path / "part" / "checkpoints" / "last.ckpt")
    assert full and full.keys() == part.keys() and all("lora_" in k for k in full)
    assert any(v.abs().max() > 0 for k, v in full.items() if "lora_B" in k)  # it trained
    for k in full:
        torch.testing.assert_close(part[k], full[k], atol=1e-6, rtol=0)
    assert [v for _, v in scalars(tmp_path / "part", "loss")] == [v for _, v in scalars(tmp_path / "full", "loss")]


@pytest.mark.slow  # a real process with the FSDP2 strategy
def test_sharded_checkpoints_are_refused_with_the_fix(tmp_path: Path) -> None:
    strategy = '{"class_path": "lightning.pytorch.strategies.ModelParallelStrategy"}'
    result = run_cli("fit", "--config", str(TINY), *QUIET, "--trainer.strategy", strategy, root=tmp_path)
    assert result.returncode == 2
    assert "save_distributed_checkpoint: false" in result.stderr and "Traceback" not in result.stderr


INTERRUPT_ARGS = ("--trainer.max_steps", "8", "--trainer.limit_val_batches", "0")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """One uninterrupted run that every kill-and-resume test compares against."""
    root = tmp_path_factory.mktemp("uninterrupted")
    fit(root, *INTERRUPT_ARGS)
    return root


def _interrupt_and_resume(root: Path, reference: Path, signum: int, phase: str) -> None:
    """Signal a real run while it is inside ``phase`` of training step 3, resume it with
    ``--ckpt_path last``, and compare with the uninterrupted run."""
    gate = root / "gate"
    probe = '{"class_path": "tests.probes.GateInStep", "init_args": {"folder": "%s", "iteration": 3, "phase": "%s"}}'
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("LIT_TREEGRPO_DEBUG", None)
    command = [sys.executable, "-m", "lit_treegrpo", "fit", "--config", str(TINY), *QUIET, *INTERRUPT_ARGS,
               "--trainer.callbacks+", probe % (gate, phase), "--trainer.default_root_dir", str(root / "part")]  # fmt: skip
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (gate / "inside").exists():  # the run is now held inside step 3's `phase`
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the run never reached step 3"
        time.sleep(0.05)
    proc.send_signal(signum)
    (gate / "go").touch()  # the signal is on its way; let the step go on
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    # a rollout stops at its next model call, so step 3 never ran; a training pass ends at its optimizer step
    saved = 3 if phase == "rollout" else 4
    assert f"Interrupted after training step {saved}: checkpoint written to" in out + err
    assert "`weights_only` was not set" not in out + err  # no stray line from Lightning
    # a Ctrl-C is said as one, not as the SIGTERM the callback turns it into; a SIGTERM as itself
    assert ("Ctrl-C: stopping after the current step" in out + err) == (signum == signal.SIGINT)
    assert ("Received SIGTERM" in out + err) == (signum == signal.SIGTERM), out + err
    last = root / "part" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["lit_treegrpo"]["iteration"] == saved
    resumed = fit(root / "part", *INTERRUPT_ARGS, "--trainer.callbacks+", probe % (gate, phase), "--ckpt_path", "last")
    assert "Resuming from" in resumed.stdout + resumed.stderr
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.ckpt"]  # no temporary file left
    a, b = trainable(reference / "checkpoints" / "last.ckpt"), trainable(last)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "the interrupted and resumed run differs"
    assert [v for _, v in scalars(root / "part", "loss")] == [v for _, v in scalars(reference, "loss")]


@pytest.mark.slow  # real processes killed and resumed: minutes on 2 cores
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_rollout_stops_it_and_resume_loses_nothing(
    tmp_path: Path, uninterrupted: Path, signum
) -> None:
    _interrupt_and_resume(tmp_path, uninterrupted, signum, "rollout")


@pytest.mark.slow  # real processes killed and resumed: minutes on 2 cores
def test_sigterm_during_the_training_pass_saves_the_step_and_resume_loses_nothing(
    tmp_path: Path, uninterrupted: Path
) -> None:
    _interrupt_and_resume(tmp_path, uninterrupted, signal.SIGTERM, "training")


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden ones included), by relative path, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", ["validate", "test"])
def test_sigterm_during_validate_or_test_leaves_the_run_folder_untouched(
    tmp_path: Path, capsys, monkeypatch, command: str
) -> None:
    # the README's `validate --config ...` runs in the fit's own folder: a checkpoint written on
    # its interrupt would replace the trained last.ckpt with the untrained weights
    from lit_treegrpo.cli import main

    root = tmp_path / "run"
    _log_to_this_stderr(monkeypatch)
    main(["fit", "--config", str(TINY), *QUIET, "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0",
          "--trainer.default_root_dir", str(root)])  # fmt: skip
    before = snapshot(root)
    assert "checkpoints/last.ckpt" in before and "tensorboard/config.yaml" in before
    probe = '{"class_path": "tests.probes.SignalInEval", "init_args": {"batch": 0}}'
    line = _main_error(monkeypatch, capsys, command, "--config", str(TINY), *QUIET, "--trainer.callbacks+", probe,
                       "--trainer.default_root_dir", str(root), code=143)  # fmt: skip
    assert line.startswith(f"error: {command} was stopped by SIGTERM; no checkpoint or config was written"), line
    assert snapshot(root) == before


def test_sigterm_during_predict_stops_before_the_next_batch_and_writes_nothing(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    # Lightning's predict loop never looks at SIGTERM: without CheckpointOnInterrupt's check it
    # would predict every prompt and exit 0
    root = tmp_path / "run"
    (root / "checkpoints").mkdir(parents=True)
    (root / "checkpoints" / "last.ckpt").write_bytes(b"the trained weights")
    before = snapshot(root)
    probe = '{"class_path": "tests.probes.SignalInEval", "init_args": {"batch": 0}}'
    line = _main_error(monkeypatch, capsys, "predict", "--config", str(TINY), *QUIET, "--trainer.callbacks+", probe,
                       "--trainer.default_root_dir", str(root), code=143)  # fmt: skip
    assert line.startswith("error: predict was stopped by SIGTERM; no checkpoint or config was written"), line
    assert snapshot(root) == before  # not even the first batch's images
