"""Values checked where they enter, before any model loads (issue "Found by a fuzzer"): infinities wherever NaN is
refused, learning-rate schedules simulated over the run, duplicate stateful callbacks, adapter values with their
option's full name; and a reward's wide scores that float32 cannot tell apart."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_treegrpo.cli.user_errors import UserError
from tests.cli.test_cli import QUIET, TINY, _main_error
from tests.cli.test_trainer_options import parser as trainer_options_parser


@pytest.fixture(scope="module")
def parser():
    return trainer_options_parser.__wrapped__()


def _check(parser, tmp_path: Path, *args: str) -> None:
    from lit_treegrpo.cli.checks import check_config

    config = parser.parse_args(["fit", "--config", str(TINY), "--trainer.default_root_dir", str(tmp_path), *args])
    check_config(config["fit"], subcommand="fit")


def _refused(parser, tmp_path: Path, *args: str) -> str:
    with pytest.raises(UserError) as refused:
        _check(parser, tmp_path, *args)
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "option",
    [
        "--model.optimizer.init_args.lr",
        "--model.adapter.init_args.guidance_scale",
        "--model.adapter.init_args.noise_level",
    ],
)
@pytest.mark.parametrize("value", [".inf", "-.inf"])
def test_infinities_are_refused_wherever_nan_is(parser, tmp_path: Path, option: str, value: str) -> None:
    message = _refused(parser, tmp_path, f"{option}={value}")  # "=": a leading "-" is no flag
    assert message.startswith(f"{option}: {'-' if value.startswith('-') else ''}inf is not a value any option accepts")


SCHEDULES = {
    # gamma -1: the rate flips sign every step (it trained with lr -0.01 every other step, rc 0)
    ("torch.optim.lr_scheduler.ExponentialLR", "gamma", "-1"): "sets the learning rate to -0.01 at optimizer step 1",
    # step_size 0: a ZeroDivisionError traceback after step 1
    ("torch.optim.lr_scheduler.StepLR", "step_size", "0"): "fails: ZeroDivisionError",
    ("torch.optim.lr_scheduler.ExponentialLR", "gamma", "1e200"): "sets the learning rate to inf",
}


@pytest.mark.parametrize(("schedule", "arg", "value"), list(SCHEDULES))
def test_a_learning_rate_schedule_is_simulated_before_any_model_loads(parser, tmp_path, schedule, arg, value) -> None:
    message = _refused(
        parser, tmp_path, "--model.lr_scheduler", schedule, f"--model.lr_scheduler.init_args.{arg}", value
    )
    assert message.startswith("--model.lr_scheduler: " + schedule), message
    assert SCHEDULES[schedule, arg, value] in message and "fix the schedule's arguments" in message
    # a sound schedule passes
    _check(parser, tmp_path, "--model.lr_scheduler", schedule, f"--model.lr_scheduler.init_args.{arg}", "1")


def test_two_stateful_callbacks_of_one_type_are_refused_in_one_line(monkeypatch, capsys, tmp_path: Path) -> None:
    ema = '{"class_path": "lit_treegrpo.callbacks.EMA"}'
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--trainer.callbacks+", ema,
                       "--trainer.callbacks+", ema, "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert line.startswith("error: --trainer.callbacks has 2 EMA callbacks; each keeps its state"), line


ADAPTER_CASES = {
    ("adapter.init_args.noise_level", "-1"): "--model.adapter.init_args.noise_level must be > 0",
    ("adapter.init_args.resolution", "7"): "--model.adapter.init_args.resolution must be a multiple of 8",
    ("adapter.init_args.decode_batch_size", "0"): "--model.adapter.init_args.decode_batch_size must be a whole number",
    ("compute_cost.trained", "-5"): "--model.compute_cost.trained must be a finite number >= 0, got -5",
}


@pytest.mark.parametrize(("option", "value"), list(ADAPTER_CASES))
def test_adapter_values_are_refused_before_the_model_is_built_naming_the_option(
    parser, tmp_path: Path, monkeypatch, option: str, value: str
) -> None:
    from lit_treegrpo.models.sd3 import SD3Adapter

    def never(*args, **kwargs):
        raise AssertionError("the adapter was built before its values were checked")

    monkeypatch.setattr(SD3Adapter, "__init__", never)
    message = _refused(parser, tmp_path, f"--model.{option}", value)
    assert message.startswith(ADAPTER_CASES[option, value]), message


def test_wide_scores_that_float32_cannot_tell_apart_are_named() -> None:
    from lit_treegrpo.rewards import RewardModel, RewardOutputError

    class Billions(RewardModel):
        name = "billions"

        def score_batch(self, images, prompts):  # float64 around 1e9, 10 apart: float32 keeps 64 apart
            return 1e9 + 10.0 * torch.arange(images.shape[0], dtype=torch.float64)

    with pytest.raises(RewardOutputError, match=r"^reward 'billions' returned torch.float64 scores around 1e\+09"):
        Billions()(torch.rand(8, 3, 8, 8), ["a"] * 8)

    class Fine(RewardModel):
        name = "fine"

        def score_batch(self, images, prompts):  # float64 in [0, 1], or equal up to float64 rounding: kept
            return torch.linspace(0, 1, images.shape[0], dtype=torch.float64) + 0.7 * (images.shape[0] == 2)

    assert Fine()(torch.rand(8, 3, 8, 8), ["a"] * 8).dtype == torch.float32
    constant = torch.full((4,), 0.7, dtype=torch.float64) + torch.tensor([0, 1e-17, 0, 2e-17], dtype=torch.float64)
    from lit_treegrpo.rewards.scores import check_scores

    assert torch.equal(check_scores(constant, 4, "constant"), constant.float())


WORK = {
    # each ran for minutes to hours ignoring SIGTERM and SIGINT, or allocated tens of GB, on main before the bound
    ("--model.inner_epochs", "1000000000"): "one training iteration (",
    ("--model.val_samples", "1000000"): "one validation pass (",
    ("--model.adapter.init_args.num_steps", "1000000000000000000"): "--model.adapter.init_args.num_steps 1,000,",
    ("--model.tree.num_steps", "1000000000000000000"): "--model.tree.num_steps 1,000,000,000,000,000,000: one",
    ("--model.adapter.init_args.resolution", "100000"): "--model.adapter.init_args.resolution 100,000: one sample",
}


@pytest.mark.parametrize(("option", "value"), list(WORK))
def test_work_past_the_bound_is_refused_before_any_model_loads(parser, tmp_path: Path, option, value) -> None:
    message = _refused(parser, tmp_path, option, value)
    assert message.startswith(WORK[option, value]), message
    assert "--model.work_limit.max_" in message and "knowingly" in message


def test_a_bound_raised_knowingly_lets_the_run_start(parser, tmp_path: Path) -> None:
    _check(parser, tmp_path, "--model.val_samples", "1000000", "--model.work_limit.max_evaluations", "10000000000")
    message = _refused(parser, tmp_path, "--model.work_limit.max_evaluations", "0")
    assert message.startswith("--model.work_limit: work_limit.max_evaluations must be a whole number >= 1, got 0")


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        # found by the fuzzer: the settings' own message named lora.alpha, not the option
        ("--model.adapter.init_args.lora.alpha", "0", "--model.adapter.init_args.lora.alpha must be > 0, got 0.0"),
        ("--model.adapter.init_args.lora.dropout", "1e30", "--model.adapter.init_args.lora.dropout must be in [0, 1)"),
        # argparse took -inf and -4e16 for options and blamed the option before them; now they are values
        (
            "--model.optimizer.init_args.weight_decay",
            "-inf",
            "--model.optimizer.init_args.weight_decay: expected float",
        ),
        ("--model.loss.init_args.kl_beta", "-4.05e+16", "--model.loss: loss.kl_beta must be >= 0, got -4.05e+16"),
        # a guidance weight whose images overflow: the run blamed the reward for their NaN
        ("--model.adapter.init_args.guidance_scale", "1e226", "--model.adapter.init_args.guidance_scale must be in [0"),
        # Lightning trains to min_steps whatever max_steps or max_time say (1e18 ran until killed)
        ("--trainer.min_steps", "1000000000000000000", "--trainer.min_steps 1000000000000000000 is past --trainer.max"),
        # a name past NAME_MAX: an OSError traceback from the first Path.exists
        ("--model.adapter.init_args.pretrained", "n" * 300, "--model.adapter.init_args.pretrained: the path is longer"),
        ("--data.prompts", "/tmp/" + "n" * 300 + "/p.txt", "--data.prompts: the path is longer than this system"),
    ],
)
def test_a_value_refused_while_parsing_names_its_option_and_the_fix(
    monkeypatch, capsys, tmp_path: Path, option: str, value: str, says: str
) -> None:
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, option, value,
                       "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert line.startswith(f"error: {says}"), line


def test_an_empty_config_file_is_named_with_what_it_should_hold(monkeypatch, capsys, tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")  # jsonargparse said "Unexpected config:"
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), "--config", str(empty), *QUIET,
                       "--trainer.default_root_dir", str(tmp_path / "run"))  # fmt: skip
    assert line.startswith(f"error: --config {empty}: the file is empty; give a mapping such as"), line


def test_a_picture_callbacks_padding_past_the_bound_is_refused() -> None:
    from lit_treegrpo.callbacks import SampleGridLogger

    with pytest.raises(ValueError, match=r"^SampleGridLogger.padding must be an integer in 0 \.\. 64 .*got 3455$"):
        SampleGridLogger(padding=3455)  # asked for 5.6 GiB at the first grid
