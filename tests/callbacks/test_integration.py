"""All four callbacks in real ``Trainer.fit`` runs of the stand-in module over a tiny SD3, checked
through the TensorBoard event file; and an exact resume from a mid-run checkpoint."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lit_treegrpo.callbacks import EMA, PruningSchedule, RewardMetrics, SampleGridLogger
from lit_treegrpo.callbacks.sample_grid import to_uint8_hwc
from lit_treegrpo.core.pruning import PruningConfig

from .helpers import LEAVES_PER_PROMPT, TRAIN_PROMPTS, VAL_PROMPTS, StandIn, events, prompt_loader, same, trainer

MAX_STEPS = 4  # 2 epochs of 2 batches of 2 prompts, a validation after each


class SaveDuringValidation(Callback):
    """Placed before EMA: records the training weights, then writes a checkpoint while EMA's
    averaged weights are swapped in (in the first validation batch)."""

    def __init__(self, path) -> None:
        self.path = path
        self.training: list[list[torch.Tensor]] = []
        self.saved: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None

    def on_validation_start(self, trainer, pl_module) -> None:
        self.training.append([p.detach().clone() for p in pl_module.adapter.trainable_parameters()])

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self.saved is None:
            trainer.save_checkpoint(self.path)
            live = [p.detach().clone() for p in pl_module.adapter.trainable_parameters()]
            self.saved = (self.training[-1], live)


def png_pixels(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("fit")
    saver = SaveDuringValidation(tmp / "during_validation.ckpt")
    callbacks = dict(
        pruning=PruningSchedule(width="extreme", width_fraction=0.5, depth_window=1, depth_every=1, depth_stop=2),
        ema=EMA(decay=0.5),
        # the bare grid (captions: tests/scenarios/test_after_training.py), so that its layout is checked pixel by pixel
        grid=SampleGridLogger(prompts=TRAIN_PROMPTS[:3], seeds=[0, 1], every_n_steps=2, captions=False),
        metrics=RewardMetrics(),
    )
    module = StandIn()
    fit = trainer(tmp, MAX_STEPS, [saver, *callbacks.values()])
    fit.fit(module, prompt_loader(TRAIN_PROMPTS), prompt_loader(VAL_PROMPTS))
    return dict(tmp=tmp, module=module, saver=saver, events=events(tmp), **callbacks)


def test_pruning_schedule_set_before_every_step(run) -> None:
    # width "extreme" for ceil(0.5 * 4) = 2 steps; depth window of 1 moving 1 deeper per step, stop 2
    expected = [
        (0, PruningConfig(width="extreme", depth_window=(0, 1))),
        (1, PruningConfig(width="extreme", depth_window=(1, 2))),
        (2, PruningConfig(width="none", depth_window=(2, 3))),
        (3, PruningConfig(width="none", depth_window=(2, 3))),
    ]
    assert run["module"].seen_pruning == expected


def test_reward_scalars_match_the_step_outputs(run) -> None:
    acc, outputs = run["events"], run["module"].train_outputs
    assert len(outputs) == MAX_STEPS

    def logged(tag: str) -> list[float]:
        return [e.value for e in acc.Scalars(tag)]

    def close(values: list[float], expected: list[float]) -> None:
        assert values == pytest.approx(expected, rel=1e-6, abs=1e-7)

    rewards = [o.rewards.double() for o in outputs]
    close(logged("reward/mean"), [r.mean().item() for r in rewards])
    close(logged("reward/std"), [r.std(unbiased=False).item() for r in rewards])
    close(logged("reward/max"), [r.max().item() for r in rewards])
    close(logged("reward/min"), [r.min().item() for r in rewards])
    bright = [o.reward_components["brightness"].double() for o in outputs]
    close(logged("reward/brightness/mean"), [b.mean().item() for b in bright])
    close(logged("reward/redness/max"), [o.reward_components["redness"].max().item() for o in outputs])
    # per-prompt means: each prompt's 2 leaves are consecutive
    per_prompt = [r.view(-1, LEAVES_PER_PROMPT).mean(1) for r in rewards]
    close(logged("reward/prompt_best"), [m.max().item() for m in per_prompt])
    close(logged("reward/prompt_worst"), [m.min().item() for m in per_prompt])
    assert (per_prompt[0].max() - per_prompt[0].min()).item() > 1e-6  # best and worst differ
    # per epoch: epochs are steps (0, 1) and (2, 3)
    close(logged("reward/mean_epoch"), [torch.cat(rewards[0:2]).mean().item(), torch.cat(rewards[2:4]).mean().item()])
    assert len(acc.Scalars("val/reward/mean")) == 2  # one per validation
    assert len(acc.Scalars("val/reward/brightness/std")) == 2


def test_prompt_tables_are_written(run) -> None:
    acc = run["events"]
    tensors = acc.Tags()["tensors"]
    expected = {"reward/prompts/text_summary", "val/reward/prompts/text_summary", "samples/prompts/text_summary"}
    assert expected <= set(tensors)
    last = acc.Tensors("reward/prompts/text_summary")[-1]
    text = last.tensor_proto.string_val[0].decode()
    assert all(p in text for p in TRAIN_PROMPTS)
    table = run["metrics"].table
    assert sorted(table) == sorted(TRAIN_PROMPTS)
    assert all(n == 2 * LEAVES_PER_PROMPT for _, n, _ in table.values())  # each prompt seen in 2 epochs


def test_validation_runs_with_the_ema_weights_and_training_weights_come_back(run) -> None:
    module, ema, saver = run["module"], run["ema"], run["saver"]
    params = module.adapter.trainable_parameters()
    # the last validation came after the last update: it saw exactly the current average
    assert same(module.val_weights[-1], ema.shadows)
    # and the training weights were back afterwards, bitwise (no training after the last validation)
    assert same(params, saver.training[-1])
    assert not same(params, ema.shadows)
    assert ema.num_updates == MAX_STEPS


def test_checkpoint_written_during_validation_holds_training_weights(run) -> None:
    module, saver = run["module"], run["saver"]
    training, live = saver.saved
    assert not same(training, live)  # EMA weights were in place
    state = torch.load(saver.path, weights_only=False)["state_dict"]
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    assert same([state[n] for n in names], training)


def test_sample_grid_in_tensorboard_and_png(run) -> None:
    acc, module, ema, grid = run["events"], run["module"], run["ema"], run["grid"]
    images = acc.Images("samples")
    # at the start, before step 2 (after 2 steps), at the end (after 4)
    assert [e.step for e in images] == [0, 2, 4]
    # 3 prompt rows, 2 seed columns of 32 px with 2 px padding: 3*32 + 4*2 = 104 high, 70 wide
    assert {(e.height, e.width) for e in images} == {(104, 70)}
    final = png_pixels(images[-1].encoded_image_string)
    on_disk = png_pixels((run["tmp"] / "samples" / "step_000004.png").read_bytes())
    assert np.array_equal(final, on_disk)
    assert sorted(p.name for p in (run["tmp"] / "samples").iterdir()) == [
        "step_000000.png",
        "step_000002.png",
        "step_000004.png",
    ]
    # the final grid was sampled with the EMA weights, not the training weights
    assert np.array_equal(final, to_uint8_hwc(grid.make(module, ema)).numpy())
    assert not np.array_equal(final, to_uint8_hwc(grid.make(module)).numpy())
    text = acc.Tensors("samples/prompts/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| 2 | a green triangle |" in text


def test_resume_from_a_mid_run_checkpoint_is_exact(tmp_path) -> None:
    def callbacks() -> list[Callback]:
        return [
            EMA(decay=0.5),
            RewardMetrics(),
            SampleGridLogger(prompts=TRAIN_PROMPTS[:1], seeds=[0], every_n_steps=3, save_png=False),
        ]

    def fit(root, ckpt_path=None):
        cbs = callbacks()
        saver = ModelCheckpoint(dirpath=root / "ckpt", every_n_epochs=1, save_top_k=-1, save_on_train_epoch_end=True)
        module = StandIn()
        trainer(root, MAX_STEPS, [*cbs, saver], enable_checkpointing=True).fit(
            module, prompt_loader(TRAIN_PROMPTS), ckpt_path=ckpt_path
        )
        return module, cbs

    full, (ema_full, metrics_full, grid_full) = fit(tmp_path / "full")
    mid = tmp_path / "full" / "ckpt" / "epoch=0-step=2.ckpt"
    assert mid.exists()
    resumed, (ema_res, metrics_res, grid_res) = fit(tmp_path / "resumed", ckpt_path=str(mid))
    assert resumed.iteration == MAX_STEPS and len(resumed.train_outputs) == MAX_STEPS - 2
    assert ema_res.num_updates == MAX_STEPS  # 2 restored + 2 new
    assert same(ema_res.shadows, ema_full.shadows)
    assert same(resumed.adapter.trainable_parameters(), full.adapter.trainable_parameters())
    assert not same(ema_full.shadows, full.adapter.trainable_parameters())
    assert metrics_res.table == metrics_full.table  # the running per-prompt table continued
    assert grid_res.last_logged == grid_full.last_logged == MAX_STEPS
