"""QwenImageAdapter against diffusers' QwenImagePipeline on a tiny seeded Qwen-Image model (no
downloads), and the engine (rollout, advantages, loss) on a tree of packed Qwen-Image latents."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_treegrpo.core import TreeSpec, recompute_log_probs, rollout
from lit_treegrpo.models import LoraSettings
from lit_treegrpo.models.qwen_image import QwenImageAdapter
from lit_treegrpo.models.tiny_qwen import TinyQwenImageAdapter, tiny_qwen_image_pipeline, tiny_qwen_tokenizer
from tests.models.helpers import assert_bfloat16_tree_is_finite, assert_recomputes_and_trains, brightness_steps, grow

PROMPTS = ["a red circle", "two blue squares on green grass"]  # different lengths: masks matter
T = 4
SIZE = dict(height=32, width=32, max_sequence_length=64)
OPTIONS = dict(num_steps=T, true_cfg_scale=4.0, negative_prompt="blurry", **SIZE)
PACKED = (4, 64)  # [(h/2)(w/2), 4C]: 32 px -> 4 x 4 latents of 16 channels -> 2 x 2 tokens of 64


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A tiny Qwen-Image pipeline written by QwenImagePipeline.save_pretrained."""
    folder = tmp_path_factory.mktemp("tiny_qwen_image")
    tiny_qwen_image_pipeline(0).save_pretrained(folder)
    return folder


def pipeline_output(pipe, noise: torch.Tensor, output_type: str, cfg: float = 4.0) -> torch.Tensor:
    pipe.set_progress_bar_config(disable=True)
    return pipe(
        prompt=PROMPTS,
        negative_prompt=OPTIONS["negative_prompt"],
        true_cfg_scale=cfg,
        latents=noise.clone(),
        num_inference_steps=T,
        output_type=output_type,
        **SIZE,
    ).images


def deterministic_leaves(adapter: QwenImageAdapter, noise: torch.Tensor) -> torch.Tensor:
    return rollout(adapter.predict, adapter.step, TreeSpec(T), adapter.encode_prompts(PROMPTS), noise).leaf_latents


def test_the_tiny_tokenizer_drops_exactly_the_templates_system_prompt() -> None:
    # the pipeline drops its template's first 34 tokens, as many as Qwen's tokenizer makes of them
    pipe = tiny_qwen_image_pipeline(0)
    prefix = pipe.prompt_template_encode.split("{}")[0]
    tokens = tiny_qwen_tokenizer().tokenize(prefix)
    assert len(tokens) == pipe.prompt_template_encode_start_idx == 34
    assert tokens[-3:] == ["<|im_start|>", "user", "\n"]


@pytest.mark.parametrize("cfg", [4.0, 1.0], ids=["true_cfg", "no_cfg"])
def test_deterministic_rollout_decoded_equals_qwen_image_pipeline(saved: Path, cfg: float) -> None:
    from diffusers import QwenImagePipeline

    adapter = QwenImageAdapter(str(saved), **{**OPTIONS, "true_cfg_scale": cfg})
    pipe = QwenImagePipeline.from_pretrained(saved)
    noise = adapter.initial_noise(len(PROMPTS), torch.Generator().manual_seed(1))
    assert noise.shape == (2, *PACKED)
    ours = deterministic_leaves(adapter, noise)
    # the adapter pads both prompts and the negative to one length and batches [uncond; cond] in one
    # forward; the pipeline runs two forwards of each batch's own length: equal up to float rounding
    # of the batch (measured 1.2e-6)
    torch.testing.assert_close(ours, pipeline_output(pipe, noise, "latent", cfg), atol=1e-5, rtol=0)
    images = adapter.decode(ours)
    assert images.shape == (2, 3, 32, 32) and images.dtype == torch.float32
    assert float(images.std()) > 0.01  # not a constant image
    torch.testing.assert_close(images, pipeline_output(pipe, noise, "pt", cfg), atol=1e-5, rtol=0)


def test_prompts_of_different_lengths_are_masked_and_padding_changes_nothing() -> None:
    adapter = TinyQwenImageAdapter(**{k: v for k, v in OPTIONS.items() if k not in SIZE})
    cond = adapter.encode_prompts(PROMPTS)
    lengths = cond["prompt_embeds_mask"].sum(1).tolist()
    assert lengths[0] < lengths[1] and cond["prompt_embeds"].shape[1] == max(lengths)
    assert float(cond["prompt_embeds"][0, lengths[0] :].abs().max()) == 0.0  # zeros after the tokens
    # the short prompt encoded alone is shorter; joined with the long one it is padded, and its
    # prediction is the same up to float rounding (the padding is masked out of the attention)
    alone = adapter.encode_prompts(PROMPTS[:1])
    assert alone["prompt_embeds"].shape[1] < cond["prompt_embeds"].shape[1]
    joined = adapter.join_conds([alone, adapter.encode_prompts(PROMPTS[1:])])
    assert {k: v.shape for k, v in joined.items()} == {k: v.shape for k, v in cond.items()}
    x = adapter.initial_noise(1, torch.Generator().manual_seed(0))
    padded = {k: v[:1] for k, v in joined.items()}
    torch.testing.assert_close(adapter.predict(x, 1, alone), adapter.predict(x, 1, padded), atol=1e-5, rtol=0)
    unmasked = {**padded, **{k: torch.ones_like(v) for k, v in padded.items() if k.endswith("_mask")}}
    assert (adapter.predict(x, 1, unmasked) - adapter.predict(x, 1, alone)).abs().max() > 1e-3  # the mask is used


def test_engine_on_a_tree_recomputes_every_sde_edge_and_trains() -> None:
    adapter = TinyQwenImageAdapter(**{k: v for k, v in OPTIONS.items() if k not in SIZE})
    spec = TreeSpec(T, branch_steps=(0, 1), branching=2, sde_steps=(2,))
    cond, tree = grow(adapter, PROMPTS, spec)
    assert tree.num_edges == 2 * spec.num_edges() and tree.leaf_latents.shape == (8, *PACKED)
    rewards = adapter.decode(tree.leaf_latents).mean(dim=(1, 2, 3))  # [L] brightness
    assert_recomputes_and_trains(adapter, tree, cond, rewards)


def train_steps(adapter, steps: int, lr: float) -> None:
    brightness_steps(adapter, PROMPTS, TreeSpec(T, branch_steps=(0, 1), branching=2), steps, lr)


def test_lora_trained_two_steps_reproduces_in_a_fresh_qwen_image_pipeline(tmp_path: Path) -> None:
    adapter = TinyQwenImageAdapter(
        lora=LoraSettings(rank=4, alpha=8.0), **{k: v for k, v in OPTIONS.items() if k not in SIZE}
    )
    before = {k: v.clone() for k, v in adapter.state_dict().items()}
    train_steps(adapter, steps=2, lr=200.0)  # B starts at zero; a large step makes the change visible
    changed = {k for k, v in adapter.state_dict().items() if not torch.equal(before[k], v)}
    assert changed and all("lora_" in k for k in changed) and any("lora_B" in k for k in changed)
    assert any("add_q_proj" in k for k in changed) and any("to_q" in k for k in changed)  # image and text streams
    noise = adapter.initial_noise(2, torch.Generator().manual_seed(5))
    trained = deterministic_leaves(adapter, noise)
    adapter.save_lora(tmp_path)
    assert (tmp_path / "pytorch_lora_weights.safetensors").is_file()

    fresh = tiny_qwen_image_pipeline(0)
    base = pipeline_output(fresh, noise, "latent")
    fresh.load_lora_weights(str(tmp_path))
    torch.testing.assert_close(pipeline_output(fresh, noise, "latent"), trained, atol=1e-5, rtol=0)
    assert (trained - base).abs().max() > 1e-3, "the trained LoRA does not change the output"
    fresh.disable_lora()
    torch.testing.assert_close(pipeline_output(fresh, noise, "latent"), base, atol=0, rtol=0)
    with adapter.reference():  # the adapter with LoRA disabled is the base model too
        torch.testing.assert_close(deterministic_leaves(adapter, noise), base, atol=1e-5, rtol=0)


def test_any_saved_folder_loads_and_wrong_folders_fail_in_one_line(saved: Path, tmp_path: Path) -> None:
    from lit_treegrpo.models.tiny import tiny_sd3_pipeline

    loaded = QwenImageAdapter(str(saved), **OPTIONS)
    assert len(loaded.pipeline.tokenizer) == len(tiny_qwen_tokenizer())
    missing = tmp_path / "no_such_model"
    with pytest.raises(FileNotFoundError, match="no such file or folder") as err:
        QwenImageAdapter(str(missing), **OPTIONS)
    assert str(missing) in str(err.value) and "\n" not in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="lacks this component"):
        QwenImageAdapter(str(tmp_path / "empty"), **OPTIONS)
    sd3 = tmp_path / "sd3"
    tiny_sd3_pipeline(0, with_t5=False).save_pretrained(sd3)
    with pytest.raises(ValueError, match="holds a StableDiffusion3Pipeline, not a QwenImagePipeline") as err:
        QwenImageAdapter(str(sd3), **OPTIONS)
    assert str(sd3) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE"):
        QwenImageAdapter("nobody/not-a-cached-qwen-image")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(true_cfg_scale=-1.0), "true_cfg_scale must be >= 0"),
        (dict(height=40), "height must be a positive multiple of 16"),
        (dict(width=0), "width must be a positive multiple of 16"),
        (dict(max_sequence_length=0), "max_sequence_length must be in 1..1024"),
        (dict(max_sequence_length=2000), "max_sequence_length must be in 1..1024"),
        (dict(dynamics="ode"), "dynamics"),
        (dict(dynamics="cps", noise_level=1.2), r"noise_level must be in \(0, 1\] with dynamics cps"),
        (dict(lora=LoraSettings(target_modules=("to_q", "nothing_here"))), "match no module"),
    ],
)
def test_bad_options_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TinyQwenImageAdapter(**kwargs)


def test_true_cfg_is_one_batched_forward_rescaled_to_the_conditional_norm() -> None:
    adapter = TinyQwenImageAdapter(**{k: v for k, v in OPTIONS.items() if k not in SIZE})
    sizes: list[int] = []
    adapter.denoiser.register_forward_pre_hook(
        lambda m, a, kw: sizes.append(kw["hidden_states"].shape[0]), with_kwargs=True
    )
    cond = adapter.encode_prompts(PROMPTS)
    x = adapter.initial_noise(2, torch.Generator().manual_seed(0))
    guided = adapter.predict(x, 0, cond)
    assert sizes == [4]
    conditional = adapter._denoise(x, adapter.timesteps(torch.zeros(2, dtype=torch.long)), cond, negative=False)
    torch.testing.assert_close(guided.norm(dim=-1), conditional.norm(dim=-1), atol=1e-5, rtol=1e-5)
    assert (guided - conditional).abs().max() > 1e-3  # the negative prompt changes the direction
    adapter.guidance_scale = 1.0  # no CFG: one forward of the prompts, no negative rows
    assert set(adapter.encode_prompts(PROMPTS)) == {"prompt_embeds", "prompt_embeds_mask"}


def test_prompt_cache_joins_rows_of_different_lengths(monkeypatch) -> None:
    from lit_treegrpo.training import prompt_cache
    from lit_treegrpo.training.prompt_cache import PromptCache, PromptCacheSettings

    monkeypatch.setattr(prompt_cache, "ENCODE_BATCH", 1)  # each prompt encoded alone
    adapter = TinyQwenImageAdapter(**{k: v for k, v in OPTIONS.items() if k not in SIZE})
    cache = PromptCache(PromptCacheSettings(size=4))
    cache.encode(adapter, PROMPTS[:1])
    cond = cache.encode(adapter, PROMPTS)  # one cached (short) row, one fresh (long) row
    direct = adapter.encode_prompts(PROMPTS)
    assert cache.hits == 1 and {k: v.shape for k, v in cond.items()} == {k: v.shape for k, v in direct.items()}
    for name in cond:
        torch.testing.assert_close(cond[name], direct[name], atol=1e-6, rtol=0)


def test_shard_wraps_every_transformer_block_and_keeps_the_output(tmp_path: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    adapter = TinyQwenImageAdapter(num_steps=2)
    noise = adapter.initial_noise(1, torch.Generator().manual_seed(0))
    cond = adapter.encode_prompts(PROMPTS[:1])
    before = rollout(adapter.predict, adapter.step, TreeSpec(2), cond, noise).leaf_latents
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        adapter.shard(init_device_mesh("cpu", (1,)))
        assert [isinstance(b, FSDPModule) for b in adapter.denoiser.transformer_blocks] == [True, True]
        assert isinstance(adapter.denoiser, FSDPModule)
        after = rollout(adapter.predict, adapter.step, TreeSpec(2), cond, noise).leaf_latents
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(after, before, atol=0, rtol=0)


def test_bf16_rollout_and_recompute_are_finite_with_float32_lora_masters() -> None:
    adapter = QwenImageAdapter(tiny_qwen_image_pipeline(0), **OPTIONS, torch_dtype="bfloat16")
    assert adapter.dtype == torch.bfloat16 and adapter.vae.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in adapter.trainable_parameters())
    assert_bfloat16_tree_is_finite(adapter, PROMPTS, T)


VERL_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
                "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2")  # fmt: skip


@pytest.mark.parametrize("targets", [None, VERL_TARGETS], ids=["attention", "verl_recipe"])
def test_every_lora_weight_gets_a_gradient(targets: tuple[str, ...] | None) -> None:
    # the last block's text output feeds nothing: no LoRA there (DDP refuses parameters without grads)
    adapter = TinyQwenImageAdapter(num_steps=2, lora=LoraSettings(rank=2, alpha=4.0, target_modules=targets))
    names = [n for n, p in adapter.named_parameters() if p.requires_grad]
    assert not any("transformer_blocks.1.attn.to_add_out" in n or "transformer_blocks.1.txt_mlp" in n for n in names)
    assert any("transformer_blocks.0.attn.to_add_out" in n for n in names)
    cond = adapter.encode_prompts(PROMPTS[:1])
    gen = torch.Generator().manual_seed(0)
    tree = rollout(adapter.predict, adapter.step, TreeSpec(2, branch_steps=(0,), branching=2), cond,
                   adapter.initial_noise(1, gen), generator=gen)  # fmt: skip
    recompute_log_probs(
        adapter.predict, adapter.step, tree, torch.arange(tree.num_edges), cond
    ).step.log_prob.sum().backward()
    assert [n for n, p in adapter.named_parameters() if p.requires_grad and p.grad is None] == []
