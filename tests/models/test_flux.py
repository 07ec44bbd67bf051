"""FluxAdapter against FluxPipeline itself, on tiny seeded FLUX.1-shaped models written with
``save_pretrained`` and loaded back through the real ``from_pretrained`` path (no downloads)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from lit_treegrpo.core import ClippedPolicyLoss, TreeSpec, recompute_log_probs, rollout
from lit_treegrpo.models import FluxAdapter, LoraSettings
from lit_treegrpo.models.tiny import TinyFluxAdapter, tiny_flux_pipeline, tiny_sd3_pipeline

PROMPTS = ["a red triangle", "two blue circles on grass"]
T = 4
COMMON = dict(num_steps=T, resolution=32, max_sequence_length=128)  # the tiny T5 tokenizer's limit
PIPE = dict(num_inference_steps=T, height=32, width=32, max_sequence_length=128)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """Tiny FLUX.1-dev and -schnell pipelines, each written by FluxPipeline.save_pretrained."""
    folders = {}
    for name in ("dev", "schnell"):
        folders[name] = tmp_path_factory.mktemp(f"tiny_flux_{name}")
        tiny_flux_pipeline(0, schnell=name == "schnell").save_pretrained(folders[name])
    return folders


def fresh_pipeline(folder: Path):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def deterministic_leaves(adapter: FluxAdapter, noise: torch.Tensor) -> torch.Tensor:
    cond = adapter.encode_prompts(PROMPTS)
    return rollout(adapter.predict, adapter.step, TreeSpec(T), cond, noise).leaf_latents  # [2, N, 4C]


# name: (saved model, adapter options, FluxPipeline call options, exact)
CASES = {
    "dev": ("dev", dict(guidance_scale=3.5), dict(guidance_scale=3.5), True),
    "dev_guidance_7": ("dev", dict(guidance_scale=7.0), dict(guidance_scale=7.0), True),
    "schnell": ("schnell", dict(), dict(guidance_scale=0.0), True),
    # FluxPipeline runs the two true-CFG forwards one after the other; the adapter batches them
    "dev_true_cfg": (
        "dev",
        dict(true_cfg_scale=4.0, negative_prompt="blurry"),
        dict(guidance_scale=3.5, true_cfg_scale=4.0, negative_prompt="blurry"),
        False,
    ),
    "dev_fixed_shift_3": ("dev", dict(shift=3.0), dict(guidance_scale=3.5), True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_deterministic_rollout_equals_flux_pipeline(case: str, saved) -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler

    model, adapter_kwargs, pipe_kwargs, exact = CASES[case]
    adapter = FluxAdapter(str(saved[model]), **COMMON, **adapter_kwargs)
    pipe = fresh_pipeline(saved[model])
    if "shift" in adapter_kwargs:  # the same fixed shift in the pipeline's scheduler
        pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(
            pipe.scheduler.config, shift=3.0, use_dynamic_shifting=False
        )
    noise = adapter.initial_noise(len(PROMPTS), torch.Generator().manual_seed(1))  # packed [2, 64, 16]
    assert noise.shape == (2, 64, 16)
    ours = deterministic_leaves(adapter, noise)
    theirs = pipe(prompt=PROMPTS, latents=noise.clone(), output_type="latent", **PIPE, **pipe_kwargs).images
    images = adapter.decode(ours)
    their_images = pipe(prompt=PROMPTS, latents=noise.clone(), output_type="pt", **PIPE, **pipe_kwargs).images
    assert images.dtype == torch.float32 and images.shape == their_images.shape == (2, 3, 32, 32)
    tolerance = 0.0 if exact else 1e-5
    torch.testing.assert_close(ours, theirs, atol=tolerance, rtol=0)
    torch.testing.assert_close(images, their_images, atol=tolerance, rtol=0)
    assert float(images.std()) > 0  # a real image, not a constant


def test_guidance_is_a_model_input_and_true_cfg_is_one_batched_forward() -> None:
    adapter = TinyFluxAdapter(num_steps=T)
    calls: list[tuple[int, torch.Tensor | None]] = []

    def record(module, args, kwargs):
        calls.append((kwargs["hidden_states"].shape[0], kwargs["guidance"]))

    adapter.denoiser.register_forward_pre_hook(record, with_kwargs=True)
    x = adapter.initial_noise(2, torch.Generator().manual_seed(0))
    assert not adapter.do_cfg  # guidance_scale 3.5 > 1, yet no CFG: one forward
    first = adapter.predict(x, 0, adapter.encode_prompts(PROMPTS))
    assert calls[-1][0] == 2 and torch.equal(calls[-1][1], torch.full((2,), 3.5))
    adapter.guidance_scale = 7.0  # an input of the distilled model: the output moves
    assert (adapter.predict(x, 0, adapter.encode_prompts(PROMPTS)) - first).abs().max() > 1e-4
    adapter.true_cfg_scale = 4.0
    adapter.predict(x, 0, adapter.encode_prompts(PROMPTS))
    assert adapter.do_cfg and calls[-1][0] == 4  # [uncond; cond] in one call
    schnell = TinyFluxAdapter(num_steps=T, schnell=True)
    schnell.denoiser.register_forward_pre_hook(record, with_kwargs=True)
    schnell.predict(x, 0, schnell.encode_prompts(PROMPTS))
    assert calls[-1] == (2, None)  # no guidance embedding: no guidance input


@pytest.mark.parametrize("dynamics", ["flow_sde", "dance_sde"])
def test_recomputed_log_probs_equal_the_sampled_ones(dynamics: str) -> None:
    adapter = TinyFluxAdapter(num_steps=T, dynamics=dynamics, noise_level=0.7 if dynamics == "flow_sde" else 0.3)
    spec = TreeSpec(T, branch_steps=(0, 1), branching=2, sde_steps=(2,))
    cond = adapter.encode_prompts(PROMPTS)
    gen = torch.Generator().manual_seed(0)
    tree = rollout(adapter.predict, adapter.step, spec, cond, adapter.initial_noise(2, gen), generator=gen)
    assert tree.num_edges == 2 * spec.num_edges()
    out = recompute_log_probs(adapter.predict, adapter.step, tree, torch.arange(tree.num_edges), cond)
    torch.testing.assert_close(out.step.log_prob, tree.edge_old_log_prob, atol=1e-5, rtol=0)
    out.step.log_prob.sum().backward()
    grads = {n: p.grad for n, p in adapter.named_parameters() if p.requires_grad}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    for blocks in ("denoiser.transformer_blocks.", "denoiser.single_transformer_blocks."):
        assert any(g.abs().sum() > 0 for n, g in grads.items() if n.startswith(blocks)), blocks


def test_bf16_rollout_and_recompute_are_finite() -> None:
    adapter = FluxAdapter(tiny_flux_pipeline(0), **COMMON, torch_dtype="bfloat16")  # casts the built pipeline
    assert adapter.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in adapter.trainable_parameters())  # LoRA masters
    cond = adapter.encode_prompts(PROMPTS)
    gen = torch.Generator().manual_seed(0)
    spec = TreeSpec(T, branch_steps=(0,), branching=2, sde_steps=(1, 2))
    tree = rollout(adapter.predict, adapter.step, spec, cond, adapter.initial_noise(2, gen), generator=gen)
    assert tree.edge_x_next.dtype == torch.bfloat16 and tree.edge_old_log_prob.dtype == torch.float32
    out = recompute_log_probs(adapter.predict, adapter.step, tree, torch.arange(tree.num_edges), cond)
    assert bool(torch.isfinite(out.step.log_prob).all() and torch.isfinite(tree.edge_old_log_prob).all())
    assert bool(torch.isfinite(adapter.decode(tree.leaf_latents)).all())


def test_lora_sits_on_the_attention_of_both_block_kinds() -> None:
    adapter = TinyFluxAdapter(num_steps=T)
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in adapter.denoiser.named_modules() if n.endswith("lora_A")}
    double = {
        f"transformer_blocks.0.attn.{m}"
        for m in ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
    }
    single = {f"single_transformer_blocks.0.attn.{m}" for m in ("to_q", "to_k", "to_v")}
    assert adapted == double | single
    assert all("lora_" in n for n, p in adapter.named_parameters() if p.requires_grad)


def train_steps(adapter: FluxAdapter, steps: int) -> None:
    """Real policy-gradient steps (tree rollout, PPO loss, Adam) on the adapter's trainable weights."""
    spec = TreeSpec(T, branch_steps=(0, 1), branching=2)
    optimizer = torch.optim.Adam(adapter.trainable_parameters(), lr=0.05)
    for step in range(steps):
        cond = adapter.encode_prompts(PROMPTS)
        gen = torch.Generator().manual_seed(step)
        tree = rollout(adapter.predict, adapter.step, spec, cond, adapter.initial_noise(2, gen), generator=gen)
        advantages = torch.linspace(-1, 1, tree.num_edges)
        out = recompute_log_probs(adapter.predict, adapter.step, tree, torch.arange(tree.num_edges), cond)
        ClippedPolicyLoss(clip_range=10.0)(out.step.log_prob, tree.edge_old_log_prob, advantages).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def test_a_lora_trained_two_steps_reproduces_in_a_fresh_flux_pipeline(saved, tmp_path: Path) -> None:
    adapter = FluxAdapter(str(saved["dev"]), **COMMON, lora=LoraSettings(rank=4, alpha=8.0))
    noise = adapter.initial_noise(2, torch.Generator().manual_seed(5))
    base = deterministic_leaves(adapter, noise)
    train_steps(adapter, 2)
    trained = deterministic_leaves(adapter, noise)
    assert (trained - base).abs().max() > 1e-3  # the two steps changed the policy
    adapter.save_lora(tmp_path)
    pipe = fresh_pipeline(saved["dev"])
    pipe.load_lora_weights(str(tmp_path))
    loaded = {n for n, _ in pipe.transformer.named_modules() if n.endswith("lora_A")}
    assert any(n.startswith("single_transformer_blocks.") for n in loaded) and len(loaded) == 11
    theirs = pipe(prompt=PROMPTS, latents=noise.clone(), output_type="latent", guidance_scale=3.5, **PIPE).images
    torch.testing.assert_close(theirs, trained, atol=1e-5, rtol=0)
    pipe.disable_lora()  # the pipeline without the LoRA is the base model again
    torch.testing.assert_close(
        pipe(prompt=PROMPTS, latents=noise.clone(), output_type="latent", guidance_scale=3.5, **PIPE).images,
        base,
        atol=1e-5,
        rtol=0,
    )
    with adapter.reference():  # and so is the adapter with its LoRA disabled
        torch.testing.assert_close(deterministic_leaves(adapter, noise), base, atol=0, rtol=0)


def test_missing_or_mismatched_folders_give_one_line_errors(saved, tmp_path: Path) -> None:
    missing = tmp_path / "no_such_model"
    with pytest.raises(FileNotFoundError, match="no such file or folder") as err:
        FluxAdapter(str(missing))
    assert str(missing) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE") as err:
        FluxAdapter("nobody/not-a-cached-flux")
    assert "nobody/not-a-cached-flux" in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="lacks this component"):
        FluxAdapter(str(tmp_path / "empty"))
    partial = tmp_path / "partial"
    shutil.copytree(saved["dev"], partial)
    shutil.rmtree(partial / "text_encoder_2")
    with pytest.raises(FileNotFoundError, match="subfolder 'text_encoder_2'.*lacks this component") as err:
        FluxAdapter(str(partial))
    assert str(partial) in str(err.value) and "\n" not in str(err.value)
    sd3 = tmp_path / "sd3"
    tiny_sd3_pipeline(0, folder=tmp_path / "sd3_tokenizers", with_t5=False).save_pretrained(sd3)
    with pytest.raises(ValueError, match="holds a SD3Transformer2DModel transformer, not FLUX.1's") as err:
        FluxAdapter(str(sd3))
    assert str(sd3) in str(err.value) and "\n" not in str(err.value)


def test_shard_shards_both_block_lists_then_the_transformer(monkeypatch) -> None:
    import torch.distributed.fsdp as fsdp

    adapter = TinyFluxAdapter(num_steps=T)
    sharded: list[torch.nn.Module] = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, mesh: sharded.append(module))
    adapter.shard(mesh=None)
    expected = [*adapter.denoiser.transformer_blocks, *adapter.denoiser.single_transformer_blocks, adapter.denoiser]
    assert [id(m) for m in sharded] == [id(m) for m in expected]


def test_fixed_shift_is_branchgrpo_schedule() -> None:
    # BranchGRPO / DanceGRPO: sigmas = sd3_time_shift(3, linspace(1, 0, T + 1))
    adapter = TinyFluxAdapter(num_steps=20, shift=3.0, lora=None)
    t = torch.linspace(1, 0, 21)
    torch.testing.assert_close(adapter.sigmas(), 3 * t / (1 + 2 * t), atol=1e-6, rtol=0)
    dynamic = TinyFluxAdapter(num_steps=20, lora=None)  # 64 tokens: mu below FLUX's base shift
    assert not torch.allclose(dynamic.sigmas(), adapter.sigmas())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(resolution=34), "resolution must be a multiple of 4"),
        (dict(true_cfg_scale=-1.0), "true_cfg_scale must be >= 0"),
        (dict(shift=0.0), "shift must be > 0 or null"),
        (dict(max_sequence_length=600), "max_sequence_length must be in 1..512"),
        (dict(dynamics="ode"), "dynamics"),
    ],
)
def test_bad_options_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TinyFluxAdapter(num_steps=T, **kwargs)
