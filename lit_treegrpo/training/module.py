"""TreeGRPOModule: the Lightning module around :class:`~lit_treegrpo.training.algorithm.TreeGRPO`."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor

from ..common.files import fresh_folder
from ..common.lightning_private import attached_trainer, saves_distributed_checkpoint, validate_inside_fit
from ..core.compute import Compute, ComputeCost
from ..core.interfaces import PromptSource
from ..core.loss import ClippedPolicyLoss
from ..core.pruning import NO_PRUNING, PruningConfig
from ..core.samples import GrownTree, ScoredSamples
from ..core.spec import RolloutLimits, TreeSpec
from ..data.prompt_stream import PromptBatch
from ..models.base import Cond, DiffusionAdapter
from ..rewards import RewardModel, build_rewards
from . import checkpoints
from .accelerator import compute_dtype, fused_on_cuda
from .algorithm import TreeGRPO
from .faults import FaultLedger, FaultPolicy
from .health import off_policy
from .memory_guard import MemoryCheck, MemoryGuard
from .predictions import save_predictions
from .prompt_cache import PromptCache, PromptCacheSettings
from .resume import ConfiguredOptimizer, reward_record
from .settings import AdvantageSettings, UpdateSettings, check_unused_parameters, check_val_samples
from .sharding import data_parallel_mesh, fsdp_gradient_sync
from .step_log import HEADLINE_HELD_OUT, X_AXIS, PhaseTimer, Update, step_metrics, step_outputs
from .work import StopRequested, WorkLimit, check_module_work

#: the seed of validation / test / predict samples (seeds VAL_SEED, VAL_SEED + 1, ... per prompt)
VAL_SEED = 1234


class TreeGRPOModule(LightningModule):
    """Tree-structured GRPO on a diffusion adapter.

    Args:
        adapter: the model family (``lit_treegrpo.models``): SD15Adapter, SD3Adapter, a tiny one...
        reward: a registered name (``hps``, ``image_reward``, ``pickscore``, ``clip_score``, ``aesthetic``,
            ``jpeg_compressibility``, ``jpeg_incompressibility``, ``brightness``, ``shapes``; videos:
            ``frame_average``, ``temporal_consistency``, ``video_model``), a name -> weight mapping, or a RewardModel.
        tree: the rollout tree per prompt (``configs/methods/*.yaml`` hold every method's).
        rollout: nodes per model call; a resumed run may change it.
        advantage: the advantage estimator.
        loss: the clipped policy loss.
        optimizer: over the trainable parameters; default AdamW(lr=1e-5, wd=1e-4) as TreeGRPO.
        lr_scheduler: stepped once per training step.
        minibatches: optimizer steps per inner epoch (DanceGRPO's recipe 3, Flow-GRPO's and TreeGRPO's 2).
        edges_per_update: instead of ``minibatches``, one optimizer step per this many kept edges (BranchGRPO: 12).
        accumulate: micro-batches per optimizer step (gradient accumulation).
        inner_epochs: passes over the kept edges per rollout (PPO epochs; 1 in TreeGRPO).
        grad_clip: clip the gradient norm to this value (1.0 as the papers); null disables.
        seed: seeds every rollout and the window's and pruning's draws: one option varies a whole run.
        val_samples: samples per validation / test prompt; two or more also log their diversity.
        validate_at_start: a fit from iteration 0 first scores the base model, so every ``val/*`` curve starts there.
        reward_kwargs: loader arguments per reward name, e.g. ``{hps: {checkpoint: v2.0}}``.
        faults: NaN / inf rewards, a failing reward call, a non-finite loss or gradient: stop or skip.
        memory_guard: before the first rollout, refuse a tree that cannot fit and size the training forwards.
        compute_cost: the weights of counted work in compute units (``compute/*``).
        prompt_cache: each distinct prompt encoded once (a GPU's memory: docs/configs.md).
        work_limit: the most denoiser evaluations an iteration or a validation pass may cost, and the largest sample.
    """

    def __init__(
        self,
        adapter: DiffusionAdapter,
        reward: RewardModel | str | dict[str, float],
        tree: TreeSpec,
        rollout: RolloutLimits = RolloutLimits(),
        advantage: AdvantageSettings = AdvantageSettings(),
        loss: ClippedPolicyLoss | None = None,
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
        minibatches: int = 1,
        edges_per_update: int | None = None,
        accumulate: int = 1,
        inner_epochs: int = 1,
        grad_clip: float | None = 1.0,
        seed: int = 0,
        val_samples: int = 1,
        validate_at_start: bool = True,
        reward_kwargs: dict[str, dict[str, Any]] | None = None,
        faults: FaultPolicy = FaultPolicy(),
        memory_guard: MemoryGuard = MemoryGuard(),
        compute_cost: ComputeCost = ComputeCost(),
        prompt_cache: PromptCacheSettings = PromptCacheSettings(),
        work_limit: WorkLimit = WorkLimit(),
    ) -> None:
        super().__init__()
        check_val_samples(val_samples)
        update = UpdateSettings(minibatches, edges_per_update, accumulate, inner_epochs, grad_clip)
        self.adapter = adapter
        self.reward = build_rewards(reward, reward_kwargs or {}, video=adapter.makes_video)
        self.loss_fn = loss if loss is not None else ClippedPolicyLoss()
        self.algorithm = TreeGRPO(
            adapter,
            self.reward,
            tree,
            advantage=advantage,
            loss=self.loss_fn,
            update=update,
            faults=FaultLedger(faults),
            memory=MemoryCheck(memory_guard),
            rollout=rollout,
            seed=seed,
            prompt_cache=PromptCache(prompt_cache),
        )
        self._reward_record = (reward_record(reward), dict(reward_kwargs or {}))  # as configured, for checkpoints
        self.advantage, self.faults, self.memory_guard = advantage, faults, memory_guard
        self.work_limit = work_limit
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.val_samples = val_samples
        self.validate_at_start = validate_at_start
        self.compute_cost = compute_cost
        self.compute_spent = Compute()  # the run's counted work so far; restored from checkpoints
        self.iteration = 0  # completed training steps; restored from checkpoints
        self.pruning: PruningConfig = NO_PRUNING  # in force for the next iteration (PruningSchedule sets it)
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints hold the trainable weights only
        self.adapter_config: dict[str, Any] | None = None  # the adapter's init_args as configured (the CLI sets it)
        self._configured: ConfiguredOptimizer | None = None  # this run's optimizer options, as built
        self._resumed: dict[str, Any] | None = None  # what a resumed fit's checkpoint recorded
        self._warned_off_policy = False

    # ------------------------------------------------------------------------ what callbacks read
    @property
    def tree(self) -> TreeSpec:
        return self.algorithm.tree

    @property
    def seed(self) -> int:
        return self.algorithm.seed

    @property
    def update_settings(self) -> UpdateSettings:
        return self.algorithm.update_settings

    @property
    def fault_counts(self) -> dict[str, int]:
        """The fault counters, logged as ``faults/*``."""
        return self.algorithm.faults.counts

    @property
    def optimizer_steps_per_iteration(self) -> int | None:
        return self.update_settings.steps_per_iteration

    def tree_at(self, iteration: int) -> TreeSpec:
        return self.algorithm.tree_at(iteration)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return self.adapter.trainable_parameters()

    def grow(self, prompts: list[str], generators: list[torch.Generator]) -> GrownTree:
        """The tree a training step of the current iteration grows for ``prompts`` (``TreeView``)."""
        return self.algorithm.grow(prompts, generators, iteration=self.iteration, pruning=self.pruning)

    def sample(self, prompts: list[str], seed: int) -> Tensor:
        try:
            return self.algorithm.sample(prompts, seed)
        except StopRequested:
            raise SIGTERMException from None  # Lightning's own stop: CheckpointOnInterrupt takes it from here

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        return self.algorithm.score(images, prompts, check=False)[0]

    # ------------------------------------------------------------------------ optimisation
    def configure_optimizers(self) -> Any:
        params = self.adapter.trainable_parameters()
        if self.optimizer_factory is None:
            optimizer = torch.optim.AdamW(params, lr=1e-5, weight_decay=1e-4)
        else:
            optimizer = self.optimizer_factory(params)
        optimizer = fused_on_cuda(optimizer, self.adapter.device)
        # a resumed fit restores the checkpoint's optimizer state over these: on_train_start puts
        # this run's options back (resume.apply_optimizer_options)
        self._configured = ConfiguredOptimizer.record(optimizer)
        if self.lr_scheduler_factory is None:
            return optimizer
        scheduler = self.lr_scheduler_factory(optimizer)
        self._configured.add_scheduler(scheduler)
        checkpoints.keep_foreign_scheduler_state_out(self)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}

    def configure_model(self) -> None:
        """FSDP2 under ``ModelParallelStrategy``: the adapter shards its denoiser over the data-parallel mesh."""
        from lightning.pytorch.strategies import ModelParallelStrategy

        if not isinstance(self.trainer.strategy, ModelParallelStrategy):
            return
        if saves_distributed_checkpoint(self.trainer.strategy):
            raise ValueError(
                "ModelParallelStrategy(save_distributed_checkpoint=True) writes a sharded checkpoint of "
                "every weight, which this module's trainable-only checkpoints cannot resume from; set "
                "trainer.strategy.init_args.save_distributed_checkpoint: false"
            )
        self.adapter.shard(data_parallel_mesh(self.device_mesh, self.trainer.world_size))

    # ------------------------------------------------------------------------ training
    def training_step(self, batch: PromptBatch, batch_idx: int) -> dict[str, ScoredSamples]:
        """One iteration of :class:`TreeGRPO` on this rank's prompts; the callbacks receive the
        leaves that trained (``ScoredSamples.of(outputs)``)."""
        if batch.index != self.iteration:
            raise RuntimeError(
                f"data stream at batch {batch.index} but the module at iteration {self.iteration}; "
                "resume through the Trainer (--ckpt_path) so both restart together"
            )
        timer, prompts = PhaseTimer(self.adapter.device), batch.prompts
        per_rank = len(prompts)  # the global stream position of this rank's first prompt
        first = batch.index * per_rank * self.trainer.world_size + self.trainer.global_rank * per_rank
        try:
            grown, plan, update = self.algorithm.step(
                prompts,
                iteration=self.iteration,
                first_position=first,
                pruning=self.pruning,
                optimization=lambda: _ManualOptimization(self),
                ranks=_TrainerRanks(self.trainer, self.device),
                timer=timer,
                before_rollout=lambda spec, cond, noise: self._check_memory(spec, cond, noise, len(prompts)),
            )
        except StopRequested:
            # stopped mid-rollout: nothing of this iteration ran, so the checkpoint is the one before it, and a
            # resumed run draws this iteration again exactly
            raise SIGTERMException from None
        if update.stopped is not None:
            rank_zero_info(str(update.stopped))
        self._check_on_policy(update)
        timer.lap("train")
        self.algorithm.faults.end_step(plan, update.steps, update.fault, self.iteration)
        self.iteration += 1
        tree = grown.tree
        spent = update.compute + Compute(sampling=tree.nfe, reward_images=len(grown.leaf_prompts))
        self.compute_spent = self.compute_spent + spent
        metrics = step_metrics(
            grown.scored.rewards,
            tree,
            grown.keep,
            grown.advantages,
            update,
            self.fault_counts,
            timer.laps,
            self.iteration,
            spent,
            self.compute_spent,
            self.compute_cost,
        )
        self.log_dict(metrics.shown, prog_bar=True, batch_size=len(prompts))
        self.log_dict({**metrics.logged, "optimizer_steps": float(self.trainer.global_step)}, batch_size=len(prompts))
        return step_outputs(
            grown.scored, grown.screened, tree.leaf_prompt, grown.leaf_prompts, grown.images
        ).as_step_output()

    def _check_on_policy(self, update: Update) -> None:
        """Warn (once) when the first micro-batch's ratios, before any update, were not 1."""
        if update.ratio_dev_at_start is None or self._warned_off_policy:
            return
        dtype = compute_dtype(self.trainer, self.adapter.dtype)
        message = off_policy(float(update.ratio_dev_at_start), dtype, self.iteration)
        if message is not None:
            self._warned_off_policy = True
            warnings.warn(message, UserWarning, stacklevel=2)

    # ------------------------------------------------------------------------ memory
    def _check_memory(self, spec: TreeSpec, cond: Cond, noise: Tensor, num_prompts: int) -> None:
        """The memory guard, at the first rollout of a fit unless it ran before the data."""
        memory = self.algorithm.memory
        if memory.checked:
            return
        optimizers = self.trainer.optimizers
        memory.check(
            self.adapter,
            spec,
            cond,
            noise,
            num_prompts,
            max_batch=self.algorithm.rollout_limits.max_batch,
            micro_batches=self.update_settings.micro_batches(spec, num_prompts),
            optimizer=optimizers[0] if optimizers else None,
            processes=max(self.trainer.num_devices, 1),
            any_rank=_TrainerRanks(self.trainer, self.device).any,
        )

    def on_fit_start(self) -> None:
        datamodule = self._datamodule()
        if datamodule is not None:
            datamodule.start_index = self.iteration
        check_unused_parameters(self.adapter, getattr(self.trainer.strategy, "model", None))
        cache = self.algorithm.prompt_cache
        if cache is not None and cache.settings.pre_encode:
            cache.pre_encode_data(self.adapter, datamodule)
        self.algorithm.memory.checked = False
        if datamodule is None or not self.memory_guard.enabled:
            return  # checked at the first rollout instead
        with torch.no_grad():  # one training prompt, and a noise of its own generator (no draw of the run's)
            cond = self.adapter.encode_prompts(list(datamodule.train_set.prompts[:1]))
            noise = self.adapter.initial_noise(1, torch.Generator(self.adapter.device).manual_seed(0))  # [1, *S]
        with self.trainer.precision_plugin.train_step_context():  # the probe's dtypes: the training step's
            self._check_memory(self.tree_at(self.iteration), cond, noise, datamodule.per_rank_batch_size())

    def _datamodule(self) -> PromptSource | None:
        trainer = attached_trainer(self)
        datamodule = getattr(trainer, "datamodule", None)
        return datamodule if isinstance(datamodule, PromptSource) else None

    def on_train_start(self) -> None:
        """A resumed fit takes this run's optimizer options over the restored ones; a fit from
        iteration 0 validates the base model first (``validate_at_start``)."""
        resumed, self._resumed = self._resumed, None
        if resumed is not None and self._configured is not None:
            checkpoints.apply_resumed_options(self, resumed)
        if self.validate_at_start and self.iteration == 0 and self.trainer.enable_validation:
            validate_inside_fit(self.trainer)

    # ------------------------------------------------------------------------ validation, test, predict
    def _evaluate(self, batch: PromptBatch, prefix: str) -> ScoredSamples:
        """Sample and score ``batch`` (``val_samples`` seeds per prompt) and log ``<prefix>/reward``."""
        seeds = range(VAL_SEED, VAL_SEED + self.val_samples)
        images = torch.cat([self.sample(batch.prompts, seed) for seed in seeds])  # [S * P, 3, H, W]
        prompts = list(batch.prompts) * self.val_samples
        rewards, components = self.algorithm.score(images, prompts, check=self.faults.nonfinite == "error")
        mean, size = rewards.mean(), len(prompts)
        self.log(f"{prefix}/reward", mean, prog_bar=prefix == "val", sync_dist=True, batch_size=size)
        if prefix == "val":  # the headline pair, first in TensorBoard (see step_log.HEADLINE)
            self.log(HEADLINE_HELD_OUT, mean, sync_dist=True, batch_size=size)
        self.log(X_AXIS, float(self.iteration), sync_dist=True, batch_size=size)  # at the weights' iteration
        return ScoredSamples(rewards, components, prompts, images)

    def validation_step(self, batch: PromptBatch, batch_idx: int) -> ScoredSamples:
        return self._evaluate(batch, "val")

    def test_step(self, batch: PromptBatch, batch_idx: int) -> ScoredSamples:
        return self._evaluate(batch, "test")

    def on_predict_start(self) -> None:
        """Take this predict's own folder (``predictions``, ``predictions-2``, ...), named by rank 0."""
        root = Path(self.trainer.default_root_dir)
        folder = str(fresh_folder(root, "predictions")) if self.trainer.is_global_zero else None
        self._predictions = Path(self.trainer.strategy.broadcast(folder))
        if self.trainer.is_global_zero:
            rank_zero_info(f"predict: writing the images to {self._predictions}")

    def predict_step(self, batch: PromptBatch, batch_idx: int) -> list[str]:
        """One PNG per prompt into this predict's folder; returns the paths."""
        return save_predictions(self.sample(batch.prompts, VAL_SEED), batch.prompts, self._predictions, batch.index)

    # ------------------------------------------------------------------------ checkpoints
    def setup(self, stage: str) -> None:
        self._resumed = None  # set again by on_load_checkpoint when this fit resumes
        datamodule = self._datamodule()  # the CLI checked the same before the model loaded; this is for Python
        if datamodule is not None:
            check_module_work(stage, self.tree_at(self.iteration), datamodule, self.val_samples, self.work_limit,
                              inner_epochs=self.update_settings.inner_epochs)  # fmt: skip
        self.algorithm.stop_requested = self._stop_requested

    def _stop_requested(self) -> bool:
        """A SIGTERM (or a Ctrl-C, which :class:`~lit_treegrpo.callbacks.CheckpointOnInterrupt` turns into one) on a
        single process. With several, the ranks stop together between iterations, where Lightning's loops agree: a
        rank that left a phase alone would leave the others waiting in a collective."""
        trainer = self._trainer
        return trainer is not None and trainer.world_size == 1 and trainer.received_sigterm

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoints.save_state(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoints.load_state(self, checkpoint)
        datamodule = self._datamodule()
        if datamodule is not None:  # sharded strategies restore after on_fit_start
            datamodule.start_index = self.iteration


class _ManualOptimization:
    """:class:`~lit_treegrpo.training.algorithm.Optimization` through Lightning's manual optimization."""

    def __init__(self, module: LightningModule) -> None:
        self.module = module
        self.optimizer = module.optimizers()

    @contextlib.contextmanager
    def toggle(self, sync: bool) -> Iterator[None]:
        # Lightning's toggle_model skips DDP's sync with no_sync, but does nothing under ModelParallelStrategy: FSDP2
        # is told itself, when the memory guard found room for the unsharded gradients until the optimizer step
        defer = not sync and self.module.algorithm.memory.defer_sync
        with self.optimizer.toggle_model(sync_grad=sync), fsdp_gradient_sync(self.module, not defer):
            yield

    def backward(self, loss: Tensor) -> None:
        self.module.manual_backward(loss)

    def clip(self, max_norm: float) -> None:
        self.module.clip_gradients(self.optimizer, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def scheduler_step(self) -> None:
        scheduler = self.module.lr_schedulers()
        if scheduler is not None:
            scheduler.step()


class _TrainerRanks:
    """:class:`~lit_treegrpo.training.algorithm.Ranks` through the trainer's strategy (no
    collective on one process)."""

    def __init__(self, trainer: Any, device: torch.device) -> None:
        self.trainer, self.device = trainer, device
        self.world_size = trainer.world_size

    def sum(self, values: list[int | bool]) -> list[int]:
        if self.world_size == 1:
            return [int(v) for v in values]
        flags = torch.tensor([float(v) for v in values], device=self.device)  # [K]
        total = self.trainer.strategy.reduce(flags, reduce_op="sum")  # [K]
        return [int(v) for v in total.round().tolist()]

    def any(self, decision: bool) -> bool:
        if self.world_size == 1:
            return decision
        return self.trainer.strategy.reduce_boolean_decision(decision, all=False)

    def max(self, values: list[int]) -> list[int]:
        most = self.trainer.strategy.reduce(torch.tensor(values, device=self.device), reduce_op="max")
        return [int(c) for c in most.tolist()]
