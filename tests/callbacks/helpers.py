"""A stand-in for TreeGRPOModule with the interface the callbacks rely on, over a real tiny SD3.

``adapter``, the pruning in force (``pruning``, set by the fit's ``PruningSchedule``), ``iteration``
(completed steps, bumped at the end of ``training_step`` and checkpointed), ``sample(prompts, seed)``,
``score``, ``trainable_parameters``, and step outputs :class:`ScoredSamples` (without images;
a training step's in Lightning's mapping, as the module returns it). Rewards are computed from the decoded images (brightness and redness); a training
step takes one real optimizer step on the LoRA parameters.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from lit_treegrpo.core.pruning import NO_PRUNING, PruningConfig
from lit_treegrpo.core.samples import ScoredSamples
from lit_treegrpo.core.spec import TreeSpec
from lit_treegrpo.models.lora import LoraSettings
from lit_treegrpo.models.tiny import TinySD3Adapter

TRAIN_PROMPTS = ["a red circle", "a blue square", "a green triangle", "a photo of a cat"]
VAL_PROMPTS = ["a yellow star", "a dog"]
LEAVES_PER_PROMPT = 2


def tiny_adapter() -> TinySD3Adapter:
    """Seeded, so two calls give identical weights (~4k LoRA parameters, 32 px images)."""
    return TinySD3Adapter(num_steps=2, guidance_scale=1.0, use_t5=False, lora=LoraSettings(rank=4, alpha=4.0))


def prompt_loader(prompts: list[str], batch_size: int = 2) -> DataLoader:
    return DataLoader(prompts, batch_size=batch_size, shuffle=False, collate_fn=list)


def score(images: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Total reward [B] = mean of brightness and redness, and both components."""
    brightness = images.mean(dim=(1, 2, 3))  # [B]
    redness = images[:, 0].mean(dim=(1, 2))  # [B]
    return 0.5 * (brightness + redness), {"brightness": brightness, "redness": redness}


class StandIn(pl.LightningModule):
    def __init__(self, lr: float = 0.05, nan_prompt: str | None = None) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.adapter = tiny_adapter()
        self.iteration = 0
        self.seed = 0
        self.pruning: PruningConfig = NO_PRUNING
        self.optimizer_steps_per_iteration = 1
        self.lr = lr
        self.nan_prompt = nan_prompt
        self.seen_pruning: list[tuple[int, PruningConfig]] = []
        self.train_outputs: list[ScoredSamples] = []
        self.val_weights: list[list[Tensor]] = []  # trainable weights seen by each validation

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.adapter.trainable_parameters(), lr=self.lr)

    @torch.no_grad()
    def sample(self, prompts: list[str], seed: int) -> Tensor:
        a = self.adapter
        cond = a.encode_prompts(prompts)
        x = a.initial_noise(len(prompts), torch.Generator().manual_seed(seed))
        for i in range(a.num_steps):
            x = a.step(a.predict(x, i, cond), x, i, stochastic=False).prev_sample
        return a.decode(x)  # [P, 3, H, W]

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return self.adapter.trainable_parameters()

    def tree_at(self, iteration: int) -> TreeSpec:
        return TreeSpec(self.adapter.num_steps)  # no stochastic step

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        return score(images)[0]

    def grow(self, prompts: list[str], generators: list[torch.Generator]) -> Any:
        raise NotImplementedError

    def training_step(self, batch: list[str], batch_idx: int) -> dict[str, ScoredSamples]:
        self.seen_pruning.append((self.iteration, self.pruning))
        # like TreeGRPOModule, the data position is the iteration: Lightning restarts a plain
        # DataLoader at its first batch when it resumes from a checkpoint written at an epoch's end
        first = len(batch) * self.iteration % len(TRAIN_PROMPTS)
        prompts = TRAIN_PROMPTS[first : first + len(batch)]
        leaf_prompts = [p for p in prompts for _ in range(LEAVES_PER_PROMPT)]
        images = self.sample(leaf_prompts, seed=1000 + self.iteration)  # [L, 3, H, W]
        rewards, components = score(images)
        if self.nan_prompt is not None:
            rewards[[i for i, p in enumerate(leaf_prompts) if p == self.nan_prompt]] = float("nan")
        # one real update of the LoRA weights: shrink the first step's velocity
        a = self.adapter
        cond = a.encode_prompts(leaf_prompts)
        x = a.initial_noise(len(leaf_prompts), torch.Generator().manual_seed(2000 + self.iteration))
        loss = a.predict(x, 0, cond).float().pow(2).mean()
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        self.iteration += 1
        out = ScoredSamples(rewards, components, leaf_prompts)
        self.train_outputs.append(out)
        return out.as_step_output()

    def validation_step(self, batch: list[str], batch_idx: int) -> ScoredSamples:
        if batch_idx == 0:
            self.val_weights.append([p.detach().clone() for p in self.adapter.trainable_parameters()])
        rewards, components = score(self.sample(batch, seed=7))
        return ScoredSamples(rewards, components, list(batch))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["iteration"] = self.iteration

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.iteration = checkpoint["iteration"]


def trainer(tmp_path, max_steps: int, callbacks: list, **kwargs: Any) -> pl.Trainer:
    from lightning.pytorch.loggers import TensorBoardLogger

    options: dict[str, Any] = dict(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=TensorBoardLogger(str(tmp_path), name="tb", version=0),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
        callbacks=callbacks,
    )
    options.update(kwargs)
    return pl.Trainer(**options)


def events(tmp_path):
    """EventAccumulator over the TensorBoard run written by :func:`trainer`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb" / "version_0"), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def same(xs: list[Tensor], ys: list[Tensor]) -> bool:
    """Bitwise equality of two equally long, non-empty lists of tensors."""
    assert len(xs) == len(ys) > 0
    return all(torch.equal(x, y) for x, y in zip(xs, ys))
