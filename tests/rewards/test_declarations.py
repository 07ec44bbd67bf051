"""Rule 3 (docs/failure_modes.md) for the rewards: every value inside ``--model.reward_kwargs`` is
checked, before any model loads, against the type and range its reward's loader declares, and what
a reward returns is checked at its first call (a real float tensor of one score per image)."""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
import torch

from lit_treegrpo.common.values import ArgumentError, Range, check_value, declared
from lit_treegrpo.rewards import REWARDS, Brightness, MultiReward, RewardModel, RewardOutputError, RewardScores
from tests.cli.test_cli import QUIET, TINY, _main_error


@pytest.mark.parametrize(
    ("value", "hint", "message"),
    [
        ("abc", Annotated[float, Range(0, 1)] | None, "expected a number in [0, 1] or null, got 'abc'"),
        (2.0, Annotated[float, Range(0, 1)] | None, "must be in [0, 1], got 2.0"),
        (float("inf"), float, "must be a finite number, got inf"),
        (True, int, "expected an integer, got True"),
        (0, Annotated[int, Range(1)], "must be >= 1, got 0"),
        (0.0, Annotated[float, Range(0, 0.5, low_open=True)], "must be in (0, 0.5], got 0.0"),
        ("l3", Literal["l2", "cosine"], "expected one of 'l2', 'cosine', got 'l3'"),
        ("  ", str | Path, "empty; give a path"),
        ([1, "x"], list[int], "[1]: expected an integer, got 'x'"),
        ({"a": "x"}, dict[str, float], ".a: expected a number, got 'x'"),
        ("float16", torch.dtype, "expected a dtype, got 'float16'"),
    ],
)
def test_a_value_is_checked_against_its_declared_type_and_range(value: Any, hint: Any, message: str) -> None:
    with pytest.raises(ArgumentError) as err:
        check_value(value, hint, "--opt")
    assert message in str(err.value) and str(err.value).startswith("--opt"), str(err.value)


@pytest.mark.parametrize(
    ("value", "hint"),
    [(None, Annotated[float, Range(0, 1)] | None), (1, float), (0.5, Annotated[float, Range(0, 1)]), ("v2.1", str | Path),
     ("l2", Literal["l2", "cosine"]), (torch.float16, torch.dtype), ({"target": 1}, Any), (print, Any)],
)  # fmt: skip
def test_a_value_of_the_declared_type_passes(value: Any, hint: Any) -> None:
    check_value(value, hint, "--opt")


def test_every_reward_declares_the_type_of_every_argument_a_config_can_give() -> None:
    for name in REWARDS:
        loader = REWARDS[name]
        params = inspect.signature(loader).parameters
        hints = declared(loader)
        undeclared = [p for p in params if hints[p] is Any and params[p].kind is not inspect.Parameter.VAR_KEYWORD]
        assert not undeclared, f"reward {name!r} declares no type for {undeclared}"
        assert "Range" in str(hints["max_batch"]), f"reward {name!r}: max_batch without its range"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ("{brightness: {target: abc}}", "--model.reward_kwargs.brightness.target: expected a number in [0, 1] or null, got 'abc'"),
        ("{brightness: {target: 1.5}}", "--model.reward_kwargs.brightness.target must be in [0, 1], got 1.5"),
        ("{brightness: {max_batch: 0}}", "--model.reward_kwargs.brightness.max_batch must be >= 1, got 0"),
        ("{brightness: {max_batch: [2]}}", "--model.reward_kwargs.brightness.max_batch: expected an integer >= 1 or null"),
        ("{brightness: 3}", "--model.reward_kwargs: \"{'brightness': 3}\" is none of dict[str, dict[str, Any]], null"),
    ],
)  # fmt: skip
def test_reward_kwargs_are_refused_by_type_and_range_before_any_model_loads(
    tmp_path: Path, capsys, monkeypatch, no_model, kwargs: str, message: str
) -> None:
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--model.reward_kwargs", kwargs,
                       "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert line.startswith(f"error: {message}"), line


@pytest.mark.parametrize(
    ("reward", "kwargs", "message"),
    [
        ("jpeg_compressibility", "{jpeg_compressibility: {quality: 101}}", ".jpeg_compressibility.quality must be in [1, 100], got 101"),
        ("shapes", "{shapes: {slack: 0}}", ".shapes.slack must be in (0, 0.5], got 0"),
        ("hps", "{hps: {checkpoint: ' '}}", ".hps.checkpoint: empty; give a path"),
        ("temporal_consistency", "{temporal_consistency: {metric: l3}}", ".temporal_consistency.metric: expected one of 'l2', 'cosine'"),
        ("frame_average", "{frame_average: {image: brightness, image_kwargs: {target: abc}}}",
         ".frame_average.image_kwargs.target: expected a number in [0, 1] or null, got 'abc'"),
        ("frame_average", "{frame_average: {image: brightness, image_kwargs: {targt: 0.5}}}",
         ".frame_average.image_kwargs.targt: reward 'brightness' takes no argument 'targt'; did you mean target?"),
        ("frame_average", "{frame_average: {image: nope}}", ".frame_average.image: unknown reward 'nope'"),
    ],
)  # fmt: skip
def test_each_reward_is_checked_by_its_own_declaration_nested_rewards_included(
    reward: str, kwargs: str, message: str
) -> None:
    import yaml

    from lit_treegrpo.cli.checks import check_reward_arguments
    from lit_treegrpo.cli.user_errors import UserError

    with pytest.raises(UserError) as err:
        check_reward_arguments([reward], yaml.safe_load(kwargs))
    assert str(err.value).startswith(f"--model.reward_kwargs{message}"), str(err.value)


# ------------------------------------------------------------------------ what a reward returns
class Returns(RewardModel):
    """Scores with whatever ``make(batch size)`` gives."""

    name = "mine"

    def __init__(self, make: Any) -> None:
        super().__init__()
        self.make = make
        self.freeze()

    def score_batch(self, images: torch.Tensor, prompts: list[str]) -> Any:
        return self.make(len(prompts))


class ScoresItself(RewardModel):
    """Overrides ``score`` (as a reward of its own making may) and returns ``out``."""

    def __init__(self, out: Any) -> None:
        super().__init__()
        self.out = out

    def score(self, images: torch.Tensor, prompts: list[str], *, check: bool = True) -> Any:
        return self.out


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda n: [0.5] * n, "reward 'mine' returned a list, not a torch.Tensor; make the reward return a float tensor of shape [3]"),
        (lambda n: torch.zeros(n, 2), "reward 'mine' returned scores of shape [3, 2] for 3 images"),
        (lambda n: torch.zeros(n + 1), "reward 'mine' returned scores of shape [4] for 3 images"),
        (lambda n: torch.zeros(n, dtype=torch.complex64), "reward 'mine' returned complex scores (torch.complex64)"),
        (lambda n: torch.ones(n, dtype=torch.int64), "reward 'mine' returned torch.int64 scores"),
        (lambda n: torch.tensor(0.5), "reward 'mine' returned scores of shape [] for 3 images"),
    ],
)  # fmt: skip
def test_what_a_reward_returns_is_checked_at_its_first_call(make: Any, message: str) -> None:
    images = torch.rand(3, 3, 8, 8)
    for call in (lambda r: r(images, ["a"] * 3), lambda r: r.score(images, ["a"] * 3, check=False)):
        with pytest.raises(RewardOutputError) as err:
            call(Returns(make))
        assert str(err.value).startswith(message), str(err.value)
    with pytest.raises(RewardOutputError, match="reward 'mine' returned"):  # inside a weighted sum too
        MultiReward({"m": Returns(make), "b": Brightness()}).score(images, ["a"] * 3)


def test_a_reward_that_scores_itself_is_checked_too_and_a_good_one_passes() -> None:
    images = torch.rand(2, 3, 8, 8)
    with pytest.raises(RewardOutputError, match=r"^reward 'ScoresItself': score\(\) returned a list, not RewardScores"):
        ScoresItself([1.0, 2.0]).score(images, ["a", "b"])
    with pytest.raises(RewardOutputError, match=r"^reward 'ScoresItself/c' returned scores of shape \[3\]"):
        ScoresItself(RewardScores(torch.zeros(2), {"c": torch.zeros(3)})).score(images, ["a", "b"])
    column = Returns(lambda n: torch.full((n, 1), 0.25, dtype=torch.float64))  # a linear head's [B, 1]
    assert column.score(images, ["a", "b"]).total.tolist() == [0.25, 0.25]
    assert column(images, ["a", "b"]).dtype == torch.float32


def test_a_wrong_reward_output_is_never_skipped_and_ends_in_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    reward = '{"class_path": "tests.rewards.test_declarations.ListReward"}'
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, "--model.reward", reward,
                           "--model.faults.nonfinite", "skip", "--trainer.callbacks=[]", "--trainer.max_steps", "1",
                           "--trainer.limit_val_batches", "0", "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert line.startswith("error: reward 'ListReward' returned a list, not a torch.Tensor"), line


class ListReward(RewardModel):
    """A custom reward that returns a Python list (the trial's AttributeError traceback)."""

    def score_batch(self, images: torch.Tensor, prompts: list[str]) -> Any:
        return [0.5] * len(prompts)
