"""A hub id that is not cached fails in seconds with the offline hint, network or not."""

from __future__ import annotations

import socket

import pytest
from huggingface_hub import constants
from transformers import CLIPTokenizer

from lit_treegrpo.common.hub import hub_reachable
from lit_treegrpo.models import base


def test_the_probe_sees_a_listening_endpoint_and_a_closed_one(monkeypatch) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub_reachable(timeout=2.0)
    # the port is closed now: refused at once
    assert not hub_reachable(timeout=2.0)


@pytest.fixture
def no_network(monkeypatch) -> dict:
    """HF_HUB_OFFLINE unset and the hub unreachable (a closed local port stands for "no network"):
    without the probe the hub client would retry for minutes. Gives the hub's address and every TCP
    connection tried meanwhile: failing in seconds is trying once (the probe), not retrying."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    tried, connect = [], socket.socket.connect

    def counted(sock, address):
        tried.append(address)
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", counted)
    return {"hub": ("127.0.0.1", port), "tried": tried}


def test_an_uncached_hub_id_without_network_fails_in_seconds_naming_it(no_network) -> None:
    with pytest.raises(
        FileNotFoundError, match=r"nobody/no-such-model \(subfolder 'tokenizer'\): not in the local hub cache"
    ):
        base.load_component(CLIPTokenizer, "nobody/no-such-model", "tokenizer")
    assert no_network["tried"] == [no_network["hub"]]  # the probe, once: no retry


def test_an_uncached_reward_checkpoint_without_network_fails_in_seconds(no_network) -> None:
    from lit_treegrpo.rewards.base import RewardLoadError, resolve_file

    with pytest.raises(
        RewardLoadError, match=r"nobody/no-such-repo is not in the local hub cache and http://127\.0\.0\.1"
    ):
        resolve_file("nobody/no-such-repo/head.pt", "the test head")
    assert no_network["tried"] == [no_network["hub"]]  # the probe, once: no retry
