"""configs/tiny_wan.yaml end to end: a tiny Wan2.1 video policy trains on video rewards, logs its
samples as video, checkpoints, and resumes exactly."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.cli.test_cli import QUIET, fit, scalars, trainable

REPO = Path(__file__).resolve().parents[2]
TINY_WAN = REPO / "configs" / "tiny_wan.yaml"


def test_tiny_wan_fit_in_process_trains_logs_video_and_checkpoints(tmp_path: Path) -> None:
    from PIL import Image

    from lit_treegrpo.cli import TreeGRPOCLI
    from lit_treegrpo.rewards import VideoMultiReward

    args = ["fit", "--config", str(TINY_WAN), *QUIET, "--trainer.default_root_dir", str(tmp_path),
            "--trainer.max_steps", "2", "--trainer.val_check_interval", "2"]  # fmt: skip
    cli = TreeGRPOCLI(args=args)
    assert isinstance(cli.model.reward, VideoMultiReward)
    assert cli.model.iteration == 2
    # the grid before step 0 and after step 2: an animated GIF and a filmstrip each
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == [
        "step_000000.gif",
        "step_000000.png",
        "step_000002.gif",
        "step_000002.png",
    ]
    events = sorted((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events[0]), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    assert {"samples", "samples/video"} <= set(acc.Tags()["images"])
    video = acc.Images("samples/video")[-1]
    gif = Image.open(io.BytesIO(video.encoded_image_string))
    assert video.encoded_image_string[:6] == b"GIF89a" and gif.n_frames == 9  # all 9 frames
    # 2 prompts x 2 seeds of 32 px at scale 2, padding 2: (2 * 64 + 3 * 2) square per frame
    assert gif.size == (134, 134) and (video.width, video.height) == (134, 134)
    strip = acc.Images("samples")[-1]  # 8 of the 9 frames side by side
    assert (strip.width, strip.height) == (8 * 134 + 9 * 2, 134 + 2 * 2)
    for tag in ("reward/frame_average/mean", "reward/temporal_consistency/mean", "val/reward", "loss"):
        assert tag in acc.Tags()["scalars"], tag
    assert all(0.0 < e.value < 1.0 for e in acc.Scalars("reward/frame_average/mean"))
    state = trainable(tmp_path / "checkpoints" / "last.ckpt")
    assert state and all("lora_" in k for k in state)


@pytest.mark.slow  # three real processes on 2 cores: about 2 minutes
def test_tiny_wan_resume_with_ckpt_path_last_continues_exactly(tmp_path: Path) -> None:
    full, part = tmp_path / "full", tmp_path / "part"
    args = ("--trainer.val_check_interval", "100", "--trainer.limit_val_batches", "0")
    fit(full, "--trainer.max_steps", "4", *args, config=TINY_WAN)
    fit(part, "--trainer.max_steps", "2", *args, config=TINY_WAN)
    resumed = fit(part, "--trainer.max_steps", "4", "--ckpt_path", "last", *args, config=TINY_WAN)
    assert "Resuming from" in resumed.stdout + resumed.stderr
    a, b = trainable(full / "checkpoints" / "last.ckpt"), trainable(part / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys() and a
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed parameters differ from the uninterrupted run"
    losses_full = [v for _, v in scalars(full, "loss")]
    assert len(losses_full) == 4 and [v for _, v in scalars(part, "loss")] == losses_full
    components = "reward/frame_average/mean"
    assert [v for _, v in scalars(part, components)] == [v for _, v in scalars(full, components)]


def test_predict_writes_a_looping_gif_per_video(tmp_path: Path) -> None:
    from PIL import Image

    from lit_treegrpo.training.predictions import save_predictions

    videos = torch.rand(2, 5, 3, 8, 12, generator=torch.Generator().manual_seed(0))  # [P, F, 3, H, W]
    paths = save_predictions(videos, ["a red fox", "a cat"], tmp_path, batch_index=3)
    assert [Path(p).name for p in paths] == ["00003_00_a_red_fox.gif", "00003_01_a_cat.gif"]
    gif = Image.open(paths[0])
    assert gif.n_frames == 5 and gif.size == (12, 8) and gif.info["loop"] == 0
    images = save_predictions(videos[:, 0], ["a red fox", "a cat"], tmp_path, batch_index=4)
    assert Image.open(images[0]).size == (12, 8) and images[0].endswith(".png")  # images unchanged


def test_the_module_refuses_an_image_reward_for_a_video_policy_and_back() -> None:
    from lit_treegrpo.core import TreeSpec
    from lit_treegrpo.models.tiny import TinySD3Adapter
    from lit_treegrpo.models.tiny_wan import TinyWanAdapter
    from lit_treegrpo.training.module import TreeGRPOModule

    with pytest.raises(ValueError, match="the adapter makes videos but reward 'brightness' scores images"):
        TreeGRPOModule(TinyWanAdapter(num_steps=2), "brightness", TreeSpec(2, branch_steps=(0,), branching=2))
    with pytest.raises(ValueError, match="scores videos but the adapter makes images"):
        TreeGRPOModule(TinySD3Adapter(num_steps=2), "temporal_consistency", TreeSpec(2, branch_steps=(0,), branching=2))


@pytest.mark.slow  # three runs of two real processes each on 2 cores: minutes
def test_tiny_wan_fsdp2_trains_and_resumes_on_two_cpu_processes(tmp_path: Path) -> None:
    from tests.cli.test_cli import FSDP2

    common = ("--trainer.limit_val_batches", "0", "--data.batch_size", "1", "--trainer.devices", "2",
              "--trainer.strategy", FSDP2)  # fmt: skip
    fit(tmp_path / "full", "--trainer.max_steps", "4", *common, config=TINY_WAN)
    fit(tmp_path / "part", "--trainer.max_steps", "2", *common, config=TINY_WAN)
    fit(tmp_path / "part", "--trainer.max_steps", "4", "--ckpt_path", "last", *common, config=TINY_WAN)
    full = trainable(tmp_path / "full" / "checkpoints" / "last.ckpt")
    part = trainable(tmp_path / "part" / "checkpoints" / "last.ckpt")
    assert full and full.keys() == part.keys() and all("lora_" in k for k in full)
    assert any(v.abs().max() > 0 for k, v in full.items() if "lora_B" in k)  # it trained
    for k in full:
        torch.testing.assert_close(part[k], full[k], atol=1e-6, rtol=0)
    assert [v for _, v in scalars(tmp_path / "part", "loss")] == [v for _, v in scalars(tmp_path / "full", "loss")]
