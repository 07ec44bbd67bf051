"""TreeGRPOModule: one training step = grow the tree, score the leaves, back up advantages, prune,
and run clipped policy-gradient updates on the kept edges (manual optimization).

Every method of the papers is a configuration of this one module (see configs/): flat GRPO
(DanceGRPO, Flow-GRPO) is a tree with ``num_trees = G`` chains, MixGRPO adds an SDE window,
TreeGRPO branches inside a window, BranchGRPO splits at fixed steps with fusion advantages and
pruning. The algorithm itself lives in :mod:`lit_treegrpo.core`; this file is the Lightning glue.

Randomness is a pure function of ``(seed, iteration, global prompt position)``: each prompt's
root noise and SDE noise come from its own generator, so a resumed run continues exactly and a
data-parallel run samples what one process with the same global batch samples.

Faults (:class:`FaultPolicy`): NaN / inf rewards, a reward call that raises, a non-finite loss or
gradient either stop the run with a message naming them (``error``) or are skipped and counted
(``skip``). Decisions that change the number of backward passes or optimizer steps are taken
together by all data-parallel ranks, so that no collective waits for a rank that skipped.
Before the first batch is drawn, :class:`MemoryGuard` refuses a tree that cannot fit in memory.
"""

from __future__ import annotations

import math
import time
import warnings
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from .core.advantages import tree_advantages
from .core.loss import ClippedPolicyLoss
from .core.memory import available_memory, cond_row_bytes, format_bytes, rollout_memory
from .core.pruning import PruningConfig, prune
from .core.rollout import RolloutTree, recompute_log_probs, rollout, source_minibatches
from .core.spec import TreeSpec
from .data import PromptBatch
from .errors import first_line
from .models.base import Cond, DiffusionAdapter
from .models.flow import FlowMatchingAdapter
from .rewards import RewardModel, build_rewards
from .settings import AdvantageSettings, FaultPolicy, MemoryGuard, check_settings

_MIX = 1_000_003  # odd multiplier mixing (seed, iteration, position) into one generator seed

# Both are by design here: adapters keep every submodule in eval mode (no dropout in the policy),
# and the prompt stream is a pure function of the step, with nothing for loader workers to do.
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode at the start of training")
warnings.filterwarnings("ignore", message=r".*does not have many workers which may be a bottleneck")
# Lightning's own use of a torch API it has not caught up with; nothing a user can act on
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")


class FaultWarning(RuntimeWarning):
    """A fault that the ``skip`` policy skipped (the message says what and where)."""


class FaultLimitError(RuntimeError):
    """Too many consecutive training steps were skipped because of faults."""


class RolloutMemoryError(ValueError):
    """The memory guard refused a tree that cannot fit (a configuration error)."""


FAULT_COUNTERS = ("skipped_groups", "skipped_steps", "skipped_updates", "consecutive", "zero_std_groups")


class TreeGRPOModule(LightningModule):
    """Tree-structured GRPO on a diffusion adapter.

    Args:
        adapter: the model family (``lit_treegrpo.models``): SD15Adapter, SD3Adapter, a tiny one...
        reward: what scores the decoded images against their prompts: a registered name
            (``hps``, ``image_reward``, ``pickscore``, ``clip_score``, ``aesthetic``,
            ``jpeg_compressibility``, ``jpeg_incompressibility``), a mapping name -> weight for a
            MultiReward (normalised per prompt, then weighted, as TreeGRPO), or a RewardModel.
        tree: the rollout tree per prompt (``configs/trees/*.yaml`` hold every method's).
        advantage: advantage estimator settings.
        loss: the clipped policy loss (clip range, advantage clip, KL weight, aggregation).
        pruning: edge pruning; a ``PruningSchedule`` callback replaces it per step.
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
        seed: seeds every rollout, together with the iteration and the prompt's position.
        shared_noise: give all ``num_trees`` roots of a prompt the same initial noise (DanceGRPO).
        val_seed: seed of the deterministic validation / test / predict samples.
        val_samples: samples per validation / test prompt (seeds ``val_seed``, ``val_seed + 1``,
            ...); with two or more, RewardMetrics also logs their within-prompt diversity.
        reward_kwargs: loader arguments per reward name, e.g. ``{hps: {checkpoint: v2.0}}``.
        faults: what to do with NaN / inf rewards, a failing reward call, or a non-finite loss or
            gradient: stop (``error``, the default) or skip and count (``skip``).
        memory_guard: before the first rollout, refuse a tree whose rollout cannot fit in memory.
    """

    def __init__(
        self,
        adapter: DiffusionAdapter,
        reward: RewardModel | str | dict[str, float],
        tree: TreeSpec,
        advantage: AdvantageSettings = AdvantageSettings(),
        loss: ClippedPolicyLoss | None = None,
        pruning: PruningConfig = PruningConfig(),
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
        minibatches: int = 1,
        edges_per_update: int | None = None,
        accumulate: int = 1,
        inner_epochs: int = 1,
        grad_clip: float | None = 1.0,
        seed: int = 0,
        shared_noise: bool = False,
        val_seed: int = 1234,
        val_samples: int = 1,
        reward_kwargs: dict[str, dict[str, Any]] | None = None,
        faults: FaultPolicy = FaultPolicy(),
        memory_guard: MemoryGuard = MemoryGuard(),
    ) -> None:
        super().__init__()
        check_settings(
            tree,
            minibatches=minibatches,
            accumulate=accumulate,
            inner_epochs=inner_epochs,
            grad_clip=grad_clip,
            val_samples=val_samples,
            edges_per_update=edges_per_update,
            adapter_num_steps=adapter.num_steps,
        )
        self.adapter = adapter
        self.reward = build_rewards(reward, reward_kwargs or {})
        self.tree = tree
        self.advantage = advantage
        self.loss_fn = loss if loss is not None else ClippedPolicyLoss()
        if self.loss_fn.kl_beta > 0 and adapter.lora is None:
            raise ValueError("loss.kl_beta > 0 needs the adapter's lora (the reference is LoRA disabled)")
        if self.loss_fn.kl_beta > 0 and self.loss_fn.kl_form == "flow_grpo" and not isinstance(adapter, FlowMatchingAdapter):
            raise ValueError(
                f"loss.kl_form flow_grpo needs a flow-matching adapter (its step size |dt|); "
                f"{type(adapter).__name__} is not one: use kl_form exact"
            )
        self.pruning = pruning
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.minibatches = minibatches
        self.edges_per_update = edges_per_update
        self.accumulate = accumulate
        self.inner_epochs = inner_epochs
        self.grad_clip = grad_clip
        self.seed = seed
        self.shared_noise = shared_noise
        self.val_seed = val_seed
        self.val_samples = val_samples
        self.faults = faults
        self.memory_guard = memory_guard
        self.fault_counts = dict.fromkeys(FAULT_COUNTERS, 0)  # restored from checkpoints
        self._memory_checked = False  # once per fit, before the first rollout
        self._warned_nothing_kept = False  # pruning that keeps no edge is warned about once
        self.iteration = 0  # completed training steps; restored from checkpoints
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints hold the trainable weights only

    # ------------------------------------------------------------------------ sharding
    def configure_model(self) -> None:
        """FSDP2 under ``ModelParallelStrategy``: shard the denoiser's blocks, then the denoiser,
        over the data-parallel mesh (frozen encoders and the VAE stay replicated; each rank keeps
        whole prompt trees). Other strategies need nothing here."""
        from lightning.pytorch.strategies import ModelParallelStrategy

        if not isinstance(self.trainer.strategy, ModelParallelStrategy):
            return
        if self.trainer.strategy._save_distributed_checkpoint:
            raise ValueError(
                "ModelParallelStrategy(save_distributed_checkpoint=True) writes a sharded checkpoint of "
                "every weight, which this module's trainable-only checkpoints cannot resume from; set "
                "trainer.strategy.init_args.save_distributed_checkpoint: false"
            )
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        denoiser = self.adapter.denoiser
        for blocks in ("transformer_blocks", "down_blocks", "up_blocks"):
            for block in getattr(denoiser, blocks, []):
                fully_shard(block, mesh=mesh)
        fully_shard(denoiser, mesh=mesh)

    # ------------------------------------------------------------------------ optimisation
    def configure_optimizers(self) -> Any:
        params = self.adapter.trainable_parameters()
        if self.optimizer_factory is None:
            optimizer = torch.optim.AdamW(params, lr=1e-5, weight_decay=1e-4)
        else:
            optimizer = self.optimizer_factory(params)
        if self.lr_scheduler_factory is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": self.lr_scheduler_factory(optimizer)}

    # ------------------------------------------------------------------------ randomness
    def _generators(self, stream: int, first_position: int, count: int) -> list[torch.Generator]:
        """One generator per prompt, seeded by (seed, stream, iteration, global position)."""
        base = ((self.seed * _MIX + stream) * _MIX + self.iteration) * _MIX
        device = self.adapter.device
        return [torch.Generator(device).manual_seed((base + first_position + i) % 2**63) for i in range(count)]

    def _first_position(self, batch: PromptBatch) -> int:
        """Global stream position of this rank's first prompt (see PromptDataModule)."""
        per_rank = len(batch.prompts)
        return batch.index * per_rank * self.trainer.world_size + self.trainer.global_rank * per_rank

    def _root_noise(self, gens: list[torch.Generator], num_trees: int) -> Tensor:
        per_prompt = 1 if self.shared_noise else num_trees
        noise = torch.cat([self.adapter.initial_noise(per_prompt, g) for g in gens])  # [P * n, *S]
        return noise.repeat_interleave(num_trees, dim=0) if self.shared_noise else noise

    # ------------------------------------------------------------------------ scoring
    def _score(self, images: Tensor, prompts: list[str]) -> tuple[Tensor, dict[str, Tensor]]:
        """Total reward [L] float32 and its components (empty for a single reward).

        Under the ``error`` policy a NaN / inf score raises (naming the reward and the prompts);
        under ``skip`` it comes back as is, and the caller drops the prompts it belongs to.
        """
        scores = self.reward.score(images, prompts, check=self.faults.nonfinite == "error")
        return scores.total.float(), {k: v.float() for k, v in scores.components.items()}

    def _score_or_skip(self, images: Tensor, prompts: list[str]) -> tuple[Tensor, dict[str, Tensor], str | None]:
        """:meth:`_score`; under ``skip`` a reward call that raises gives NaN rewards and the
        exception's one-line message as the third value (``None`` when it ran)."""
        if self.faults.nonfinite == "error":
            return (*self._score(images, prompts), None)
        try:
            return (*self._score(images, prompts), None)
        except Exception as err:  # a reward model may fail in any way (a remote API, a CUDA error)
            cause = f"the reward raised {type(err).__name__}: {first_line(err)}"
            warnings.warn(
                f"iteration {self.iteration}: {cause}; skipping this training step "
                f"(faults.nonfinite=skip)",
                FaultWarning,
                stacklevel=2,
            )
            return torch.full((len(prompts),), float("nan"), device=images.device), {}, cause

    # ------------------------------------------------------------------------ training
    def training_step(self, batch: PromptBatch, batch_idx: int) -> dict[str, Any]:
        if batch.index != self.iteration:
            raise RuntimeError(
                f"data stream at batch {batch.index} but the module at iteration {self.iteration}; "
                "resume through the Trainer (--ckpt_path) so both restart together"
            )
        timer = _Timer(self.adapter.device)
        prompts = batch.prompts
        P = len(prompts)
        spec = self.tree.at(self.iteration)
        first = self._first_position(batch)
        gens = self._generators(0, first, P)
        cond = self.adapter.encode_prompts(prompts)
        noise = self._root_noise(gens, spec.num_trees)  # [P * num_trees, *S]
        if not self._memory_checked:
            self._check_memory(spec, cond, noise, P)
            self._memory_checked = True
        tree = rollout(self.adapter.predict, self.adapter.step, spec, cond, noise, generator=gens)
        t_rollout = timer.lap()

        leaf_prompts = [prompts[i] for i in tree.leaf_prompt.tolist()]
        images = self.adapter.decode(tree.leaf_latents)  # [L, 3, H, W]
        rewards, components, failure = self._score_or_skip(images, leaf_prompts)
        t_reward = timer.lap()

        finite = torch.isfinite(rewards)  # [L]
        bad = torch.zeros(P, dtype=torch.bool, device=rewards.device)  # [P] prompts left out
        train_rewards = rewards  # under ``error`` tree_advantages refuses NaN, naming the leaves
        if self.faults.nonfinite == "skip":
            # prompts with a NaN / inf leaf reward are dropped; normalisation is per prompt, so
            # finite stand-ins (0) for their rewards leave every other prompt's advantages as they are
            bad[tree.leaf_prompt[~finite]] = True
            train_rewards = torch.where(bad[tree.leaf_prompt], torch.zeros_like(rewards), rewards)  # [L]
        advantages = tree_advantages(
            train_rewards,
            tree.edge_parent,
            tree.leaf_edge,
            tree.leaf_prompt,
            method=self.advantage.method,
            edge_old_log_prob=tree.edge_old_log_prob,
            beta=self.advantage.beta,
            clip=self.advantage.clip,
            std_scope=self.advantage.std_scope,
        )
        keep = prune(tree, advantages, self.pruning) & ~bad[tree.edge_prompt]  # [E]
        t_backup = timer.lap()
        zero_std = _constant_groups(train_rewards, tree.leaf_prompt, P) & ~bad  # [P]
        dropped = 0 if failure is not None else int(bad.sum())
        names: list[str] = []
        if dropped:
            names = sorted({prompts[i] for i in bad.nonzero().flatten().tolist()})
            warnings.warn(
                f"iteration {self.iteration}: non-finite rewards for {dropped} of {P} prompts "
                f"{names[:8]}; these prompts are left out of this step (faults.nonfinite=skip)",
                FaultWarning,
                stacklevel=2,
            )
        # one collective for the step: whether anything trains on any rank, and the step's faults
        failed, kept, dropped_all, zero_std_all = self._sum_over_ranks(
            [failure is not None, bool(keep.any()), dropped, int(zero_std.sum())]
        )
        self.fault_counts["skipped_groups"] += dropped_all
        self.fault_counts["zero_std_groups"] += zero_std_all
        cause = failure or (f"non-finite rewards for prompts {names[:8]}" if dropped else None)
        faulty = bool(failed or dropped_all)  # the same on every rank
        if not kept and not failed and not dropped_all and not self._warned_nothing_kept:
            self._warned_nothing_kept = True
            warnings.warn(
                f"iteration {self.iteration}: pruning kept none of the {tree.num_edges} edges, so this "
                f"step trains nothing ({self.pruning}); check --model.pruning or the PruningSchedule "
                "callback (warned once)",
                UserWarning,
                stacklevel=2,
            )
        if failed or (not kept and dropped_all):  # a fault left nothing to train, on every rank
            stats = None
            updated = False
        else:
            stats = self._train_on(tree, cond, advantages, keep, first)
            updated = stats["updates"] > 0
            faulty = faulty or stats["cause"] is not None
            cause = stats["cause"] or cause
        t_train = timer.lap()
        self._count_step(updated, faulty, cause or "a fault on another data-parallel rank")

        self.iteration += 1
        self._log_step(rewards[finite], tree, keep, advantages, stats, P, (t_rollout, t_reward, t_backup, t_train))
        out = {"rewards": rewards.detach(), "reward_components": components, "leaf_prompts": leaf_prompts,
               "images": images}  # fmt: skip
        if bad.any():  # the callbacks see only the prompts that trained (no copy of the images otherwise)
            kept_leaves = ~bad[tree.leaf_prompt]  # [L]
            out = {
                "rewards": out["rewards"][kept_leaves],
                "reward_components": {k: v[kept_leaves] for k, v in components.items()},
                "leaf_prompts": [p for p, k in zip(leaf_prompts, kept_leaves.tolist()) if k],
                "images": images[kept_leaves],
            }
        return out

    def _count_step(self, updated: bool, faulty: bool, cause: str) -> None:
        """Count a step that made no update because of a fault; stop when
        ``faults.max_consecutive_skips`` of them come in a row. ``updated`` and ``faulty`` are the
        same on every rank, so all ranks count alike and stop together."""
        if updated:
            self.fault_counts["consecutive"] = 0
            return
        if not faulty:  # nothing trained without a fault (e.g. pruning kept no edge)
            return
        self.fault_counts["skipped_steps"] += 1
        self.fault_counts["consecutive"] += 1
        if self.fault_counts["consecutive"] >= self.faults.max_consecutive_skips:
            raise FaultLimitError(
                f"{self.fault_counts['consecutive']} training steps in a row were skipped "
                f"(faults.max_consecutive_skips={self.faults.max_consecutive_skips}), up to iteration "
                f"{self.iteration}; last cause: {cause}; fix the reward or lower the learning rate, "
                "or resume from the last checkpoint with --ckpt_path last"
            )

    def _log_step(
        self,
        finite_rewards: Tensor,
        tree: RolloutTree,
        keep: Tensor,
        advantages: Tensor,
        stats: dict[str, Any] | None,
        B: int,
        times: tuple[float, float, float, float],
    ) -> None:
        t_rollout, t_reward, t_backup, t_train = times
        if finite_rewards.numel():
            self.log("reward", finite_rewards.mean(), prog_bar=True, batch_size=B)
        metrics: dict[str, Any] = {
            "train/edges_kept": keep.float().sum(),
            "train/edges": float(tree.num_edges),
            "adv/mean": advantages.mean() if advantages.numel() else 0.0,
            "adv/std": advantages.std(unbiased=False) if advantages.numel() else 0.0,
            "adv/abs_max": advantages.abs().max() if advantages.numel() else 0.0,
            "nfe/rollout": float(tree.nfe),
            "time/rollout_s": t_rollout,
            "time/reward_s": t_reward,
            "time/advantages_s": t_backup,
            "time/train_s": t_train,
            "iteration": float(self.iteration),
        }
        metrics.update({f"faults/{name}": float(value) for name, value in self.fault_counts.items()})
        if stats is not None:
            self.log("loss", stats["loss"], prog_bar=True, batch_size=B)
            metrics.update(
                {
                    "train/clip_frac": stats["clip_frac"],
                    "train/approx_kl": stats["approx_kl"],
                    "train/ratio_mean": stats["ratio_mean"],
                    "train/kl": stats["kl"],
                    "train/policy_loss": stats["policy_loss"],
                    "train/forwards": float(stats["forwards"]),
                    "nfe/train": float(stats["forwards"]),
                }
            )
        self.log_dict(metrics, batch_size=B)

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

    def _train_on(
        self, tree: RolloutTree, cond: Cond, advantages: Tensor, keep: Tensor, first_position: int
    ) -> dict[str, Any]:
        """Clipped policy-gradient updates over the kept edges; returns averaged statistics, the
        number of optimizer steps taken (``updates``) and the last fault (``cause``, or None)."""
        optimizer = self.optimizers()
        shuffle = torch.Generator().manual_seed((self.seed * _MIX + self.iteration) * _MIX + first_position + 1)
        sums: dict[str, Tensor] = {}
        micro = 0
        forwards = 0
        updates = 0
        cause = None
        bad_loss: str | None = None  # the first non-finite loss of this accumulation window
        num_updates = self._updates_per_epoch(keep)
        for _ in range(self.inner_epochs):
            batches = source_minibatches(tree, keep, num_batches=num_updates * self.accumulate, generator=shuffle)
            for i, edges in enumerate(batches):
                last = (i + 1) % self.accumulate == 0
                with optimizer.toggle_model(sync_grad=last):
                    loss, out, n = self._edge_loss(tree, cond, advantages, edges)
                    # backpropagated even when it is not finite: every rank must run the same
                    # backward passes; the optimizer step below is what the check refuses
                    if bad_loss is None and not bool(torch.isfinite(loss)):
                        bad_loss = f"non-finite loss {loss.item()} at iteration {self.iteration}, micro-batch {i}"
                    self.manual_backward(loss / self.accumulate)
                forwards += n
                micro += 1
                for key, value in out.items():
                    sums[key] = sums.get(key, 0.0) + value
                if last:
                    if self.grad_clip is not None:
                        self.clip_gradients(optimizer, gradient_clip_val=self.grad_clip, gradient_clip_algorithm="norm")
                    problem = bad_loss or (
                        None if self._grads_finite() else f"non-finite gradient at iteration {self.iteration}"
                    )
                    bad_loss = None
                    if self._any_rank(problem is not None):
                        problem = problem or f"a non-finite loss or gradient on another rank at iteration {self.iteration}"
                        optimizer.zero_grad(set_to_none=True)
                        if self.faults.nonfinite == "error":
                            raise FloatingPointError(
                                f"{problem}; no optimizer step was taken (set --model.faults.nonfinite skip "
                                "to skip such steps)"
                            )
                        self.fault_counts["skipped_updates"] += 1
                        cause = problem
                        warnings.warn(f"{problem}; optimizer step skipped (faults.nonfinite=skip)", FaultWarning, stacklevel=2)
                        continue
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    updates += 1
        scheduler = self.lr_schedulers()
        if scheduler is not None and updates:
            scheduler.step()
        stats = {k: v / max(micro, 1) for k, v in sums.items()}
        stats["forwards"] = forwards
        stats["updates"] = updates
        stats["cause"] = cause
        return stats

    def _updates_per_epoch(self, keep: Tensor) -> int:
        """Optimizer steps per pass over the kept edges: ``minibatches``, or one per
        ``edges_per_update`` kept edges (the same count on every rank)."""
        if self.edges_per_update is None:
            return self.minibatches
        (kept,) = self._sum_over_ranks([int(keep.sum())])
        per_rank = kept / max(self.trainer.world_size, 1)
        return max(1, math.ceil(per_rank / self.edges_per_update))

    def _edge_loss(
        self, tree: RolloutTree, cond: Cond, advantages: Tensor, edges: Tensor
    ) -> tuple[Tensor, dict[str, Tensor], int]:
        """Loss of one micro-batch of edges (a zero loss on the parameters if it is empty, so
        every data-parallel rank runs the same backward passes)."""
        if edges.numel() == 0:
            zero = sum(p.sum() for p in self.adapter.trainable_parameters()) * 0.0
            return zero, {k: torch.zeros((), device=zero.device) for k in _LOSS_STATS}, 0
        new = recompute_log_probs(self.adapter.predict, self.adapter.step, tree, edges, cond)
        ref_mean = None
        forwards = new.num_forwards
        if self.loss_fn.kl_beta > 0:
            with torch.no_grad(), self.adapter.reference():
                ref = recompute_log_probs(self.adapter.predict, self.adapter.step, tree, edges, cond)
            ref_mean = ref.step.mean
            forwards += ref.num_forwards  # the reference's forwards are model evaluations too
        out = self.loss_fn(
            new.step.log_prob,
            tree.edge_old_log_prob[edges],
            advantages[edges],
            group=new.group,
            mean=new.step.mean,
            ref_mean=ref_mean,
            std=new.step.std,
            step_size=self._kl_step_size(tree.edge_step[edges]),
        )
        stats = {k: getattr(out, k).detach() for k in _LOSS_STATS}
        return out.loss, stats, forwards

    def _kl_step_size(self, step_index: Tensor) -> Tensor | None:
        """[B] |dt| of each edge's step, which only Flow-GRPO's KL form uses."""
        if self.loss_fn.kl_beta == 0 or self.loss_fn.kl_form != "flow_grpo":
            return None
        assert isinstance(self.adapter, FlowMatchingAdapter)  # checked in __init__
        return self.adapter.step_size(step_index)

    def _grads_finite(self) -> bool:
        """Whether every local gradient is finite (one device sync for all parameters)."""
        # FSDP2 gradients are DTensors: each rank checks its own shard
        grads = [
            p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            for p in self.adapter.trainable_parameters()
            if p.grad is not None
        ]
        return not grads or bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())

    # ------------------------------------------------------------------------ memory
    def _check_memory(self, spec: TreeSpec, cond: Cond, noise: Tensor, num_prompts: int) -> None:
        """Refuse a rollout whose recorded tensors cannot fit (see :class:`MemoryGuard`); every
        rank decides together, so none is left waiting in a collective."""
        guard = self.memory_guard
        if not guard.enabled:
            return
        estimate = rollout_memory(
            spec,
            num_prompts,
            tuple(noise.shape[1:]),
            noise.dtype,
            cond_bytes=cond_row_bytes(cond),
            cfg=self.adapter.do_cfg,
        )
        available, where = self._available_memory()
        if available is None:
            warnings.warn(
                f"memory guard: the available memory is {where}, so the rollout's estimated "
                f"{estimate.describe()} is not checked; give --model.memory_guard.available_gb",
                stacklevel=2,
            )
        limit = None if available is None else available * guard.fraction
        refuse = limit is not None and estimate.total > limit
        if not self._any_rank(refuse):
            return
        if not refuse:
            raise RolloutMemoryError("memory guard: another data-parallel rank cannot fit the rollout; see its message")
        raise RolloutMemoryError(
            f"memory guard: one rollout needs about {estimate.describe()} for {num_prompts} prompts x "
            f"{spec.num_leaves} leaves on this rank, but {format_bytes(available)} is available ({where}; "
            f"x {guard.fraction} = {format_bytes(limit)}); lower --data.batch_size, --model.tree.max_batch, "
            "the branching or num_trees, or set --model.memory_guard.enabled false to skip this check"
        )

    def _available_memory(self) -> tuple[int | None, str]:
        """(bytes available to this rank, where the number comes from)."""
        if self.memory_guard.available_gb is not None:
            return int(self.memory_guard.available_gb * 1e9), "--model.memory_guard.available_gb"
        # the processes of this node share its memory
        return available_memory(self.adapter.device, processes=max(self.trainer.num_devices, 1))

    # ------------------------------------------------------------------------ sampling
    @torch.no_grad()
    def sample(self, prompts: list[str], seed: int) -> Tensor:
        """Deterministic (ODE) samples [P, 3, H, W] in [0, 1], one per prompt. Each prompt's noise
        depends on ``seed`` and the prompt's text only, so an image does not change with the batch
        it is in or the number of processes."""
        device = self.adapter.device
        gens = [torch.Generator(device).manual_seed(seed * _MIX + zlib.crc32(p.encode())) for p in prompts]
        cond = self.adapter.encode_prompts(prompts)
        noise = torch.cat([self.adapter.initial_noise(1, g) for g in gens])  # [P, *S]
        tree = rollout(self.adapter.predict, self.adapter.step, TreeSpec(self.adapter.num_steps), cond, noise)
        return self.adapter.decode(tree.leaf_latents)

    def _evaluate(self, batch: PromptBatch, prefix: str) -> dict[str, Any]:
        seeds = range(self.val_seed, self.val_seed + self.val_samples)
        images = torch.cat([self.sample(batch.prompts, seed) for seed in seeds])  # [S * P, 3, H, W]
        prompts = list(batch.prompts) * self.val_samples
        rewards, components = self._score(images, prompts)
        self.log(f"{prefix}/reward", rewards.mean(), prog_bar=prefix == "val", sync_dist=True, batch_size=len(prompts))
        return {"rewards": rewards, "reward_components": components, "leaf_prompts": prompts, "images": images}

    def validation_step(self, batch: PromptBatch, batch_idx: int) -> dict[str, Any]:
        return self._evaluate(batch, "val")

    def test_step(self, batch: PromptBatch, batch_idx: int) -> dict[str, Any]:
        return self._evaluate(batch, "test")

    def predict_step(self, batch: PromptBatch, batch_idx: int) -> list[str]:
        """Write one PNG per prompt under ``<default_root_dir>/predictions``; returns the paths."""
        from PIL import Image

        folder = Path(self.trainer.default_root_dir) / "predictions"
        folder.mkdir(parents=True, exist_ok=True)
        images = self.sample(batch.prompts, self.val_seed)
        pixels = (images.permute(0, 2, 3, 1) * 255).round().to(torch.uint8).cpu().numpy()
        paths = []
        for i, (prompt, array) in enumerate(zip(batch.prompts, pixels)):
            path = folder / f"{batch.index:05d}_{i:02d}_{_slug(prompt)}.png"
            Image.fromarray(array).save(path)
            paths.append(str(path))
        return paths

    # ------------------------------------------------------------------------ checkpoints
    def on_fit_start(self) -> None:
        self._memory_checked = False
        self._sync_data_stream()
        self._check_memory_before_data()

    def _check_memory_before_data(self) -> None:
        """The memory guard before the first batch is drawn (and before the sanity check's
        sampling): the prompts per rank come from the datamodule, the conditioning's size from one
        training prompt. Without a :class:`PromptDataModule` the check waits for the first step."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if not self.memory_guard.enabled or not hasattr(datamodule, "per_rank_batch_size"):
            return
        num_prompts = datamodule.per_rank_batch_size()
        train_prompts = datamodule.train_set.prompts
        device = self.adapter.device
        with torch.no_grad():
            cond = self.adapter.encode_prompts(train_prompts[:1])
            noise = self.adapter.initial_noise(1, torch.Generator(device).manual_seed(0))  # [1, *S]
        self._check_memory(self.tree.at(self.iteration), cond, noise, num_prompts)
        self._memory_checked = True

    def _sync_data_stream(self) -> None:
        """Start the prompt stream where the module is (0, or the resumed iteration)."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None and hasattr(datamodule, "start_index"):
            datamodule.start_index = self.iteration

    def _fingerprint(self) -> dict[str, Any]:
        return {
            "adapter": type(self.adapter).__name__,
            "num_steps": self.adapter.num_steps,
            "tree": asdict(self.tree),
            "trainable": sorted(n for n, p in self.named_parameters() if p.requires_grad),
        }

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainable = {n for n, p in self.named_parameters() if p.requires_grad}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}
        checkpoint["lit_treegrpo"] = {
            "iteration": self.iteration,
            "fingerprint": self._fingerprint(),
            "faults": dict(self.fault_counts),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get("lit_treegrpo")
        if saved is None:
            raise ValueError("this checkpoint was not written by TreeGRPOModule (no 'lit_treegrpo' entry)")
        mine = self._fingerprint()
        for key in ("adapter", "num_steps", "trainable"):
            if saved["fingerprint"][key] != mine[key]:
                raise ValueError(
                    f"the checkpoint's {key} differs from this run's configuration; resume with the "
                    f"configuration it was trained with"
                )
        # rebuilt, so that a checkpoint from before a TreeSpec field existed reads it at its default
        if asdict(TreeSpec.from_dict(saved["fingerprint"]["tree"])) != mine["tree"]:
            raise ValueError(
                f"the checkpoint was trained with tree {saved['fingerprint']['tree']}, this run has "
                f"{mine['tree']}; resume with the same --model.tree"
            )
        # (a sharded strategy loads the weights itself and hands over no "state_dict")
        missing = set(mine["trainable"]) - set(checkpoint.get("state_dict", mine["trainable"]))
        if missing:
            raise ValueError(f"the checkpoint lacks {len(missing)} trainable tensors, e.g. {sorted(missing)[:3]}")
        self.iteration = int(saved["iteration"])
        # checkpoints from before the fault counters existed start them at 0
        self.fault_counts = {**dict.fromkeys(FAULT_COUNTERS, 0), **saved.get("faults", {})}
        self._sync_data_stream()  # sharded strategies restore after on_fit_start


_LOSS_STATS = ("loss", "policy_loss", "kl", "ratio_mean", "clip_frac", "approx_kl")


class _Timer:
    """Wall-clock laps that wait for queued GPU work, so each phase is charged its own time."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.last = self._now()

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self) -> float:
        now = self._now()
        elapsed, self.last = now - self.last, now
        return elapsed


def _constant_groups(rewards: Tensor, leaf_prompt: Tensor, num_prompts: int) -> Tensor:
    """[P] bool: prompts whose leaves all got the same reward (their advantages are exactly 0)."""
    hi = rewards.new_full((num_prompts,), float("-inf")).scatter_reduce(0, leaf_prompt, rewards, reduce="amax")
    lo = rewards.new_full((num_prompts,), float("inf")).scatter_reduce(0, leaf_prompt, rewards, reduce="amin")
    return hi == lo


def _slug(text: str, length: int = 40) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower())[:length].strip("_") or "prompt"
