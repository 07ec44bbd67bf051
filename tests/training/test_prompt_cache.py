"""The prompt-embedding cache (``--model.prompt_cache``): each distinct prompt encoded once, the
rows it returns those the encoder gave, memory bounded by an LRU, and training bitwise unchanged."""

from __future__ import annotations

import pytest
import torch

from lit_treegrpo.core import TreeSpec
from lit_treegrpo.models.tiny import TinySD3Adapter
from lit_treegrpo.rewards import Brightness
from lit_treegrpo.training import prompt_cache
from lit_treegrpo.training.module import TreeGRPOModule
from lit_treegrpo.training.prompt_cache import PromptCache, PromptCacheSettings, text_encoders
from tests.training.test_module import fit

PROMPTS = ["a red circle", "a blue square", "a green triangle"]


class Counting:
    """An adapter's encode_prompts that counts the prompts it encodes."""

    def __init__(self, adapter) -> None:
        self.adapter, self.encoded = adapter, []
        self.encode_prompts, adapter.encode_prompts = adapter.encode_prompts, self

    def __call__(self, prompts):
        self.encoded += prompts
        return self.encode_prompts(prompts)


@pytest.fixture(scope="module")
def adapter():
    return TinySD3Adapter(num_steps=2)  # with CFG: the negative prompt's rows are cached too


def test_each_distinct_prompt_is_encoded_once_and_the_rows_are_the_encoders(adapter, monkeypatch) -> None:
    monkeypatch.setattr(prompt_cache, "ENCODE_BATCH", 1)  # every call as many prompts as it asks for
    counting = Counting(adapter)
    try:
        cache = PromptCache(PromptCacheSettings(size=8))
        first = cache.encode(adapter, [PROMPTS[0], PROMPTS[1], PROMPTS[0]])
        again = cache.encode(adapter, [PROMPTS[1], PROMPTS[2], PROMPTS[0]])
        assert counting.encoded == [PROMPTS[0], PROMPTS[1], PROMPTS[2]]  # duplicates and repeats: none
        assert (cache.hits, cache.misses) == (3, 3)
        assert set(again) == {"prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds",
                              "negative_pooled_prompt_embeds"}  # fmt: skip
        for i, prompt in enumerate([PROMPTS[1], PROMPTS[2], PROMPTS[0]]):  # what encoding it alone gives
            plain = counting.encode_prompts([prompt])
            for name in plain:
                assert torch.equal(again[name][i : i + 1], plain[name]), (prompt, name)
        assert torch.equal(first["prompt_embeds"][0], first["prompt_embeds"][2])
    finally:
        adapter.encode_prompts = counting.encode_prompts


def test_the_cache_is_bounded_and_keyed_by_what_changes_an_embedding(adapter, monkeypatch) -> None:
    monkeypatch.setattr(prompt_cache, "ENCODE_BATCH", 1)
    counting = Counting(adapter)
    try:
        cache = PromptCache(PromptCacheSettings(size=2))
        cache.encode(adapter, PROMPTS[:2])
        cache.encode(adapter, PROMPTS[2:])  # the least recently used (PROMPTS[0]) goes
        assert len(cache) == 2
        assert cache.encode(adapter, PROMPTS[1:2])["prompt_embeds"].device == adapter.device
        cache.encode(adapter, PROMPTS[:1])
        assert counting.encoded == [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[0]]
        adapter.negative_prompt = "blurry"  # another negative prompt: another embedding
        try:
            cache.encode(adapter, PROMPTS[:1])
        finally:
            adapter.negative_prompt = ""
        assert counting.encoded[-1] == PROMPTS[0] and len(counting.encoded) == 5
    finally:
        adapter.encode_prompts = counting.encode_prompts


def test_pre_encoding_then_offloading_the_text_encoders(adapter) -> None:
    cache = PromptCache(PromptCacheSettings(size=3, pre_encode=True, offload_encoders=True))
    with pytest.raises(ValueError, match="raise it to at least 4"):
        cache.pre_encode(adapter, [*PROMPTS, "a fourth prompt"])
    cache.pre_encode(adapter, PROMPTS)
    try:
        assert len(text_encoders(adapter)) == 3 and all(
            next(m.parameters()).device.type == "cpu" for _, m in text_encoders(adapter)
        )
        with pytest.warns(UserWarning, match="was not pre-encoded"):
            cache.encode(adapter, ["a prompt of a callback"])
    finally:
        for _, module in text_encoders(adapter):
            module.to(adapter.device)


def test_every_encoder_call_takes_encode_batch_prompts(adapter, monkeypatch) -> None:
    # a prompt's row is the same whichever prompts it is encoded with, with the cache or without
    monkeypatch.setattr(prompt_cache, "ENCODE_BATCH", 4)
    counting = Counting(adapter)
    try:
        alone = PromptCache(PromptCacheSettings()).encode(adapter, PROMPTS[:1])
        together = PromptCache(PromptCacheSettings()).encode(adapter, [*PROMPTS, *PROMPTS[:2]])
        assert [len(counting.encoded[i : i + 4]) for i in range(0, len(counting.encoded), 4)] == [4, 4, 4]
        assert counting.encoded[:4] == [PROMPTS[0]] * 4  # padded with its last prompt
        for name in alone:
            assert together[name].shape[0] == 5 and torch.equal(together[name][:1], alone[name]), name
    finally:
        adapter.encode_prompts = counting.encode_prompts


def test_settings_are_checked() -> None:
    for kwargs, message in [
        (dict(size=-1), "prompt_cache.size must be >= 0"),
        (dict(pre_encode=True), "pre_encode needs a cache"),
        (dict(size=4, offload_encoders=True), "offload_encoders needs prompt_cache.pre_encode"),
    ]:
        with pytest.raises(ValueError, match=message):
            PromptCacheSettings(**kwargs)


def test_training_is_bitwise_unchanged_with_the_cache(tmp_path) -> None:
    def trained(**cache) -> dict[str, torch.Tensor]:
        model = TreeGRPOModule(TinySD3Adapter(num_steps=3), reward=Brightness(),
                               tree=TreeSpec(branch_steps=(0, 1), branching=2), prompt_cache=PromptCacheSettings(**cache))  # fmt: skip
        fit(model, 4, tmp_path / str(len(cache)), batch_size=3)
        return {k: v.detach().clone() for k, v in model.adapter.denoiser.named_parameters() if v.requires_grad}

    plain, cached = trained(), trained(size=512, pre_encode=True)
    assert plain.keys() == cached.keys()
    assert all(torch.equal(plain[k], cached[k]) for k in plain)


def test_pre_encoding_data_without_prompts_is_refused(adapter) -> None:
    from types import SimpleNamespace

    cache = PromptCache(PromptCacheSettings(size=4, pre_encode=True))
    with pytest.raises(ValueError, match="the datamodule has no prompts to encode"):
        cache.pre_encode_data(
            adapter, SimpleNamespace(train_set=SimpleNamespace(prompts=[]), val_set=SimpleNamespace(prompts=[]))
        )
