"""ShapesAdapter: the Shapes model behind the adapter interface (small seeded components)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_treegrpo.core import TreeSpec, rollout
from lit_treegrpo.models.lora import LoraSettings
from lit_treegrpo.models.shapes import (
    ShapesAdapter,
    ShapesModelConfig,
    build_components,
    load_components,
    save_components,
    shapes_tokenizer,
    vocabulary,
)
from lit_treegrpo.shapes import world

SMALL = ShapesModelConfig(num_layers=2, num_attention_heads=2, attention_head_dim=8, text_layers=1, text_width=16)


def small(seed: int = 0, **kwargs) -> ShapesAdapter:
    return ShapesAdapter(build_components(SMALL, seed), **kwargs)


def test_the_tokenizer_knows_every_word_of_the_grammar() -> None:
    tok = shapes_tokenizer()
    assert len(tok) == len(vocabulary()) == 26
    for prompt in world.all_prompts():
        ids = tok(prompt).input_ids
        assert tok.unk_token_id not in ids and ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert tok("a red blob").input_ids[3] == tok.unk_token_id
    assert max(len(tok(p).input_ids) for p in world.all_prompts()) <= 16  # fits max_tokens


def test_a_deterministic_rollout_is_the_schedulers_euler_sampler(tmp_path: Path) -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler

    adapter = small(guidance_scale=3.0, num_steps=6)
    prompts = ["a red circle", "a small blue square at the top"]
    noise = adapter.initial_noise(2, torch.Generator().manual_seed(0))  # [2, 3, 16, 16]
    tree = rollout(adapter.predict, adapter.step, TreeSpec(6), adapter.encode_prompts(prompts), noise)

    # the same sampler written out: CFG over [uncond; cond], diffusers' scheduler step
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(adapter.scheduler.config)
    scheduler.set_timesteps(6)
    tok, enc, net = adapter.tokenizer, adapter.text_encoder, adapter.denoiser
    ids = tok(["", ""] + prompts, padding="max_length", max_length=16, return_tensors="pt").input_ids
    out = enc(ids)
    x = noise
    with torch.no_grad():
        for t in scheduler.timesteps:
            v = net(
                hidden_states=torch.cat([x, x]),
                timestep=t.expand(4),
                encoder_hidden_states=out.last_hidden_state,
                pooled_projections=out.text_embeds,
                return_dict=False,
            )[0]
            uncond, text = v.chunk(2)
            x = scheduler.step(uncond + 3.0 * (text - uncond), t, x, return_dict=False)[0]
    torch.testing.assert_close(tree.leaf_latents, x, atol=1e-5, rtol=0)
    images = adapter.decode(tree.leaf_latents)
    assert images.shape == (2, 3, 16, 16) and images.min() >= 0 and images.max() <= 1


def test_lora_by_default_and_full_fine_tuning_on_request(tmp_path: Path) -> None:
    full = small(lora=None)
    assert {id(p) for p in full.trainable_parameters()} == {id(p) for p in full.denoiser.parameters()}
    assert not any(p.requires_grad for p in full.text_encoder.parameters())
    assert small().lora == LoraSettings(rank=16, alpha=16.0)
    lora = small(lora=LoraSettings(rank=4, alpha=8.0))
    names = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)

    # exported LoRA, read back into a fresh transformer, reproduces the adapter
    with torch.no_grad():
        for p in lora.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    folder = lora.save_lora(tmp_path / "lora")
    fresh = build_components(SMALL, 0)["transformer"]
    fresh.load_lora_adapter(str(folder), prefix=None, weight_name="pytorch_lora_weights.safetensors")
    x, t = torch.randn(2, 3, 16, 16), torch.tensor([500.0, 250.0])
    cond = lora.encode_prompts(["a red circle", "a green square"])
    kwargs = dict(
        encoder_hidden_states=cond["prompt_embeds"], pooled_projections=cond["pooled_prompt_embeds"], return_dict=False
    )
    with torch.no_grad():
        torch.testing.assert_close(
            fresh(hidden_states=x, timestep=t, **kwargs)[0],
            lora.denoiser(hidden_states=x, timestep=t, **kwargs)[0],
            atol=1e-5,
            rtol=0,
        )
    with pytest.raises(ValueError, match="save_lora needs LoRA training"):
        full.save_lora(tmp_path / "nope")


@pytest.mark.parametrize("lora", [None, LoraSettings(rank=4, alpha=8.0)], ids=["full", "lora"])
def test_save_pretrained_round_trips_through_from_pretrained(tmp_path: Path, lora) -> None:
    adapter = small(seed=3, lora=lora)
    before = adapter.predict(torch.ones(1, 3, 16, 16), 4, adapter.encode_prompts(["a red circle"]))
    with torch.no_grad():
        for p in adapter.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert not torch.equal(
        adapter.predict(torch.ones(1, 3, 16, 16), 4, adapter.encode_prompts(["a red circle"])), before
    )
    folder = adapter.save_pretrained(tmp_path / "tuned", note="test")
    again = ShapesAdapter(folder, lora=None)  # the LoRA is merged into the saved weights
    x, cond = torch.randn(3, 3, 16, 16), adapter.encode_prompts(["a red circle"] * 3)
    atol = 0.0 if lora is None else 1e-5  # a merged LoRA rounds differently from the adapter's two matmuls
    torch.testing.assert_close(again.predict(x, 4, cond), adapter.predict(x, 4, cond), atol=atol, rtol=0)
    assert (folder / "shapes_world.json").read_text().count('"note": "test"') == 1


def test_missing_folders_and_unknown_words_are_reported(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no Shapes model folder at .*regenerate it with python -m"):
        ShapesAdapter(tmp_path / "nothing")
    save_components(tmp_path / "m", build_components(SMALL), {})
    (tmp_path / "m" / "text_encoder" / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="text_encoder/config.json is missing"):
        load_components(tmp_path / "m")
    adapter = small()
    # the check splits words as the tokenizer does: the comma is its own (unknown) token, "red" is known
    with pytest.warns(UserWarning, match=r"outside the Shapes-world vocabulary .*\[',', 'blob', 'purple'\]"):
        adapter.encode_prompts(["a purple blob, red"])
