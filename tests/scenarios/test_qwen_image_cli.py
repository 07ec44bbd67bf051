"""configs/tiny_qwen_image.yaml through the command line: trains, checkpoints, logs samples and
resumes exactly (real processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.cli.test_cli import REPO, fit, scalars, trainable

TINY_QWEN_IMAGE = REPO / "configs" / "tiny_qwen_image.yaml"


@pytest.mark.slow  # three real processes on 2 cores: about a minute
def test_tiny_qwen_image_fits_logs_samples_and_resumes_exactly(tmp_path: Path) -> None:
    full, part = tmp_path / "full", tmp_path / "part"
    every = ("--trainer.val_check_interval", "2")
    fit(full, "--trainer.max_steps", "4", *every, config=TINY_QWEN_IMAGE)
    fit(part, "--trainer.max_steps", "2", *every, config=TINY_QWEN_IMAGE)
    resumed = fit(part, "--trainer.max_steps", "4", "--ckpt_path", "last", *every, config=TINY_QWEN_IMAGE)
    assert "Resuming from" in resumed.stdout + resumed.stderr

    a, b = trainable(full / "checkpoints" / "last.ckpt"), trainable(part / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys() and a and all("lora_" in k for k in a)
    assert any("add_q_proj" in k for k in a) and any("attn.to_q" in k for k in a)  # text and image streams
    assert any(v.abs().max() > 0 for k, v in a.items() if "lora_B" in k)  # it trained
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed parameters differ from the uninterrupted run"
    losses = [v for _, v in scalars(full, "loss")]
    assert len(losses) == 4 and [v for _, v in scalars(part, "loss")] == losses
    assert [v for _, v in scalars(part, "val/reward")] == [v for _, v in scalars(full, "val/reward")]

    # the sample grid (every 5 steps in the config) before training and at the end, on disk and in TensorBoard
    assert sorted(p.name for p in (full / "samples").iterdir()) == ["step_000000.png", "step_000004.png"]
    events = sorted((full / "tensorboard").rglob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events[0]), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    grid = acc.Images("samples")[-1]
    assert (grid.width, grid.height) > (32, 32) and len(acc.Images("samples")) == 2
    # 2 prompts x (1 + 2 + 4 + 4) evaluations of the k=2 tree over 4 steps (a CFG pair is one evaluation)
    assert {e.value for e in acc.Scalars("nfe/rollout")} == {2 * (1 + 2 + 4 + 4)}
