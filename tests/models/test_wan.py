"""WanAdapter against diffusers' WanPipeline on a tiny seeded Wan2.1 model (no downloads), and the
engine (rollout, advantages, loss) on a tree of video latents."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from lit_treegrpo.core import TreeSpec, rollout
from lit_treegrpo.models import LoraSettings
from lit_treegrpo.models.tiny_wan import TinyWanAdapter, tiny_wan_pipeline
from lit_treegrpo.models.wan import WanAdapter
from tests.models.helpers import assert_bfloat16_tree_is_finite, assert_recomputes_and_trains, brightness_steps, grow

PROMPTS = ["a red fox running in snow", "two cats on grass"]
T = 4
SIZE = dict(height=32, width=32, num_frames=9, max_sequence_length=32)
OPTIONS = dict(num_steps=T, guidance_scale=5.0, negative_prompt="blurry, static", **SIZE)
LATENT = (16, 3, 4, 4)  # [C, F', h, w]: 9 frames -> 3 latent frames, 32 px -> 4


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A tiny Wan2.1 pipeline written by WanPipeline.save_pretrained."""
    folder = tmp_path_factory.mktemp("tiny_wan")
    tiny_wan_pipeline(0).save_pretrained(folder)
    return folder


def pipeline_output(pipe, noise: torch.Tensor, output_type: str) -> torch.Tensor:
    pipe.set_progress_bar_config(disable=True)
    return pipe(
        prompt=PROMPTS,
        negative_prompt=OPTIONS["negative_prompt"],
        latents=noise.clone(),
        num_inference_steps=T,
        guidance_scale=OPTIONS["guidance_scale"],
        output_type=output_type,
        **SIZE,
    ).frames


def deterministic_leaves(adapter: WanAdapter, noise: torch.Tensor) -> torch.Tensor:
    return rollout(adapter.predict, adapter.step, TreeSpec(T), adapter.encode_prompts(PROMPTS), noise).leaf_latents


def test_deterministic_rollout_decoded_equals_wan_pipeline(saved: Path) -> None:
    from diffusers import WanPipeline

    adapter = WanAdapter(str(saved), **OPTIONS)
    pipe = WanPipeline.from_pretrained(saved)
    noise = adapter.initial_noise(len(PROMPTS), torch.Generator().manual_seed(1))
    assert noise.shape == (2, *LATENT)
    ours = deterministic_leaves(adapter, noise)
    # the adapter batches [uncond; cond] in one forward, the pipeline runs two: equal up to float
    # rounding of the batch (measured 2e-6)
    torch.testing.assert_close(ours, pipeline_output(pipe, noise, "latent"), atol=1e-5, rtol=0)
    videos = adapter.decode(ours)
    assert videos.shape == (2, 9, 3, 32, 32) and videos.dtype == torch.float32
    assert float(videos.std()) > 0.01  # not a constant video
    torch.testing.assert_close(videos, pipeline_output(pipe, noise, "pt"), atol=1e-5, rtol=0)


def test_engine_on_a_video_tree_recomputes_every_sde_edge_and_trains() -> None:
    adapter = TinyWanAdapter(**{k: v for k, v in OPTIONS.items() if k not in SIZE})
    spec = TreeSpec(T, branch_steps=(0, 1), branching=2, sde_steps=(2,))
    cond, tree = grow(adapter, PROMPTS, spec)
    assert tree.num_edges == 2 * spec.num_edges() and tree.num_leaves == 2 * 4
    assert tree.edge_x_next.shape == (tree.num_edges, *LATENT) and tree.leaf_latents.shape == (8, *LATENT)
    # a reward on the decoded videos [L, F, 3, H, W]: mean brightness of the frames
    videos = adapter.decode(tree.leaf_latents)
    assert videos.shape == (8, 9, 3, 32, 32)
    assert_recomputes_and_trains(adapter, tree, cond, videos.mean(dim=(1, 2, 3, 4)))  # [L] brightness


def train_steps(adapter, steps: int, lr: float) -> None:
    brightness_steps(adapter, PROMPTS, TreeSpec(T, branch_steps=(0, 1), branching=2), steps, lr)


def test_lora_trained_two_steps_reproduces_in_a_fresh_wan_pipeline(tmp_path: Path) -> None:
    adapter = TinyWanAdapter(
        lora=LoraSettings(rank=4, alpha=8.0), **{k: v for k, v in OPTIONS.items() if k not in SIZE}
    )
    before = {k: v.clone() for k, v in adapter.state_dict().items()}
    train_steps(adapter, steps=2, lr=200.0)  # B starts at zero; a large step makes the change visible
    changed = {k for k, v in adapter.state_dict().items() if not torch.equal(before[k], v)}
    assert changed and all("lora_" in k for k in changed) and any("lora_B" in k for k in changed)
    noise = adapter.initial_noise(2, torch.Generator().manual_seed(5))
    trained = deterministic_leaves(adapter, noise)
    adapter.save_lora(tmp_path)
    assert (tmp_path / "pytorch_lora_weights.safetensors").is_file()

    fresh = tiny_wan_pipeline(0)
    base = pipeline_output(fresh, noise, "latent")
    fresh.load_lora_weights(str(tmp_path))
    torch.testing.assert_close(pipeline_output(fresh, noise, "latent"), trained, atol=1e-5, rtol=0)
    assert (trained - base).abs().max() > 1e-3, "the trained LoRA does not change the output"
    fresh.disable_lora()
    torch.testing.assert_close(pipeline_output(fresh, noise, "latent"), base, atol=0, rtol=0)
    with adapter.reference():  # the adapter with LoRA disabled is the base model too
        torch.testing.assert_close(deterministic_leaves(adapter, noise), base, atol=1e-5, rtol=0)


def test_guidance_is_one_batched_forward_with_the_negative_prompt() -> None:
    adapter = TinyWanAdapter(**{k: v for k, v in OPTIONS.items() if k not in SIZE})
    sizes: list[int] = []
    adapter.denoiser.register_forward_pre_hook(
        lambda m, a, kw: sizes.append(kw["hidden_states"].shape[0]), with_kwargs=True
    )
    cond = adapter.encode_prompts(PROMPTS)
    assert set(cond) == {"prompt_embeds", "negative_prompt_embeds"}
    assert not torch.equal(cond["prompt_embeds"], cond["negative_prompt_embeds"])
    adapter.predict(adapter.initial_noise(2), 0, cond)
    adapter.guidance_scale = 1.0
    assert set(adapter.encode_prompts(PROMPTS)) == {"prompt_embeds"}
    adapter.predict(adapter.initial_noise(2), 0, adapter.encode_prompts(PROMPTS))
    assert sizes == [4, 2]


def test_shift_comes_from_wans_unipc_scheduler_folder(tmp_path: Path) -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    pipe = tiny_wan_pipeline(0)
    # how Wan-AI's diffusers folders ship their scheduler (flow_shift 3.0 at 480p, 5.0 at 720p)
    pipe.scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0)
    pipe.save_pretrained(tmp_path)
    adapter = WanAdapter(str(tmp_path), **OPTIONS)
    assert adapter.flow_shift == 5.0
    euler = FlowMatchEulerDiscreteScheduler(shift=5.0)
    euler.set_timesteps(T)
    torch.testing.assert_close(adapter.sigmas(), euler.sigmas.float())
    assert WanAdapter(pipe, flow_shift=3.0, **OPTIONS).flow_shift == 3.0  # an explicit shift wins


def test_any_saved_wan_folder_loads_and_wrong_folders_fail_in_one_line(saved: Path, tmp_path: Path) -> None:
    from lit_treegrpo.models.tiny import tiny_sd3_pipeline

    loaded = WanAdapter(str(saved), **OPTIONS)
    assert len(loaded.pipeline.tokenizer) == 194 and loaded.flow_shift == 3.0
    missing = tmp_path / "no_such_model"
    with pytest.raises(FileNotFoundError, match="no such file or folder") as err:
        WanAdapter(str(missing), **OPTIONS)
    assert str(missing) in str(err.value) and "\n" not in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="lacks this component"):
        WanAdapter(str(tmp_path / "empty"), **OPTIONS)
    sd3 = tmp_path / "sd3"
    tiny_sd3_pipeline(0, with_t5=False).save_pretrained(sd3)
    with pytest.raises(ValueError, match="holds a StableDiffusion3Pipeline, not a WanPipeline") as err:
        WanAdapter(str(sd3), **OPTIONS)
    assert str(sd3) in str(err.value) and "\n" not in str(err.value)
    index = json.loads((saved / "model_index.json").read_text())
    two_expert = tmp_path / "wan22"  # a switch between experts, and only one expert
    shutil.copytree(saved, two_expert)
    (two_expert / "model_index.json").write_text(json.dumps({**index, "boundary_ratio": 0.875}))
    with pytest.raises(
        ValueError, match="needs both transformer_2 and boundary_ratio; this one has transformer_2 missing"
    ):
        WanAdapter(str(two_expert), **OPTIONS)
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE"):
        WanAdapter("nobody/not-a-cached-wan")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_frames=8), r"num_frames must be 4k \+ 1"),
        (dict(height=40), "height must be a positive multiple of 16"),
        (dict(width=0), "width must be a positive multiple of 16"),
        (dict(flow_shift=0.0), "flow_shift must be > 0"),
        (dict(max_sequence_length=0), "max_sequence_length"),
        (dict(dynamics="ode"), "dynamics"),
        (dict(lora=LoraSettings(target_modules=("to_q", "nothing_here"))), "match no module"),
    ],
)
def test_bad_options_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TinyWanAdapter(**kwargs)


def test_shard_wraps_every_transformer_block_and_keeps_the_output(tmp_path: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    adapter = TinyWanAdapter(num_steps=2, guidance_scale=5.0)
    noise = adapter.initial_noise(1, torch.Generator().manual_seed(0))
    cond = adapter.encode_prompts(PROMPTS[:1])
    before = rollout(adapter.predict, adapter.step, TreeSpec(2), cond, noise).leaf_latents
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        adapter.shard(init_device_mesh("cpu", (1,)))
        assert [isinstance(b, FSDPModule) for b in adapter.denoiser.blocks] == [True, True]
        assert isinstance(adapter.denoiser, FSDPModule)
        after = rollout(adapter.predict, adapter.step, TreeSpec(2), cond, noise).leaf_latents
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(after, before, atol=0, rtol=0)


def test_bf16_rollout_and_recompute_are_finite_with_float32_lora_masters() -> None:
    adapter = WanAdapter(tiny_wan_pipeline(0), **OPTIONS, torch_dtype="bfloat16")  # casts the built pipeline
    assert adapter.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in adapter.trainable_parameters())
    assert assert_bfloat16_tree_is_finite(adapter, PROMPTS, T).shape == (4, 9, 3, 32, 32)  # 2 videos a prompt
