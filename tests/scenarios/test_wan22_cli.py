"""configs/tiny_wan22.yaml through the command line, for both Wan2.2 shapes: trains (both experts of
A14B), logs video samples and resumes exactly (real processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.cli.test_cli import REPO, fit, scalars, trainable

TINY_WAN22 = REPO / "configs" / "tiny_wan22.yaml"


@pytest.mark.slow  # three real processes per shape on 2 cores: about a minute each
@pytest.mark.parametrize("kind", ["a14b", "ti2v"])
def test_tiny_wan22_fits_logs_video_and_resumes_exactly(kind: str, tmp_path: Path) -> None:
    full, part = tmp_path / "full", tmp_path / "part"
    args = ("--model.adapter.init_args.kind", kind, "--trainer.val_check_interval", "2")
    if kind == "ti2v":  # one transformer: no second expert's guidance
        args += ("--model.adapter.init_args.guidance_scale_2", "null")
    fit(full, "--trainer.max_steps", "4", *args, config=TINY_WAN22)
    fit(part, "--trainer.max_steps", "2", *args, config=TINY_WAN22)
    resumed = fit(part, "--trainer.max_steps", "4", "--ckpt_path", "last", *args, config=TINY_WAN22)
    assert "Resuming from" in resumed.stdout + resumed.stderr

    a, b = trainable(full / "checkpoints" / "last.ckpt"), trainable(part / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys() and a and all("lora_" in k for k in a)
    experts = {k.split(".")[1] for k in a}  # adapter.denoiser.* / adapter.denoiser_2.*
    assert experts == ({"denoiser", "denoiser_2"} if kind == "a14b" else {"denoiser"})
    for expert in experts:  # each trained
        assert any(v.abs().max() > 0 for k, v in a.items() if k.split(".")[1] == expert and "lora_B" in k), expert
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed parameters differ from the uninterrupted run"
    losses = [v for _, v in scalars(full, "loss")]
    assert len(losses) == 4 and [v for _, v in scalars(part, "loss")] == losses
    names = sorted(p.name for p in (full / "samples").iterdir())
    assert names[:2] == ["step_000000.gif", "step_000000.png"] and "step_000004.gif" in names


@pytest.mark.slow  # two runs of two real processes on 2 cores: about a minute and a half
def test_ddp_with_both_experts_training_needs_unused_parameter_detection(tmp_path: Path) -> None:
    from tests.cli.test_cli import run_cli

    # the tree's only stochastic step is on the high-noise expert: the low-noise LoRA gets no gradient
    args = ("fit", "--config", str(TINY_WAN22), "--trainer.devices", "2", "--trainer.max_steps", "2",
            "--trainer.limit_val_batches", "0", "--data.batch_size", "1", "--model.tree.branch_steps", "[0]")  # fmt: skip
    refused = run_cli(*args, "--trainer.strategy", "ddp", root=tmp_path / "ddp")
    assert refused.returncode != 0
    assert "use --trainer.strategy ddp_find_unused_parameters_true" in refused.stderr
    fit(tmp_path / "unused", "--trainer.devices", "2", "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0",
        "--data.batch_size", "1", "--model.tree.branch_steps", "[0]", "--trainer.strategy",
        "ddp_find_unused_parameters_true", config=TINY_WAN22)  # fmt: skip
    state = trainable(tmp_path / "unused" / "checkpoints" / "last.ckpt")
    assert any(v.abs().max() > 0 for k, v in state.items() if ".denoiser." in k and "lora_B" in k)  # high noise trained
    assert all(v.abs().max() == 0 for k, v in state.items() if ".denoiser_2." in k and "lora_B" in k)  # low: no edges
