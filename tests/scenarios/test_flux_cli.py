"""configs/tiny_flux.yaml through the command line: trains, checkpoints, logs samples, resumes
exactly (one process and FSDP2 on two CPU processes)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.cli.test_cli import QUIET, REPO, fit, scalars, trainable

TINY_FLUX = REPO / "configs" / "tiny_flux.yaml"


@pytest.mark.slow  # the CLI in-process: ~15 s of argument parsing and model building on 2 cores
def test_tiny_flux_fit_trains_checkpoints_and_logs_samples(tmp_path: Path) -> None:
    from lit_treegrpo.cli import main

    main(["fit", "--config", str(TINY_FLUX), *QUIET, "--trainer.max_steps", "2", "--trainer.val_check_interval", "2",
          "--trainer.default_root_dir", str(tmp_path)])  # fmt: skip
    events = sorted((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events[0]), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    assert "samples" in acc.Tags()["images"] and acc.Images("samples")[-1].width > 32
    assert len(acc.Scalars("reward")) == 2 and "val/reward" in acc.Tags()["scalars"]
    # 2 prompts x (1 + 2 + 4 + 4) evaluations of the k=2 tree over 4 steps: one forward each, no CFG
    assert {e.value for e in acc.Scalars("nfe/rollout")} == {2 * (1 + 2 + 4 + 4)}
    state = trainable(tmp_path / "checkpoints" / "last.ckpt")
    assert state and all("lora_" in k for k in state)
    assert any("single_transformer_blocks" in k for k in state) and any(k.count(".transformer_blocks.") for k in state)
    assert any(v.abs().max() > 0 for k, v in state.items() if "lora_B" in k)  # it trained


@pytest.mark.slow  # real processes, run and resumed: a minute or more on 2 cores
def test_tiny_flux_resume_with_ckpt_path_last_continues_exactly(tmp_path: Path) -> None:
    full, part = tmp_path / "full", tmp_path / "part"
    args = ("--trainer.val_check_interval", "100", "--trainer.limit_val_batches", "0")
    fit(full, "--trainer.max_steps", "6", *args, config=TINY_FLUX)
    fit(part, "--trainer.max_steps", "3", *args, config=TINY_FLUX)
    resumed = fit(part, "--trainer.max_steps", "6", "--ckpt_path", "last", *args, config=TINY_FLUX)
    assert "Resuming from" in resumed.stdout + resumed.stderr
    a, b = trainable(full / "checkpoints" / "last.ckpt"), trainable(part / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys() and any("single_transformer_blocks" in k for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed parameters differ from the uninterrupted run"
    losses_full = [v for _, v in scalars(full, "loss")]
    assert len(losses_full) == 6 and [v for _, v in scalars(part, "loss")] == losses_full


class SaveFullRankParameters(pl.Callback):
    """Each rank's trainable parameters gathered whole, and the mesh size of those that are FSDP2
    shards (DTensors), written to ``folder/rank{r}.pt`` at the end of training. (The root module's
    own parameters may be unsharded then: FSDP2 keeps the root gathered after a forward.)"""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from torch.distributed.tensor import DTensor

        params, sharded = {}, {}
        for name, p in pl_module.named_parameters():
            if p.requires_grad:  # every rank gathers every parameter, in the same order
                if isinstance(p, DTensor):
                    sharded[name] = p.device_mesh.size()
                params[name] = (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu()
        self.folder.mkdir(parents=True, exist_ok=True)
        torch.save({"params": params, "sharded": sharded}, self.folder / f"rank{trainer.global_rank}.pt")


FSDP2 = (
    '{"class_path": "lightning.pytorch.strategies.ModelParallelStrategy", "init_args": '
    '{"data_parallel_size": 2, "tensor_parallel_size": 1, "save_distributed_checkpoint": false}}'
)


def test_model_parallel_with_tensor_parallel_ranks_is_refused() -> None:
    from lit_treegrpo.training.sharding import data_parallel_mesh

    class Mesh:  # the two named dimensions of ModelParallelStrategy's device mesh
        def __init__(self, sizes: dict[str, int]) -> None:
            self.sizes = sizes

        def __getitem__(self, name: str) -> Mesh:
            return Mesh({name: self.sizes[name]})

        def size(self) -> int:
            return next(iter(self.sizes.values()))

    auto = Mesh({"data_parallel": 1, "tensor_parallel": 2})  # Lightning's "auto" on one node of 2
    with pytest.raises(ValueError, match="data_parallel_size: 2 and tensor_parallel_size: 1"):
        data_parallel_mesh(auto, world_size=2)
    assert data_parallel_mesh(Mesh({"data_parallel": 2, "tensor_parallel": 1}), world_size=2).size() == 2


@pytest.mark.slow  # 2 processes x 3 runs
@pytest.mark.parametrize("lora", ["lora", "full"])
def test_tiny_flux_fsdp2_trains_and_resumes_on_two_cpu_processes(tmp_path: Path, lora: str) -> None:
    probe = '{"class_path": "tests.scenarios.test_flux_cli.SaveFullRankParameters", "init_args": {"folder": "%s"}}'
    common = [
        "--trainer.limit_val_batches",
        "0",
        "--data.batch_size",
        "1",
        "--trainer.devices",
        "2",
        "--trainer.strategy",
        FSDP2,
    ]
    if lora == "full":  # BranchGRPO's FLUX setting fine-tunes the whole transformer
        common += ["--model.adapter.init_args.lora", "null", "--model.optimizer.lr", "1e-3"]
    fit(
        tmp_path / "full",
        "--trainer.max_steps",
        "4",
        "--trainer.callbacks+",
        probe % (tmp_path / "ranks"),
        *common,
        config=TINY_FLUX,
    )
    fit(tmp_path / "part", "--trainer.max_steps", "2", *common, config=TINY_FLUX)
    fit(tmp_path / "part", "--trainer.max_steps", "4", "--ckpt_path", "last", *common, config=TINY_FLUX)
    full = trainable(tmp_path / "full" / "checkpoints" / "last.ckpt")
    part = trainable(tmp_path / "part" / "checkpoints" / "last.ckpt")
    assert full and full.keys() == part.keys()
    assert any("single_transformer_blocks" in k for k in full)
    assert all("lora_" in k for k in full) == (lora == "lora")
    for k in full:
        torch.testing.assert_close(part[k], full[k], atol=1e-6, rtol=0)
    assert [v for _, v in scalars(tmp_path / "part", "loss")] == [v for _, v in scalars(tmp_path / "full", "loss")]
    # sharded over both processes, and the two ranks hold the same model (gradients were reduced)
    rank0, rank1 = (torch.load(tmp_path / "ranks" / f"rank{r}.pt") for r in (0, 1))
    blocks = [k for k in full if ".transformer_blocks." in k or ".single_transformer_blocks." in k]
    assert blocks and all(rank["sharded"].get(k) == 2 for rank in (rank0, rank1) for k in blocks)
    assert rank0["params"].keys() == rank1["params"].keys()
    assert all(torch.equal(rank0["params"][k], rank1["params"][k]) for k in rank0["params"])
    moved = [k for k in full if not torch.equal(full[k], rank0["params"][k])]
    assert not moved, f"the checkpoint differs from the trained parameters: {moved[:3]}"
