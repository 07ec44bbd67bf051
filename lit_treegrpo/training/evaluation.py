"""Validation, test and predict: deterministic (ODE) samples of fixed prompts, scored or written.

:class:`Evaluation` is a part of :class:`~lit_treegrpo.training.module.TreeGRPOModule` (mixed into
it, so its methods are the module's Lightning hooks). A prompt's noise depends on the seed and the
prompt's text only, so an image does not change with the batch it is in or the number of
processes; ``val_samples`` seeds per prompt, from ``val_seed``. It reads the module's ``adapter``,
``rollout_limits``, ``val_seed``, ``val_samples``, ``validate_at_start``, ``iteration`` and its
reward (``_score``).

A fit from iteration 0 validates once before its first update (``validate_at_start``), so that every
``val/*`` curve starts at the base model: Lightning's own first validation comes after
``val_check_interval`` steps, and its sanity check logs nothing.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from ..common.files import fresh_folder
from ..core.rollout import rollout
from ..core.samples import ScoredSamples
from ..core.seeding import generator
from ..core.spec import TreeSpec
from ..data.prompt_stream import PromptBatch
from .predictions import save_predictions
from .step_log import HEADLINE_HELD_OUT, X_AXIS


class Evaluation:
    """The module's sampling for validation / test / predict; a base class of ``TreeGRPOModule``."""

    @torch.no_grad()
    def sample(self, prompts: list[str], seed: int) -> Tensor:
        """Deterministic (ODE) samples [P, 3, H, W] in [0, 1], one per prompt. Each prompt's noise
        depends on ``seed`` and the prompt's text only, so an image does not change with the batch
        it is in or the number of processes."""
        device = self.adapter.device
        gens = [generator(seed, zlib.crc32(p.encode()), device=device) for p in prompts]
        cond = self.encode(prompts)
        noise = torch.cat([self.adapter.initial_noise(1, g) for g in gens])  # [P, *S]
        tree = rollout(
            self.adapter.predict,
            self.adapter.step,
            TreeSpec(self.adapter.num_steps),
            cond,
            noise,
            max_batch=self.rollout_limits.max_batch,
        )
        return self.adapter.decode(tree.leaf_latents)

    def on_train_start(self) -> None:
        """Validate the base model (iteration 0) before the first update of a fit from scratch."""
        super().on_train_start()
        trainer = self.trainer
        if not self.validate_at_start or self.iteration != 0 or not trainer.enable_validation:
            return
        # what Lightning's training epoch loop does around a validation inside the fit
        loop = trainer.fit_loop.epoch_loop
        first_loop_iter = trainer._logger_connector._first_loop_iter
        trainer.validating = True
        loop.val_loop.run()
        trainer.training = True
        trainer._logger_connector._first_loop_iter = first_loop_iter

    def _evaluate(self, batch: PromptBatch, prefix: str) -> ScoredSamples:
        """Sample and score ``batch`` (``val_samples`` seeds per prompt), log ``<prefix>/reward``, and
        hand the samples to the callbacks (RewardMetrics' per-prompt tables and diversity)."""
        seeds = range(self.val_seed, self.val_seed + self.val_samples)
        images = torch.cat([self.sample(batch.prompts, seed) for seed in seeds])  # [S * P, 3, H, W]
        prompts = list(batch.prompts) * self.val_samples
        rewards, components = self._score(images, prompts)
        mean = rewards.mean()
        self.log(f"{prefix}/reward", mean, prog_bar=prefix == "val", sync_dist=True, batch_size=len(prompts))
        if prefix == "val":  # the headline pair, first in TensorBoard (see step_log.HEADLINE)
            self.log(HEADLINE_HELD_OUT, mean, sync_dist=True, batch_size=len(prompts))
        self.log(X_AXIS, float(self.iteration), sync_dist=True, batch_size=len(prompts))  # at the weights' iteration
        return ScoredSamples(rewards, components, prompts, images)

    def validation_step(self, batch: PromptBatch, batch_idx: int) -> ScoredSamples:
        return self._evaluate(batch, "val")

    def test_step(self, batch: PromptBatch, batch_idx: int) -> ScoredSamples:
        return self._evaluate(batch, "test")

    def on_predict_start(self) -> None:
        """Take this predict's own folder: ``predictions``, or ``predictions-2``, ``-3``, ... when an
        earlier one is there, so that no image of another predict is written over (created by global
        rank 0, the name shared with every rank)."""
        super().on_predict_start()
        root = Path(self.trainer.default_root_dir)
        folder = str(fresh_folder(root, "predictions")) if self.trainer.is_global_zero else None
        self._predictions = Path(self.trainer.strategy.broadcast(folder))
        if self.trainer.is_global_zero:
            rank_zero_info(f"predict: writing the images to {self._predictions}")

    def predict_step(self, batch: PromptBatch, batch_idx: int) -> list[str]:
        """Write one PNG per prompt into this predict's folder (:meth:`on_predict_start`); returns
        the paths."""
        return save_predictions(
            self.sample(batch.prompts, self.val_seed), batch.prompts, self._predictions, batch.index
        )
