"""TreeGRPOModule: one training step = grow the tree, score the leaves, back up advantages, prune,
and run clipped policy-gradient updates on the kept edges (manual optimization).

Every method of the papers is a configuration of this one module (each a preset in configs/methods/): flat GRPO
(DanceGRPO, Flow-GRPO) is a tree with ``num_trees = G`` chains, MixGRPO adds an SDE window,
TreeGRPO branches inside a window, BranchGRPO splits at fixed steps with fusion advantages and
pruning. The algorithm itself lives in :mod:`lit_treegrpo.core`; this file is the Lightning glue,
with parts of it in their own files: the trees a step grows, scores, backs up and prunes
(:class:`~lit_treegrpo.training.growth.TreeGrowth`, which the ``TreeView`` callback draws too), the
policy update (:class:`~lit_treegrpo.training.update.PolicyUpdate`), the checkpoint hooks
(:class:`~lit_treegrpo.training.checkpoint_state.CheckpointState`) and the deterministic sampling of
validation / test / predict (:class:`~lit_treegrpo.training.evaluation.Evaluation`); FSDP2
sharding is :class:`~lit_treegrpo.training.sharding.Sharding`'s.

Randomness is a pure function of ``(seed, iteration, global prompt position)``: each prompt's
root noise and SDE noise come from its own generator, so a resumed run continues exactly and a
data-parallel run samples what one process with the same global batch samples.

Faults (NaN / inf rewards, a reward call that raises, a non-finite loss or gradient) stop the run
or are skipped and counted, as :class:`~lit_treegrpo.training.faults.FaultLedger` decides for all ranks. Before
the first batch, :class:`~lit_treegrpo.training.memory_guard.RolloutGuard` refuses a tree that cannot fit in memory, and
:class:`~lit_treegrpo.training.memory_guard.TrainingGuard` sets how many parents a training forward takes.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from ..core.compute import Compute, ComputeCost
from ..core.loss import ClippedPolicyLoss, check_kl_reference
from ..core.pruning import NO_PRUNING, PruningConfig, PruningSource
from ..core.rollout import RolloutTree
from ..core.samples import ScoredSamples
from ..core.seeding import generator
from ..core.spec import RolloutLimits, TreeSpec
from ..data.prompt_stream import PromptBatch
from ..models.base import Cond, DiffusionAdapter
from ..models.flow import FlowMatchingAdapter
from ..rewards import RewardModel, build_rewards
from .accelerator import compute_dtype, fused_on_cuda
from .checkpoint_state import CheckpointState
from .evaluation import Evaluation
from .faults import FaultLedger, FaultPolicy
from .growth import TreeGrowth
from .health import HealthChecks
from .memory_guard import MemoryGuard, RolloutGuard, TrainingGuard
from .prompt_cache import PromptCache, PromptCacheSettings
from .resume import (
    ConfiguredOptimizer,
    reward_record,
)
from .settings import AdvantageSettings, check_reuse, check_settings, check_unused_parameters
from .sharding import Sharding
from .step_log import NO_UPDATE, PhaseTimer, Update, step_metrics, step_outputs
from .update import PolicyUpdate


class TreeGRPOModule(TreeGrowth, PolicyUpdate, CheckpointState, Evaluation, Sharding, LightningModule):
    """Tree-structured GRPO on a diffusion adapter.

    Pruning is not an option of the module: the fit's ``PruningSchedule`` callback owns it (a
    constant schedule is fixed pruning; :meth:`pruning_at`), and without one every edge trains.

    Args:
        adapter: the model family (``lit_treegrpo.models``): SD15Adapter, SD3Adapter, a tiny one...
        reward: what scores the decoded images (videos) against their prompts: a registered name
            (``hps``, ``image_reward``, ``pickscore``, ``clip_score``, ``aesthetic``, ``jpeg_compressibility``,
            ``jpeg_incompressibility``, ``brightness``, ``shapes``; videos: ``frame_average``,
            ``temporal_consistency``, ``video_model``), a mapping name -> weight for a MultiReward
            (normalised per prompt, then weighted, as TreeGRPO), or a RewardModel.
        tree: the rollout tree per prompt and how its roots share noise (``configs/methods/*.yaml``
            hold every compared method's).
        rollout: how a rollout runs within memory (nodes per model call, a cap on leaves); a
            resumed run may change it.
        advantage: advantage estimator settings.
        loss: the clipped policy loss (clip range, advantage clip, KL weight, aggregation).
        optimizer: optimizer over the trainable parameters; default AdamW(lr=1e-5, wd=1e-4) as
            TreeGRPO.
        lr_scheduler: optional LR scheduler, stepped once per training step.
        minibatches: optimizer steps per inner epoch: the kept edges are shuffled into this many
            minibatches of whole parents (one forward per parent serves all its children).
            DanceGRPO's recipe takes 3 per rollout, Flow-GRPO's and TreeGRPO's 2.
        edges_per_update: instead of a fixed ``minibatches``, one optimizer step per this many
            kept edges (``ceil(kept / edges_per_update)`` steps, counted over all data-parallel
            ranks; BranchGRPO's code steps every 12 edges); null uses ``minibatches``.
        accumulate: micro-batches per optimizer step (gradient accumulation; the kept edges are
            split into ``minibatches * accumulate`` micro-batches).
        inner_epochs: passes over the kept edges per rollout (PPO epochs; 1 in TreeGRPO).
        grad_clip: clip the gradient norm to this value (1.0 as the papers); null disables.
        seed: seeds every rollout, together with the iteration and the prompt's position, and is added
            to the seeds of the tree's window draws and the pruning schedule's step draws, so that
            this one option varies a whole run (the benchmark's seed ``k``).
        val_seed: seed of the deterministic validation / test / predict samples.
        val_samples: samples per validation / test prompt (seeds ``val_seed``, ``val_seed + 1``,
            ...); with two or more, RewardMetrics also logs their within-prompt diversity.
        validate_at_start: a fit that starts from iteration 0 first scores the base model on the
            validation prompts, so that every ``val/*`` curve starts at the untrained model (not on
            resume, nor without validation data: ``--trainer.limit_val_batches 0``).
        reward_kwargs: loader arguments per reward name, e.g. ``{hps: {checkpoint: v2.0}}``.
        faults: what to do with NaN / inf rewards, a failing reward call, or a non-finite loss or
            gradient: stop (``error``, the default) or skip and count (``skip``).
        memory_guard: before the first batch is drawn, refuse a tree whose rollout cannot fit in memory,
            and split a training micro-batch too large for one forward into several (gradients
            accumulated), refusing a run where not even one parent fits.
        compute_cost: the weights that turn a step's counted work (sampling, trained and reference
            forwards, scored images) into compute units (``compute/*`` metrics; see
            :mod:`lit_treegrpo.core.compute`): a trained forward with its backward is 3 sampling
            forwards by default.
        reuse_rollout_forward: train on the rollout's own forwards of the stochastic steps instead
            of recomputing them (one forward per trained parent saved; where it is exact only:
            :func:`~lit_treegrpo.training.settings.check_reuse`; docs/configs.md, "For a GPU").
        prompt_cache: each distinct prompt encoded once (:mod:`~lit_treegrpo.training.prompt_cache`).
        health: the on-policy check: the largest ``|ratio - 1|`` of each iteration's first
            micro-batch, before any update, is logged (``health/ratio_dev_at_start``) and warned
            about above ``ratio_tolerance`` (default by dtype; :mod:`~lit_treegrpo.training.health`).
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
        val_seed: int = 1234,
        val_samples: int = 1,
        validate_at_start: bool = True,
        reward_kwargs: dict[str, dict[str, Any]] | None = None,
        faults: FaultPolicy = FaultPolicy(),
        memory_guard: MemoryGuard = MemoryGuard(),
        compute_cost: ComputeCost = ComputeCost(),
        health: HealthChecks = HealthChecks(),
        prompt_cache: PromptCacheSettings = PromptCacheSettings(),
        reuse_rollout_forward: bool = False,
    ) -> None:
        super().__init__()
        tree = tree.with_num_steps(adapter.num_steps)  # the adapter owns the number of steps
        check_settings(
            tree,
            minibatches=minibatches,
            accumulate=accumulate,
            inner_epochs=inner_epochs,
            grad_clip=grad_clip,
            val_samples=val_samples,
            edges_per_update=edges_per_update,
            limits=rollout,
        )
        self.adapter = adapter
        self.reward = build_rewards(reward, reward_kwargs or {}, video=adapter.makes_video)
        self._reward_record = (reward_record(reward), dict(reward_kwargs or {}))  # as configured, for checkpoints
        self.tree = tree
        self.rollout_limits = rollout
        self.advantage = advantage
        self.loss_fn = loss if loss is not None else ClippedPolicyLoss()
        check_kl_reference(self.loss_fn.kl_beta, has_lora=adapter.lora is not None)
        if (
            self.loss_fn.kl_beta > 0
            and self.loss_fn.kl_form == "flow_grpo"
            and not isinstance(adapter, FlowMatchingAdapter)
        ):
            raise ValueError(
                f"loss.kl_form flow_grpo needs a flow-matching adapter (its step size |dt|); "
                f"{type(adapter).__name__} is not one: use kl_form exact"
            )
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.minibatches = minibatches
        self.edges_per_update = edges_per_update
        self.accumulate = accumulate
        self.inner_epochs = inner_epochs
        self.grad_clip = grad_clip
        self.seed = seed
        self.val_seed = val_seed
        self.val_samples = val_samples
        self.validate_at_start = validate_at_start
        self.faults = faults
        self.memory_guard = memory_guard
        self.health = health
        self.prompt_cache = PromptCache(prompt_cache)
        if reuse_rollout_forward:
            check_reuse(
                minibatches=minibatches,
                inner_epochs=inner_epochs,
                accumulate=accumulate,
                edges_per_update=edges_per_update,
                kl_beta=self.loss_fn.kl_beta,
                max_train_parents=memory_guard.max_train_parents,
            )
        self.reuse_rollout_forward = reuse_rollout_forward
        self._warned_off_policy = False
        self.fault_ledger = FaultLedger(faults)  # its counters are restored from checkpoints
        self.rollout_guard = RolloutGuard(
            memory_guard, rollout.max_batch
        )  # checks once per fit, before the first batch
        self.training_guard = TrainingGuard(memory_guard)  # likewise; splits micro-batches that do not fit
        self._warned_nothing_kept = False  # pruning that keeps no edge is warned about once
        self.iteration = 0  # completed training steps; restored from checkpoints
        self.compute_cost = compute_cost
        self.compute_spent = Compute()  # the run's counted work so far; restored from checkpoints
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints hold the trainable weights only
        self.adapter_config: dict[str, Any] | None = None
        """The adapter's ``init_args`` as configured, which the CLI sets (a checkpoint records it,
        so that a resume that changes one is refused by name: docs/configs.md, resume rules)."""
        self._configured: ConfiguredOptimizer | None = None  # this run's optimizer options, as built
        self._resumed: dict[str, Any] | None = None  # what a resumed fit's checkpoint recorded

    @property
    def fault_counts(self) -> dict[str, int]:
        """The fault counters (:data:`lit_treegrpo.training.faults.FAULT_COUNTERS`), logged as ``faults/*``."""
        return self.fault_ledger.counts

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
        self._keep_foreign_scheduler_state_out()
        return {"optimizer": optimizer, "lr_scheduler": scheduler}

    # ------------------------------------------------------------------------ randomness
    def _generators(self, stream: int, first_position: int, count: int) -> list[torch.Generator]:
        """One generator per prompt, seeded by (seed, stream, iteration, global position)."""
        device = self.adapter.device
        return [generator(self.seed, stream, self.iteration, first_position + i, device=device) for i in range(count)]

    def _first_position(self, batch: PromptBatch) -> int:
        """Global stream position of this rank's first prompt (see PromptDataModule)."""
        per_rank = len(batch.prompts)
        return batch.index * per_rank * self.trainer.world_size + self.trainer.global_rank * per_rank

    # ------------------------------------------------------------------------ scoring
    def _score(self, images: Tensor, prompts: list[str]) -> tuple[Tensor, dict[str, Tensor]]:
        """Total reward [L] float32 and its components (empty for a single reward).

        Under the ``error`` policy a NaN / inf score raises (naming the reward and the prompts);
        under ``skip`` it comes back as is, and the fault ledger drops the prompts it belongs to.
        """
        scores = self.reward.score(images, prompts, check=self.faults.nonfinite == "error")
        return scores.total.float(), {k: v.float() for k, v in scores.components.items()}

    # ------------------------------------------------------------------------ training
    def training_step(self, batch: PromptBatch, batch_idx: int) -> dict[str, ScoredSamples]:
        """Roll out one tree per prompt, score its leaves, back up advantages, prune (:meth:`grow`),
        and update the policy on the kept edges. Faults go through :attr:`fault_ledger`. The
        callbacks receive the leaves that trained as :class:`~lit_treegrpo.core.samples.ScoredSamples`
        (``ScoredSamples.of(outputs)``)."""
        self._check_stream(batch)
        timer, ledger, prompts = PhaseTimer(self.adapter.device), self.fault_ledger, batch.prompts
        first = self._first_position(batch)
        grown = self.grow(prompts, self._generators(0, first, len(prompts)), timer=timer, guard=True)
        tree, scored = grown.tree, grown.scored

        plan = ledger.tally(
            scored,
            grown.screened,
            grown.keep,
            prompts,
            tree.leaf_prompt,
            iteration=self.iteration,
            sum_over_ranks=self._sum_over_ranks,
        )
        self._warn_if_nothing_kept(plan, tree, grown.pruning)
        update = self._update(tree, grown.cond, grown.advantages, grown.keep, first) if plan.train else NO_UPDATE
        self._check_on_policy(update)
        timer.lap("train")
        ledger.end_step(plan, update.steps, update.fault, self.iteration)

        self.iteration += 1
        spent = update.compute + Compute(sampling=tree.nfe, reward_images=len(grown.leaf_prompts))
        self.compute_spent = self.compute_spent + spent
        self._log_step(scored.rewards, tree, grown.keep, grown.advantages, update, len(prompts), timer.laps, spent)
        return step_outputs(scored, grown.screened, tree.leaf_prompt, grown.leaf_prompts, grown.images).as_step_output()

    def _check_stream(self, batch: PromptBatch) -> None:
        if batch.index != self.iteration:
            raise RuntimeError(
                f"data stream at batch {batch.index} but the module at iteration {self.iteration}; "
                "resume through the Trainer (--ckpt_path) so both restart together"
            )

    def pruning_at(self, spec: TreeSpec) -> PruningConfig:
        """This iteration's pruning, as the fit's pruning owner says (a
        :class:`~lit_treegrpo.core.pruning.PruningSource`: the ``PruningSchedule`` callback); every
        edge trains without one. ``spec``: the iteration's tree, whose stochastic steps a
        ``step_fraction`` draws from."""
        trainer = self._trainer
        owners = [c for c in trainer.callbacks if isinstance(c, PruningSource)] if trainer is not None else []
        if not owners:
            return NO_PRUNING
        if len(owners) > 1:
            names = ", ".join(type(c).__name__ for c in owners)
            raise ValueError(f"the pruning has {len(owners)} owners ({names}); configure one pruning callback")
        stochastic = [t for t in range(spec.num_steps) if spec.is_stochastic(t)]
        return owners[0].pruning_at(self.iteration, stochastic, self.seed)

    def _check_on_policy(self, update: Update) -> None:
        """Warn (once) when the first micro-batch's ratios, before any update, were not 1 (one
        host read per iteration, after the updates)."""
        if update.ratio_dev_at_start is None or self._warned_off_policy:
            return
        message = self.health.off_policy(
            float(update.ratio_dev_at_start), compute_dtype(self._trainer, self.adapter.dtype), self.iteration
        )
        if message is not None:
            self._warned_off_policy = True
            warnings.warn(message, UserWarning, stacklevel=2)

    def _log_step(
        self,
        rewards: Tensor,
        tree: RolloutTree,
        keep: Tensor,
        advantages: Tensor,
        update: Update,
        num_prompts: int,
        laps: dict[str, float],
        spent: Compute,
    ) -> None:
        metrics = step_metrics(
            rewards,
            tree,
            keep,
            advantages,
            update,
            self.fault_ledger.counts,
            laps,
            self.iteration,
            spent,
            self.compute_spent,
            self.compute_cost,
        )
        self.log_dict(metrics.shown, prog_bar=True, batch_size=num_prompts)
        self.log_dict({**metrics.logged, "optimizer_steps": float(self.trainer.global_step)}, batch_size=num_prompts)

    def _sum_over_ranks(self, values: list[int | bool]) -> list[int]:
        """``values`` summed over the data-parallel ranks (one all-reduce; none on one process)."""
        if self.trainer.world_size == 1:
            return [int(v) for v in values]
        flags = torch.tensor([float(v) for v in values], device=self.device)  # [K]
        total = self.trainer.strategy.reduce(flags, reduce_op="sum")  # [K]
        return [int(v) for v in total.round().tolist()]

    def _any_rank(self, decision: bool) -> bool:
        """True on every rank if ``decision`` is true on any of them."""
        if self.trainer.world_size == 1:
            return decision
        return self.trainer.strategy.reduce_boolean_decision(decision, all=False)

    # ------------------------------------------------------------------------ memory
    def _guard_memory(self, spec: TreeSpec, cond: Cond, noise: Tensor, num_prompts: int) -> None:
        """The memory guard at the first training step, unless it ran before the data."""
        if not self.rollout_guard.checked:
            self.rollout_guard.check(
                self.adapter, spec, cond, noise, num_prompts, processes=self._node_processes(), any_rank=self._any_rank
            )
        if not self.training_guard.checked:
            self.training_guard.check(
                self.adapter,
                spec,
                cond,
                noise,
                num_prompts,
                optimizer=self._optimizer(),
                micro_batches=self._micro_batches(spec, num_prompts),
                processes=self._node_processes(),
                any_rank=self._any_rank,
            )

    def _micro_batches(self, spec: TreeSpec, num_prompts: int) -> int:
        """Micro-batches of one inner epoch when pruning keeps every edge of ``num_prompts`` prompts'
        trees on each rank (what the training guard sizes the largest micro-batch by)."""
        if self.edges_per_update is None:
            return self.minibatches * self.accumulate
        return max(1, math.ceil(num_prompts * spec.num_edges() / self.edges_per_update)) * self.accumulate

    def _optimizer(self) -> torch.optim.Optimizer | None:
        """The raw optimizer (its state yet to be allocated is part of the training's memory)."""
        optimizers = self.trainer.optimizers if self._trainer is not None else []
        return optimizers[0] if optimizers else None

    def _node_processes(self) -> int:
        """The processes of this node, which share its memory."""
        return max(self.trainer.num_devices, 1)

    # ------------------------------------------------------------------------ fit start
    def on_fit_start(self) -> None:
        self._sync_data_stream()
        if self.reuse_rollout_forward:
            check_reuse(processes=self.trainer.world_size)
        check_unused_parameters(self.adapter, getattr(self.trainer.strategy, "model", None))
        if self.prompt_cache.settings.pre_encode:
            self.prompt_cache.pre_encode_data(self.adapter, self._datamodule())
        spec = self.tree.at(self.iteration, self.seed)
        self.rollout_guard.before_data(
            self.adapter, self._datamodule(), spec, processes=self._node_processes(), any_rank=self._any_rank
        )
        with self.trainer.precision_plugin.train_step_context():  # the probe's dtypes: the training step's
            self.training_guard.before_data(
                self.adapter,
                self._datamodule(),
                spec,
                optimizer=self._optimizer(),
                micro_batches=lambda prompts: self._micro_batches(spec, prompts),
                processes=self._node_processes(),
                any_rank=self._any_rank,
            )

    def _datamodule(self) -> Any:
        return getattr(self._trainer, "datamodule", None) if self._trainer is not None else None

    def _sync_data_stream(self) -> None:
        """Start the prompt stream where the module is (0, or the resumed iteration)."""
        datamodule = self._datamodule()
        if datamodule is not None and hasattr(datamodule, "start_index"):
            datamodule.start_index = self.iteration
