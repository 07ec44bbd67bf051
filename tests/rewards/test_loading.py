"""Loaders: local paths and hub ids, one-line errors naming what is missing, the extra's hint."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from lit_treegrpo.rewards import (
    Aesthetic,
    CLIPScore,
    HPSv2,
    ImageReward,
    PickScore,
    RewardLoadError,
    build_reward,
)
from lit_treegrpo.rewards.clip_common import write_tiny_clip


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message, f"multi-line error: {message!r}"
    return message


@pytest.mark.parametrize(
    ("load", "named"),
    [
        (
            lambda p: PickScore.from_pretrained(p / "missing-model", p / "missing-tok"),
            "PickScore model",
        ),
        (lambda p: CLIPScore.from_pretrained(p / "missing-model"), "CLIPScore model"),
        (lambda p: Aesthetic.from_pretrained(p / "missing-head.pth"), "aesthetic head"),
        (lambda p: HPSv2.from_pretrained(p / "missing-hps.pt"), "HPS checkpoint"),
    ],
)
def test_a_missing_local_path_gives_one_line_naming_it(tmp_path, load, named) -> None:
    with pytest.raises(RewardLoadError) as err:
        load(tmp_path)
    message = one_line(err)
    assert named in message and str(tmp_path / "missing-") in message


@pytest.mark.parametrize(
    ("load", "named"),
    [
        (lambda: PickScore.from_pretrained(), "'yuvalkirstain/PickScore_v1'"),
        (lambda: CLIPScore.from_pretrained(), "'openai/clip-vit-large-patch14'"),
        (lambda: HPSv2.from_pretrained("v2.1"), "'xswu/HPSv2/HPS_v2.1_compressed.pt'"),
        (lambda: HPSv2.from_pretrained("v2.0"), "'xswu/HPSv2/HPS_v2_compressed.pt'"),
        (
            lambda: build_reward("aesthetic", head="nobody/nothing/head.pth"),
            "'nobody/nothing/head.pth'",
        ),
    ],
)
def test_a_hub_id_missing_offline_gives_one_line_naming_it(monkeypatch, tmp_path, load, named) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # conftest sets it; say so where it matters
    with pytest.raises(RewardLoadError) as err:
        load()
    assert named in one_line(err)


def test_a_model_folder_without_tokenizer_names_the_tokenizer(tmp_path) -> None:
    folder = write_tiny_clip(tmp_path / "clip")
    for name in ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    with pytest.raises(RewardLoadError) as err:
        PickScore.from_pretrained(folder, folder)
    assert "PickScore tokenizer" in one_line(err)


def test_tiny_reward_round_trips_through_a_local_folder(tmp_path) -> None:
    first = PickScore.tiny(tmp_path / "a", seed=0)
    again = PickScore.from_pretrained(tmp_path / "a", tmp_path / "a")  # the real loading path
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(first(x, ["a", "b"]), again(x, ["a", "b"]), rtol=0, atol=0)


@pytest.mark.skipif(
    importlib.util.find_spec("ImageReward") is not None,
    reason="the image-reward extra is installed here; test_extra_parity covers it",
)
def test_image_reward_without_the_extra_names_the_extra() -> None:
    with pytest.raises(ImportError, match=r"pip install 'lit-treegrpo\[image-reward\]'"):
        ImageReward.from_pretrained()
    with pytest.raises(ImportError, match=r"lit-treegrpo\[image-reward\]"):
        build_reward("image_reward")
