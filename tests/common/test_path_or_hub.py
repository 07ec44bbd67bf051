"""One rule tells a local path from a hub id, for models and rewards alike (common.hub.local_or_hub_id)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lit_treegrpo.common.hub import local_or_hub_id


def test_an_existing_folder_or_file_is_local(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "org" / "name").mkdir(parents=True)
    (tmp_path / "weights.pt").write_bytes(b"")
    assert local_or_hub_id(str(tmp_path)) is None
    assert local_or_hub_id(tmp_path / "weights.pt") is None
    monkeypatch.chdir(tmp_path)
    assert local_or_hub_id("org/name") is None  # a folder of that name wins over the hub id
    assert local_or_hub_id("weights.pt") is None
    monkeypatch.setenv("HOME", str(tmp_path))
    assert local_or_hub_id("~/weights.pt") is None


@pytest.mark.parametrize(
    "spec",
    ["/no/such/model", "./model", "../model", "~/no-such-model", "a/b/c", Path("model"), f"org{os.sep}x{os.sep}y"],
)
def test_a_missing_path_is_an_error_naming_it(spec, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="^no such file or folder ") as err:
        local_or_hub_id(spec)
    assert str(spec) in str(err.value) and "\n" not in str(err.value)


def test_an_org_name_or_a_bare_name_is_a_hub_id(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert local_or_hub_id("stabilityai/stable-diffusion-3.5-medium") == "stabilityai/stable-diffusion-3.5-medium"
    assert local_or_hub_id("gpt2") == "gpt2"


def test_models_and_rewards_apply_the_same_rule(tmp_path: Path) -> None:
    from transformers import CLIPTokenizer

    from lit_treegrpo.models.base import load_component
    from lit_treegrpo.rewards.base import RewardLoadError, load_or_explain

    missing = str(tmp_path / "x" / "y")
    with pytest.raises(FileNotFoundError, match=f"cannot load CLIPTokenizer from {missing}.*: no such file or folder$"):
        load_component(CLIPTokenizer, missing, "tokenizer")
    with pytest.raises(RewardLoadError, match=f"^cannot load the test model: no such file or folder '{missing}'$"):
        load_or_explain("the test model", missing, lambda: None)
    # a relative path with two slashes is a path for both (it used to be a hub id for rewards)
    with pytest.raises(RewardLoadError, match="no such file or folder 'a/b/c'"):
        load_or_explain("the test model", "a/b/c", lambda: None)
