"""WanAdapter on Wan2.2: TI2V-5B's shape (one transformer, 48-channel VAE, a timestep per token) and
T2V-A14B's (two experts switching at the boundary timestep), against diffusers' WanPipeline on tiny
seeded models saved with save_pretrained (no downloads)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from lit_treegrpo.core import ClippedPolicyLoss, TreeSpec, recompute_log_probs, rollout, tree_advantages
from lit_treegrpo.models import LoraSettings
from lit_treegrpo.models.tiny_wan import TinyWan22Adapter, tiny_wan22_pipeline
from lit_treegrpo.models.wan import LORA_FILES, WanAdapter
from tests.models.helpers import brightness_steps

PROMPTS = ["a red fox running in snow", "two cats on grass"]
T = 4  # the tiny scheduler's shift 5: timesteps 1000, 910, 717, 24; A14B's boundary 875 -> experts 0, 0, 1, 1
SIDE = {"ti2v": 64, "a14b": 32}
LATENT = {"ti2v": (48, 3, 4, 4), "a14b": (16, 3, 4, 4)}  # [C, F', h, w]


def options(kind: str) -> dict:
    extra = dict(guidance_scale_2=3.0) if kind == "a14b" else {}
    side = SIDE[kind]
    return dict(num_steps=T, guidance_scale=5.0, negative_prompt="blurry, static", height=side, width=side,
                num_frames=9, max_sequence_length=32, **extra)  # fmt: skip


def tiny_options(kind: str) -> dict:
    return {k: v for k, v in options(kind).items() if k not in ("height", "width", "num_frames", "max_sequence_length")}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    folders = {}
    for kind in ("ti2v", "a14b"):
        folders[kind] = tmp_path_factory.mktemp(f"tiny_wan22_{kind}")
        tiny_wan22_pipeline(0, kind).save_pretrained(folders[kind])
    return folders


def pipeline_output(pipe, noise: torch.Tensor, kind: str, output_type: str) -> torch.Tensor:
    pipe.set_progress_bar_config(disable=True)
    kw = {k: v for k, v in options(kind).items() if k != "num_steps"}
    return pipe(prompt=PROMPTS, latents=noise.clone(), num_inference_steps=T, output_type=output_type, **kw).frames


def leaves(adapter: WanAdapter, noise: torch.Tensor) -> torch.Tensor:
    return rollout(adapter.predict, adapter.step, TreeSpec(T), adapter.encode_prompts(PROMPTS), noise).leaf_latents


@pytest.mark.parametrize("kind", ["ti2v", "a14b"])
def test_deterministic_rollout_decoded_equals_wan22_pipeline(saved: dict[str, Path], kind: str) -> None:
    from diffusers import WanPipeline

    adapter = WanAdapter(str(saved[kind]), **options(kind))
    assert adapter.expand_timesteps == (kind == "ti2v") and (adapter.denoiser_2 is not None) == (kind == "a14b")
    pipe = WanPipeline.from_pretrained(saved[kind])
    noise = adapter.initial_noise(2, torch.Generator().manual_seed(1))
    assert noise.shape == (2, *LATENT[kind])
    ours = leaves(adapter, noise)
    # one batched [uncond; cond] forward against the pipeline's two: float rounding (measured <= 1.7e-6)
    theirs = pipeline_output(pipe, noise, kind, "latent")
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    # decoded from the pipeline's latents: the tiny random A14B VAE is ill-conditioned (measured: latents
    # 1.2e-6 apart decode 0.29 apart), so the decoder is compared on the same input
    videos = adapter.decode(theirs)
    side = SIDE[kind]
    assert videos.shape == (2, 9, 3, side, side) and float(videos.std()) > 0.01
    torch.testing.assert_close(videos, pipeline_output(pipe, noise, kind, "pt"), atol=1e-5, rtol=0)


def test_each_step_goes_to_the_expert_the_pipeline_picks_with_its_guidance() -> None:
    adapter = TinyWan22Adapter(kind="a14b", **tiny_options("a14b"))
    t = adapter.timesteps(torch.arange(T)).tolist()
    assert adapter.step_expert == [int(v < 875.0) for v in t] == [0, 0, 1, 1]
    calls: list[tuple[str, int]] = []
    for name, model in adapter.denoisers().items():
        model.register_forward_pre_hook(lambda m, a, kw, n=name: calls.append((n, kw["hidden_states"].shape[0])),
                                        with_kwargs=True)  # fmt: skip
    cond = adapter.encode_prompts(PROMPTS)
    x = adapter.initial_noise(2, torch.Generator().manual_seed(0))
    for step in range(T):
        adapter.predict(x, step, cond)
    assert calls == [("transformer", 4), ("transformer", 4), ("transformer_2", 4), ("transformer_2", 4)]
    # a micro-batch straddling the boundary: each row by its own expert, in the batch's order
    calls.clear()
    mixed = adapter.predict(x, torch.tensor([3, 0]), cond)
    assert sorted(calls) == [("transformer", 2), ("transformer_2", 2)]
    torch.testing.assert_close(mixed[0], adapter.predict(x[:1], 3, {k: v[:1] for k, v in cond.items()})[0])
    torch.testing.assert_close(mixed[1], adapter.predict(x[1:], 0, {k: v[1:] for k, v in cond.items()})[0])
    # guidance_scale_2 is the low-noise expert's weight only
    high, low = adapter.predict(x, 0, cond), adapter.predict(x, 3, cond)
    adapter.guidance_scale_2 = 5.0
    assert (adapter.predict(x, 3, cond) - low).abs().max() > 1e-4
    torch.testing.assert_close(adapter.predict(x, 0, cond), high, atol=0, rtol=0)


@pytest.mark.parametrize(("train", "trained"), [("both", {"transformer", "transformer_2"}), ("high_noise", {"transformer"}),
                                               ("low_noise", {"transformer_2"})])  # fmt: skip
def test_a_tree_across_the_boundary_trains_the_chosen_experts(train: str, trained: set[str]) -> None:
    adapter = TinyWan22Adapter(kind="a14b", train_experts=train, **tiny_options("a14b"))
    assert set(adapter.trained_denoisers()) == trained
    names = [n for n, p in adapter.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert {("denoiser_2." if n.startswith("denoiser_2.") else "denoiser.") for n in names} == {
        {"transformer": "denoiser.", "transformer_2": "denoiser_2."}[e] for e in trained
    }
    spec = TreeSpec(T, branch_steps=(1, 2), branching=2)  # branches on both sides of the boundary
    cond = adapter.encode_prompts(PROMPTS)
    gen = torch.Generator().manual_seed(0)
    tree = rollout(adapter.predict, adapter.step, spec, cond, adapter.initial_noise(2, gen), generator=gen)
    rewards = adapter.decode(tree.leaf_latents).mean(dim=(1, 2, 3, 4))  # [L]
    advantages = tree_advantages(rewards, tree.edge_parent, tree.leaf_edge, tree.leaf_prompt, method="mean")
    out = recompute_log_probs(adapter.predict, adapter.step, tree, torch.arange(tree.num_edges), cond)  # mixed experts
    torch.testing.assert_close(out.step.log_prob, tree.edge_old_log_prob, atol=1e-5, rtol=0)
    ClippedPolicyLoss(clip_range=10.0)(out.step.log_prob, tree.edge_old_log_prob, advantages).loss.backward()
    grads = {n: p.grad for n, p in adapter.named_parameters() if p.requires_grad}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    for prefix in {"transformer": "denoiser.", "transformer_2": "denoiser_2."}.values():
        got = [g for n, g in grads.items() if n.startswith(prefix) and "lora_B" in n]
        assert not got or any(g.abs().sum() > 0 for g in got), (
            prefix
        )  # a trained expert gets a gradient (B: A waits for B to leave zero)


def train_steps(adapter, steps: int, lr: float) -> None:
    brightness_steps(adapter, PROMPTS, TreeSpec(T, branch_steps=(1, 2), branching=2), steps, lr)


@pytest.mark.parametrize(("kind", "train"), [("ti2v", "both"), ("a14b", "both"), ("a14b", "low_noise")])
def test_lora_trained_two_steps_reproduces_in_a_fresh_wan22_pipeline(kind: str, train: str, tmp_path: Path) -> None:
    extra = dict(train_experts=train) if kind == "a14b" else {}
    adapter = TinyWan22Adapter(kind=kind, lora=LoraSettings(rank=4, alpha=8.0), **extra, **tiny_options(kind))
    train_steps(adapter, steps=2, lr=200.0)  # B starts at zero; a large step makes the change visible
    noise = adapter.initial_noise(2, torch.Generator().manual_seed(5))
    trained = leaves(adapter, noise)
    adapter.save_lora(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(LORA_FILES[n] for n in adapter.trained_denoisers())

    fresh = tiny_wan22_pipeline(0, kind)
    base = pipeline_output(fresh, noise, kind, "latent")
    code = adapter.lora_load_code()
    exec(code, {"pipe": fresh, "DIR": str(tmp_path)})  # the card's own lines load it
    assert ("load_into_transformer_2=True" in code) == (train in ("both", "low_noise") and kind == "a14b")
    torch.testing.assert_close(pipeline_output(fresh, noise, kind, "latent"), trained, atol=1e-5, rtol=0)
    assert (trained - base).abs().max() > 1e-3, "the trained LoRA does not change the output"
    with adapter.reference():  # every expert's LoRA off: the base model
        torch.testing.assert_close(leaves(adapter, noise), base, atol=1e-5, rtol=0)


def test_a_merged_export_writes_every_trained_expert(tmp_path: Path) -> None:
    from lit_treegrpo.artifacts.export import how_to_load, write_weights

    adapter = TinyWan22Adapter(kind="a14b", **tiny_options("a14b"))
    train_steps(adapter, steps=1, lr=200.0)
    noise = adapter.initial_noise(2, torch.Generator().manual_seed(5))
    trained = leaves(adapter, noise)
    assert write_weights(adapter, tmp_path, merged=True) == ["transformer", "transformer_2"]
    code = how_to_load(adapter, lora=False, base="tiny")
    scope: dict = {"DIR": str(tmp_path)}
    exec(code, scope)
    torch.testing.assert_close(pipeline_output(scope["pipe"], noise, "a14b", "latent"), trained, atol=1e-5, rtol=0)


def test_wrong_folders_and_options_fail_in_one_line(saved: dict[str, Path], tmp_path: Path) -> None:
    from lit_treegrpo.models.tiny_wan import TinyWanAdapter

    one_expert = tmp_path / "no_high_noise"  # a model index whose first expert is missing
    shutil.copytree(saved["a14b"], one_expert)
    index = json.loads((one_expert / "model_index.json").read_text())
    (one_expert / "model_index.json").write_text(json.dumps({**index, "transformer": [None, None]}))
    with pytest.raises(ValueError, match="has no high-noise transformer") as err:
        WanAdapter(str(one_expert), **options("a14b"))
    assert str(one_expert) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="apply to two-expert Wan2.2 models"):
        TinyWan22Adapter(kind="ti2v", train_experts="low_noise")
    with pytest.raises(ValueError, match="apply to two-expert Wan2.2 models"):
        TinyWanAdapter(guidance_scale_2=3.0)
    with pytest.raises(ValueError, match="guidance_scale_2 must be >= 0"):
        TinyWan22Adapter(kind="a14b", guidance_scale_2=-1.0)
    with pytest.raises(ValueError, match="train_experts"):
        TinyWan22Adapter(kind="a14b", train_experts="middle")
    with pytest.raises(ValueError, match="height must be a positive multiple of 32"):
        TinyWan22Adapter(kind="ti2v", height=48)  # the 5B VAE compresses 16x, then the 2 x 2 patch


def test_shard_wraps_both_experts(tmp_path: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    adapter = TinyWan22Adapter(kind="a14b", num_steps=T, guidance_scale=5.0)
    noise = adapter.initial_noise(1, torch.Generator().manual_seed(0))
    cond = adapter.encode_prompts(PROMPTS[:1])
    before = rollout(adapter.predict, adapter.step, TreeSpec(T), cond, noise).leaf_latents
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        adapter.shard(init_device_mesh("cpu", (1,)))
        for model in (adapter.denoiser, adapter.denoiser_2):
            assert isinstance(model, FSDPModule) and all(isinstance(b, FSDPModule) for b in model.blocks)
        after = rollout(adapter.predict, adapter.step, TreeSpec(T), cond, noise).leaf_latents
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(after, before, atol=0, rtol=0)
