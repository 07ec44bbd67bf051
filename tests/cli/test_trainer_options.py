"""Bad values of the Trainer's options, the optimizer's arguments and the rewards' loaders' arguments
are refused before any model loads, in one line naming the option (``cli_checks.check_config``).

The walk over every numeric Trainer option parses each case with one parser built once and runs the
checks the CLI runs before instantiating anything, so that a case takes a tenth of a second; a few
cases go through ``python -m lit_treegrpo``'s ``main`` to show the ``error: ...`` line and status 2.
"""

from __future__ import annotations

import datetime
import typing
from pathlib import Path
from typing import Any

import pytest

from lit_treegrpo.cli.user_errors import UserError
from tests.cli.test_cli import QUIET, TINY, _main_error

#: every value each numeric option is fed: zero, negative, NaN (as text and as YAML's .nan), no number
BAD = ("0", "-1", "nan", ".nan", "abc")

#: (option, value) that are accepted, and why: each is Lightning's documented meaning of the value
ACCEPTED = {
    ("fast_dev_run", "0"): "off, as false",
    ("max_epochs", "-1"): "no epoch limit (the run stops at max_steps)",
    ("max_steps", "-1"): "no step limit, Lightning's default (the run stops at max_epochs or max_time)",
    ("min_epochs", "0"): "no minimum",
    ("min_steps", "0"): "no minimum",
    ("limit_val_batches", "0"): "no validation during the fit: Lightning's way to turn it off",
    (
        "limit_test_batches",
        "0",
    ): "read by test only, which refuses 0 (test_a_command_refuses_a_limit_that_runs_no_batch)",
    ("limit_predict_batches", "0"): "read by predict only, which refuses 0 (same test)",
    ("overfit_batches", "0"): "off, the default",
    ("num_sanity_val_steps", "0"): "no sanity check before training",
    ("num_sanity_val_steps", "-1"): "every validation batch as the sanity check",
    ("reload_dataloaders_every_n_epochs", "0"): "never reload, the default",
}


def _numeric(hint: Any) -> bool:
    """Whether an option's type takes a number or a duration (``int``, ``float``, an int
    ``Literal``, ``timedelta``, inside unions, lists and mappings)."""
    if hint in (int, float, datetime.timedelta):
        return True
    if typing.get_origin(hint) is typing.Literal:
        return any(isinstance(a, int) and not isinstance(a, bool) for a in typing.get_args(hint))
    return any(_numeric(a) for a in typing.get_args(hint))


class _Parsed(Exception):
    """Raised where the CLI would start instantiating: the parser is built and has parsed."""


@pytest.fixture(scope="module")
def parser():
    """The CLI's parser, built once (seconds) and reused by every case (a tenth of a second each)."""
    from lit_treegrpo.cli import TreeGRPOCLI

    class ParseOnly(TreeGRPOCLI):
        def before_instantiate_classes(self) -> None:
            raise _Parsed(self)

    with pytest.raises(_Parsed) as parsed:
        ParseOnly(args=["fit", "--config", str(TINY)])
    return parsed.value.args[0].parser


def _check(parser, tmp_path: Path, *args: str, subcommand: str = "fit") -> None:
    """Parse a command line and run the checks the CLI runs before any model loads; raises the
    one-line :class:`UserError` of the first problem."""
    from lit_treegrpo.cli.checks import check_config

    config = parser.parse_args([subcommand, "--config", str(TINY), "--trainer.default_root_dir", str(tmp_path), *args])
    check_config(config[subcommand], subcommand=subcommand)


def _numeric_trainer_options(parser) -> list[str]:
    fit = parser._subcommands_action._name_parser_map["fit"]
    return [
        a.dest.removeprefix("trainer.")
        for a in fit._actions
        if a.dest.startswith("trainer.") and not a.dest.endswith(".help") and _numeric(getattr(a, "_typehint", None))
    ]


def test_the_walk_covers_the_trainers_numeric_options(parser) -> None:
    found = set(_numeric_trainer_options(parser))
    expected = {
        "num_nodes",
        "devices",
        "precision",
        "fast_dev_run",
        "max_epochs",
        "min_epochs",
        "max_steps",
        "min_steps",
        "max_time",
        "limit_train_batches",
        "limit_val_batches",
        "limit_test_batches",
        "limit_predict_batches",
        "overfit_batches",
        "val_check_interval",
        "check_val_every_n_epoch",
        "num_sanity_val_steps",
        "log_every_n_steps",
        "accumulate_grad_batches",
        "gradient_clip_val",
        "reload_dataloaders_every_n_epochs",
    }
    assert expected <= found, expected - found


def test_every_numeric_trainer_option_refuses_bad_values_in_one_line_or_documents_why_not(
    parser, tmp_path: Path, monkeypatch, no_model
) -> None:
    import functools

    from lightning.pytorch import Trainer

    from lit_treegrpo.rewards.base import RewardModel
    from lit_treegrpo.training.module import TreeGRPOModule

    # the checks must come before anything loads: building the module or a reward (and, through no_model,
    # the tiny model) fails the case, not a clock; wraps keeps the signatures the checks inspect
    def never(function):
        @functools.wraps(function)
        def loaded(*args, **kwargs):
            raise AssertionError(f"{function.__qualname__} ran before the checks ended")

        return loaded

    monkeypatch.setattr(TreeGRPOModule, "__init__", never(TreeGRPOModule.__init__))
    monkeypatch.setattr(RewardModel, "__init__", never(RewardModel.__init__))
    seen = []
    for name in _numeric_trainer_options(parser):
        for value in BAD:
            try:
                _check(parser, tmp_path, f"--trainer.{name}", value)
            except UserError as err:
                message = str(err)
                assert "\n" not in message, (name, value, message)
                assert f"--trainer.{name}" in message, (name, value, message)
                assert (name, value) not in ACCEPTED, (name, value, message)
                seen.append((name, value))
            else:
                assert (name, value) in ACCEPTED, f"--trainer.{name} {value} was accepted without a documented reason"
                # ... and Lightning's Trainer takes it as it is parsed
                parsed = parser.parse_args(["fit", "--config", str(TINY), f"--trainer.{name}", value])["fit"][
                    "trainer"
                ][name]
                Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, **{name: parsed})
    assert len(seen) >= 80, len(seen)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trainer.max_time", "abc"], "--trainer.max_time 'abc': not a duration; give a duration DD:HH:MM:SS"),
        (["--trainer.max_time", "-1"], "--trainer.max_time '-1': not a duration"),
        (["--trainer.max_time", "00:00:00:-1"], "--trainer.max_time '00:00:00:-1': not a duration"),
        (["--trainer.max_time", "00:00:00:00"], "--trainer.max_time 00:00:00:00: stops the run before its first step"),
        (["--trainer.max_time", "{hours: -1}"], "--trainer.max_time {'hours': -1}: a negative or non-numeric part"),
        (["--trainer.max_time", "{hour: 1}"], "--trainer.max_time {'hour': 1}: 'hour' is no unit of a duration"),
        (["--trainer.val_check_interval", "00:00:00:00"], "--trainer.val_check_interval 00:00:00:00: a zero duration"),
        (
            ["--trainer.val_check_interval", "1.5"],
            "--trainer.val_check_interval 1.5: give the training steps between validations",
        ),
        (
            ["--trainer.val_check_interval", "0.5"],
            "--trainer.val_check_interval 0.5: a fraction of an epoch needs --trainer.check_val_every_n_epoch",
        ),
        (
            ["--trainer.limit_val_batches", "1.5"],
            "--trainer.limit_val_batches must be a fraction of the batches in [0.0, 1.0] or a whole number",
        ),
        (["--trainer.limit_train_batches", "0"], "--trainer.limit_train_batches 0: fit would run no batch"),
        (["--trainer.max_steps", "0"], "--trainer.max_steps 0: the fit would train nothing"),
        (["--trainer.log_every_n_steps", "0"], "--trainer.log_every_n_steps 0: the run would log nothing"),
        (
            ["--trainer.accumulate_grad_batches", "2"],
            "--trainer.accumulate_grad_batches 2: this module steps its optimizer itself",
        ),
        (
            ["--trainer.gradient_clip_val", "0.5"],
            "--trainer.gradient_clip_val 0.5: this module clips its own gradients",
        ),
        (
            ["--trainer.gradient_clip_algorithm", "value"],
            "--trainer.gradient_clip_algorithm value: this module clips its own gradients",
        ),
        (["--trainer.devices", "-1"], "--trainer.devices -1: -1 (every device) selects GPUs, this run is on the CPU"),
        (["--trainer.devices", "0,1"], "--trainer.devices 0,1: device indices select GPUs, this run is on the CPU"),
        (["--trainer.devices", "[]"], "--trainer.devices []: device indices are whole numbers >= 0, at least one"),
        (["--trainer.precision", "bf17"], "--trainer.precision: 'bf17' is none of"),
        (["--trainer.default_root_dir", "FILE"], "--trainer.default_root_dir FILE: is a file; give a folder"),
    ],
)
def test_trainer_durations_intervals_devices_and_paths_are_refused_in_one_line(
    parser, tmp_path: Path, args, message
) -> None:
    (tmp_path / "file").write_text("not a folder")
    args = [str(tmp_path / "file") if a == "FILE" else a for a in args]
    with pytest.raises(UserError) as refused:
        _check(parser, tmp_path, *args)
    assert str(refused.value).replace(str(tmp_path / "file"), "FILE").startswith(message), str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("subcommand", "option"),
    [("validate", "limit_val_batches"), ("test", "limit_test_batches"), ("predict", "limit_predict_batches")],
)
def test_a_command_refuses_a_limit_that_runs_no_batch(parser, tmp_path: Path, subcommand: str, option: str) -> None:
    with pytest.raises(
        UserError, match=rf"^--trainer.{option} 0: {subcommand} would run no batch; give a number of batches"
    ):
        _check(parser, tmp_path, f"--trainer.{option}", "0", subcommand=subcommand)
    _check(parser, tmp_path, "--trainer.limit_train_batches", "0", subcommand=subcommand)  # not read by this command


#: the optimizer's arguments: (argument, value) -> the start of the message
OPTIMIZER_CASES = {
    ("lr", "0"): "--model.optimizer.init_args.lr must be > 0 (0 trains nothing), got 0.0",
    ("lr", "-1"): "--model.optimizer.init_args.lr must be > 0 (0 trains nothing), got -1.0",
    ("lr", "nan"): "--model.optimizer.init_args.lr: 'nan' is none of float, Tensor",
    ("lr", ".nan"): "--model.optimizer.init_args.lr: nan is not a value any option accepts",
    ("lr", "abc"): "--model.optimizer.init_args.lr: 'abc' is none of float, Tensor",
    ("weight_decay", "-1"): "--model.optimizer.init_args.weight_decay must be >= 0, got -1.0",
    ("weight_decay", "nan"): "--model.optimizer.init_args.weight_decay: expected float, got 'nan'; fix the value",
    ("weight_decay", "abc"): "--model.optimizer.init_args.weight_decay: expected float, got 'abc'; fix the value",
    (
        "eps",
        "0",
    ): "--model.optimizer.init_args.eps must be > 0 (it keeps an update finite where a gradient is 0), got 0.0",
    ("eps", "-1"): "--model.optimizer.init_args.eps must be > 0",
    ("eps", ".nan"): "--model.optimizer.init_args.eps: nan is not a value any option accepts",
    ("betas", "[0.9, 1.5]"): "--model.optimizer.init_args.betas[1] must be in [0, 1), got 1.5",
    ("betas", "[-1, 0.9]"): "--model.optimizer.init_args.betas[0] must be in [0, 1), got -1",
    ("betas", "abc"): "--model.optimizer.init_args.betas: expected",
}


@pytest.mark.parametrize(("name", "value"), list(OPTIMIZER_CASES), ids=[f"{n}={v}" for n, v in OPTIMIZER_CASES])
def test_bad_optimizer_arguments_are_refused_naming_the_argument(parser, tmp_path: Path, name: str, value: str) -> None:
    with pytest.raises(UserError) as refused:
        _check(parser, tmp_path, f"--model.optimizer.init_args.{name}", value)
    assert str(refused.value).startswith(OPTIMIZER_CASES[name, value]), str(refused.value)
    assert "\n" not in str(refused.value) and "Got value: Namespace" not in str(refused.value)


def test_other_optimizers_are_checked_by_torch_and_the_message_names_the_argument(parser, tmp_path: Path) -> None:
    sgd = ["--model.optimizer", "torch.optim.SGD", "--model.optimizer.init_args.lr", "0.1"]
    with pytest.raises(UserError, match=r"^--model.optimizer.init_args.momentum must be >= 0, got -0.5$"):
        _check(parser, tmp_path, *sgd, "--model.optimizer.init_args.momentum", "-0.5")
    # no rule of ours: torch's own check of the built optimizer, attributed to the argument it names
    with pytest.raises(
        UserError, match=r"^--model.optimizer.init_args.momentum: torch.optim.SGD refuses it: Nesterov momentum"
    ):
        _check(parser, tmp_path, *sgd, "--model.optimizer.init_args.nesterov", "true")
    _check(
        parser,
        tmp_path,
        *sgd,
        "--model.optimizer.init_args.momentum",
        "0.9",
        "--model.optimizer.init_args.nesterov",
        "true",
    )
    _check(parser, tmp_path, "--model.optimizer.init_args.weight_decay", "0")  # accepted: no decay


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            "{brightness: {nope: 1}}",
            "--model.reward_kwargs.brightness.nope: reward 'brightness' takes no argument 'nope'; it takes target, max_batch",
        ),
        (
            "{brightness: {targt: 0.5}}",
            "--model.reward_kwargs.brightness.targt: reward 'brightness' takes no argument 'targt'; did you mean target?",
        ),
    ],
)
def test_unknown_reward_loader_arguments_are_refused_naming_them(
    parser, tmp_path: Path, kwargs: str, message: str
) -> None:
    with pytest.raises(UserError) as refused:
        _check(parser, tmp_path, "--model.reward_kwargs", kwargs)
    assert str(refused.value).startswith(message), str(refused.value)


def test_a_reward_loader_argument_that_is_needed_and_missing_is_refused(parser, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"^--model.reward_kwargs.aesthetic.head: reward 'aesthetic' needs it; give it"):
        _check(parser, tmp_path, "--model.reward", "aesthetic")
    _check(parser, tmp_path, "--model.reward_kwargs", "{brightness: {target: 0.5}}")  # a real argument passes


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trainer.max_time", "abc"], "error: --trainer.max_time 'abc': not a duration"),
        (
            ["--trainer.devices", "-1"],
            "error: --trainer.devices -1: -1 (every device) selects GPUs, this run is on the CPU",
        ),
        (
            ["--model.optimizer.init_args.lr", "-1"],
            "error: --model.optimizer.init_args.lr must be > 0 (0 trains nothing), got -1.0",
        ),
        (
            ["--model.reward_kwargs", "{brightness: {nope: 1}}"],
            "error: --model.reward_kwargs.brightness.nope: reward 'brightness' takes no argument",
        ),
    ],
)
def test_through_the_command_line_the_refusal_is_one_line_and_status_2_before_any_model_loads(
    tmp_path: Path, capsys, monkeypatch, no_model, args, message
) -> None:
    line = _main_error(
        monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, *args, "--trainer.default_root_dir", str(tmp_path)
    )
    assert line.startswith(message), line


def _precision_values() -> list[str]:
    """Every value Lightning's ``precision`` takes, as the command line spells it."""
    from lightning.pytorch.trainer.connectors.accelerator_connector import _PRECISION_INPUT

    return sorted({str(v) for literal in typing.get_args(_PRECISION_INPUT) for v in typing.get_args(literal)})


@pytest.mark.parametrize("value", _precision_values())
def test_every_precision_keeps_float32_weights_or_is_refused_in_one_line(parser, tmp_path: Path, value: str) -> None:
    from lit_treegrpo.cli.trainer_checks import KEEPS_FLOAT32

    if value in KEEPS_FLOAT32:  # the mixed precisions autocast the forward; the weights stay float32 (run below)
        _check(parser, tmp_path, "--trainer.precision", value)
        return
    with pytest.raises(UserError) as refused:
        _check(parser, tmp_path, "--trainer.precision", value)
    message = str(refused.value)
    assert message.startswith(f"--trainer.precision {value}: casts the trained weights themselves"), message
    assert "bf16-mixed" in message and "--model.adapter.init_args.master_weights" in message and "\n" not in message


def test_bf16_true_is_refused_before_any_model_loads(monkeypatch, capsys, tmp_path: Path) -> None:
    # the repro: before, Lightning cast the float32 masters to bf16 and the first step failed in health.py
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--trainer.precision", "bf16-true",
                       "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0",
                       "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert line.startswith("error: --trainer.precision bf16-true: casts the trained weights themselves"), line
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("value", ["32-true", "bf16-mixed", "16-mixed"])
def test_an_accepted_precision_trains_float32_weights(tmp_path: Path, value: str) -> None:
    # the aliases 32, "32", "bf16", 16 and "16" are these three to Lightning
    import torch
    from lightning.pytorch.trainer.connectors.accelerator_connector import _convert_precision_to_unified_args

    from lit_treegrpo.cli import TreeGRPOCLI
    from lit_treegrpo.cli.trainer_checks import KEEPS_FLOAT32

    assert {_convert_precision_to_unified_args(v) for v in KEEPS_FLOAT32} == {"32-true", "bf16-mixed", "16-mixed"}
    cli = TreeGRPOCLI(args=["fit", "--config", str(TINY), *QUIET, "--trainer.precision", value,
                            "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0",
                            "--trainer.default_root_dir", str(tmp_path)])  # fmt: skip
    assert cli.trainer.global_step == 1
    trained = list(cli.model.adapter.trainable_parameters())
    assert trained and all(p.dtype == torch.float32 for p in trained)
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert all(v.dtype == torch.float32 for k, v in saved.items() if "lora" in k) and any("lora" in k for k in saved)
