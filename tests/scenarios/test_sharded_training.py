"""What a multi-GPU run does, on two CPU processes (gloo): one gradient sync per optimizer step under FSDP2 and DDP,
the memory guard counting each rank's shard, and FSDP2 full fine-tuning over bf16 weights with float32 masters that
checkpoints and resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.cli.test_cli import FSDP2, fit, trainable

PROBE = '{"class_path": "tests.probes.CountGradientSyncs", "init_args": {"folder": "%s", "defer": %s}}'
#: two micro-batches per optimizer step (one per iteration), so that deferring the sync halves the collectives; SGD,
#: as the DDP test: Adam's first steps are ~lr * sign(grad), which turns the float noise of a summation order into
#: full-size updates, where SGD keeps the comparison about the gradients
TWO_MICRO_BATCHES = ("--model.optimizer", "torch.optim.SGD", "--model.optimizer.lr", "10.0",
                     "--model.accumulate", "2", "--model.minibatches", "1", "--data.batch_size", "1",
                     "--trainer.devices", "2", "--trainer.limit_val_batches", "0", "--trainer.max_steps", "2")  # fmt: skip
FULL_BF16 = ("--model.adapter.init_args.lora", "null", "--model.adapter.init_args.torch_dtype", "bfloat16")


def _syncs(folder: Path) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp2", "ddp"])
def test_one_gradient_sync_per_optimizer_step_with_the_weights_of_one_per_micro_batch(
    tmp_path: Path, strategy: str
) -> None:
    chosen = FSDP2 if strategy == "fsdp2" else "ddp"
    runs = {}
    for defer in ("true", "false"):
        root = tmp_path / defer
        fit(
            root,
            *TWO_MICRO_BATCHES,
            "--trainer.strategy",
            chosen,
            "--trainer.callbacks+",
            PROBE % (root / "probe", defer),
        )
        runs[defer] = (_syncs(root / "probe"), trainable(root / "checkpoints" / "last.ckpt"))
    (deferred, weights), (every, reference) = runs["true"], runs["false"]
    for rank in (0, 1):
        once = [calls for calls, steps in deferred[rank]["per_iteration"] if steps == 1]
        twice = [calls for calls, steps in every[rank]["per_iteration"] if steps == 1]
        assert len(once) == len(twice) == 2 and min(once) > 0, (once, twice)
        assert [2 * c for c in once] == twice, (once, twice)  # half the collectives: one per step, not per micro-batch
    assert weights.keys() == reference.keys() and any("lora_B" in k for k in weights)
    for k in weights:
        torch.testing.assert_close(weights[k], reference[k], atol=1e-5, rtol=0)
    if strategy == "fsdp2":
        for rank in deferred:
            # the guard counts the rank's shard of the gradients, not the global size every rank would otherwise add
            assert rank["guard_gradients"] == rank["held_gradient_bytes"] < rank["global_gradient_bytes"]


@pytest.mark.slow
def test_fsdp2_full_fine_tuning_over_bf16_weights_keeps_float32_masters_and_resumes_exactly(tmp_path: Path) -> None:
    common = (*FULL_BF16, "--trainer.strategy", FSDP2, "--trainer.devices", "2", "--data.batch_size", "1",
              "--trainer.limit_val_batches", "0")  # fmt: skip
    probe = PROBE % (tmp_path / "probe", "true")
    fit(tmp_path / "full", "--trainer.max_steps", "4", *common, "--trainer.callbacks+", probe)
    fit(tmp_path / "part", "--trainer.max_steps", "2", *common)
    fit(tmp_path / "part", "--trainer.max_steps", "4", "--ckpt_path", "last", *common)
    for rank in _syncs(tmp_path / "probe"):
        assert rank["dtypes"] == ["torch.float32"]  # the trained shards: float32 masters over the bf16 checkpoint
    saved = torch.load(tmp_path / "full" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    weights = saved["state_dict"]
    trained = {k: v for k, v in weights.items() if k.startswith("adapter.denoiser.")}
    assert trained and not any("lora_" in k for k in weights) and {v.dtype for v in trained.values()} == {torch.float32}
    moments = [s for state in saved["optimizer_states"] for s in state["state"].values()]
    assert moments and {m["exp_avg"].dtype for m in moments} == {m["exp_avg_sq"].dtype for m in moments} == {
        torch.float32
    }
    resumed = trainable(tmp_path / "part" / "checkpoints" / "last.ckpt")
    assert resumed.keys() == weights.keys()
    assert all(torch.equal(resumed[k], weights[k]) for k in weights)  # exactly where the straight run ended
