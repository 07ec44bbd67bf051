"""RewardMetrics: statistics by hand, per-prompt tables, checks on the step outputs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from lit_treegrpo.callbacks import RewardMetrics, RewardStats
from lit_treegrpo.callbacks.reward_metrics import format_table, merge_sums, per_prompt_sums
from lit_treegrpo.core.samples import ScoredSamples

from .helpers import TRAIN_PROMPTS, StandIn, prompt_loader, trainer


def test_reward_stats_hand_numbers() -> None:
    # values 1, 2, 3, 4 in two updates: mean 2.5; squared deviations 2.25, .25, .25, 2.25 -> var 5/4
    stats = RewardStats()
    stats.update(torch.tensor([1.0, 2.0]))
    stats.update(torch.tensor([3.0, 4.0]))
    out = stats.compute()
    assert out["mean"].item() == 2.5
    assert out["std"].item() == pytest.approx(math.sqrt(1.25), rel=1e-12)
    assert (out["max"].item(), out["min"].item()) == (4.0, 1.0)


def test_per_prompt_sums_and_merge_hand_numbers() -> None:
    sums = per_prompt_sums(torch.tensor([1.0, 3.0, 0.0, 0.5]), ["a", "a", "b", "b"])
    assert sums == {"a": [4.0, 2.0], "b": [0.5, 2.0]}
    merged = merge_sums([sums, {"b": [1.5, 1.0], "c": [2.0, 1.0]}])
    assert merged == {"a": [4.0, 2.0], "b": [2.0, 3.0], "c": [2.0, 1.0]}


def test_format_table_best_and_worst() -> None:
    rows = {"p1": (0.5, 2), "p2": (0.9, 2), "p3": (0.1, 2)}
    text = format_table(rows, ("mean", "images"), 1, "title")
    best, worst = text.split("**worst 1**")
    assert "| 1 | p2 | 0.9 | 2 |" in best and "p1" not in best and "p3" not in best
    assert "| 3 | p3 | 0.1 | 2 |" in worst and "p1" not in worst
    everything = format_table(rows, ("mean", "images"), 2, "title")  # 3 rows <= 2 k: all, best first
    assert everything.index("p2") < everything.index("p1") < everything.index("p3")
    assert "worst" not in everything


def test_non_finite_reward_names_the_prompts(tmp_path) -> None:
    module = StandIn(nan_prompt="a blue square")
    with pytest.raises(ValueError, match="non-finite reward") as err:
        trainer(tmp_path, 1, [RewardMetrics()]).fit(module, prompt_loader(TRAIN_PROMPTS))
    assert "['a blue square']" in str(err.value)
    assert "a red circle" not in str(err.value)


def test_outputs_without_rewards_are_an_error() -> None:
    cb = RewardMetrics()
    cb.on_train_batch_start(None, SimpleNamespace(iteration=3), None, 0)
    with pytest.raises(ValueError, match="training step 3 to return lit_treegrpo.core.ScoredSamples"):
        cb.on_train_batch_end(None, None, {"loss": torch.zeros(())}, None, 0)
    with pytest.raises(ValueError, match="got dict"):  # the old string-keyed outputs
        cb.on_train_batch_end(None, None, {"rewards": torch.zeros(2), "leaf_prompts": ["a", "b"]}, None, 0)
    outputs = ScoredSamples(torch.zeros(3), {}, ["a", "b"]).as_step_output()
    with pytest.raises(ValueError, match=r"reward has shape \(3,\) but there are 2 prompts"):
        cb.on_train_batch_end(None, None, outputs, None, 0)


def test_state_dict_round_trip() -> None:
    cb = RewardMetrics()
    cb.table = {"a": [1.5, 3.0, 0.5], "b": [0.0, 1.0, 0.0]}
    restored = RewardMetrics()
    restored.load_state_dict(cb.state_dict())
    assert restored.table == cb.table


def recording_module(iteration: int = 0) -> tuple[SimpleNamespace, dict[str, tuple[float, dict]]]:
    logged: dict[str, tuple[float, dict]] = {}

    def log(name: str, value, **kwargs) -> None:
        logged[name] = (float(value), kwargs)

    return SimpleNamespace(iteration=iteration, log=log), logged


def test_step_logs_hand_numbers_and_ranks_prompts_by_a_component() -> None:
    # total [1, 3, 0, 0]: mean 1, population var (0 + 4 + 1 + 1) / 4 = 1.5, max 3, min 0;
    # hps per prompt: a = (0.2 + 0.4) / 2 = 0.3, b = (0.9 + 0.7) / 2 = 0.8
    cb = RewardMetrics(prompt_key="reward/hps")
    module, logged = recording_module()
    single = SimpleNamespace(world_size=1, is_global_zero=True, loggers=[])
    outputs = ScoredSamples(
        rewards=torch.tensor([1.0, 3.0, 0.0, 0.0]),
        reward_components={"hps": torch.tensor([0.2, 0.4, 0.9, 0.7])},
        prompts=["a", "a", "b", "b"],
    ).as_step_output()
    cb.on_train_batch_start(single, module, None, 0)
    cb.on_train_batch_end(single, module, outputs, None, 0)
    assert logged["reward/mean"] == (1.0, dict(prog_bar=True, on_step=True, on_epoch=False))
    assert logged["reward/std"][0] == pytest.approx(math.sqrt(1.5), rel=1e-6)
    assert (logged["reward/max"][0], logged["reward/min"][0]) == (3.0, 0.0)
    assert logged["reward/hps/mean"][0] == pytest.approx(0.55, rel=1e-6)
    assert logged["reward/hps/prompt_best"][0] == pytest.approx(0.8, rel=1e-6)
    assert logged["reward/hps/prompt_worst"][0] == pytest.approx(0.3, rel=1e-6)
    assert "reward/prompt_best" not in logged
    assert cb.table["b"] == pytest.approx([1.6, 2.0, 0.8])
    assert not logged["reward/hps/std"][1]["prog_bar"]

    missing = RewardMetrics(prompt_key="reward/clip")
    missing.on_train_batch_start(single, module, None, 0)
    with pytest.raises(ValueError, match=r"prompt_key='reward/clip' is not among"):
        missing.on_train_batch_end(single, module, outputs, None, 0)
    with pytest.raises(ValueError, match="RewardMetrics.prompt_key"):
        RewardMetrics(prompt_key="hps")


def test_changed_prompt_key_restarts_the_table_with_a_warning() -> None:
    cb = RewardMetrics()
    cb.table = {"a": [1.0, 2.0, 0.5]}
    other = RewardMetrics(prompt_key="reward/hps")
    with pytest.warns(UserWarning, match="prompt_key changed"):
        other.load_state_dict(cb.state_dict())
    assert other.table == {}
