"""TreeGRPOModule: one training step = grow the tree, score the leaves, back up advantages, prune,
and run clipped policy-gradient updates on the kept edges (manual optimization).

Every method of the papers is a configuration of this one module (see configs/): flat GRPO
(DanceGRPO, Flow-GRPO) is a tree with ``num_trees = G`` chains, MixGRPO adds an SDE window,
TreeGRPO branches inside a window, BranchGRPO splits at fixed steps with fusion advantages and
pruning. The algorithm itself lives in :mod:`lit_treegrpo.core`; this file is the Lightning glue.

Randomness is a pure function of ``(seed, iteration, global prompt position)``: each prompt's
root noise and SDE noise come from its own generator, so a resumed run continues exactly and a
data-parallel run samples what one process with the same global batch samples.
"""

from __future__ import annotations

import time
import warnings
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from .core.advantages import METHODS, AdvantageMethod, tree_advantages
from .core.loss import ClippedPolicyLoss
from .core.pruning import PruningConfig, prune
from .core.rollout import RolloutTree, recompute_log_probs, rollout, source_minibatches
from .core.spec import TreeSpec
from .data import PromptBatch
from .models.base import Cond, DiffusionAdapter
from .rewards import MultiReward, RewardModel, build_reward

_MIX = 1_000_003  # odd multiplier mixing (seed, iteration, position) into one generator seed

# Both are by design here: adapters keep every submodule in eval mode (no dropout in the policy),
# and the prompt stream is a pure function of the step, with nothing for loader workers to do.
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode at the start of training")
warnings.filterwarnings("ignore", message=r".*does not have many workers which may be a bottleneck")


@dataclass(frozen=True)
class AdvantageSettings:
    """How leaf rewards become per-edge advantages (``lit_treegrpo.core.advantages``)."""

    method: AdvantageMethod = "mean"
    """``mean`` (TreeGRPO code), ``logprob_softmax`` (TreeGRPO paper), ``branch_fusion``
    (BranchGRPO) or ``parent_relative``."""
    beta: float = 1.0
    """Path-probability temperature of ``branch_fusion`` (0: uniform mean of leaf rewards)."""
    clip: float | None = None
    """Clamp advantages to ``[-clip, clip]`` before pruning (the loss clamps again at adv_clip)."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"advantage.method must be one of {', '.join(METHODS)}; got {self.method!r}")
        if self.clip is not None and self.clip <= 0:
            raise ValueError(f"advantage.clip must be > 0 or null, got {self.clip}")


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
        accumulate: int = 1,
        inner_epochs: int = 1,
        grad_clip: float | None = 1.0,
        seed: int = 0,
        shared_noise: bool = False,
        val_seed: int = 1234,
        val_samples: int = 1,
        reward_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        if tree.num_steps != adapter.num_steps:
            raise ValueError(
                f"tree.num_steps={tree.num_steps} but the adapter samples with num_steps="
                f"{adapter.num_steps}; set both to the same value"
            )
        for name, value in (("minibatches", minibatches), ("accumulate", accumulate), ("inner_epochs", inner_epochs),
                            ("val_samples", val_samples)):  # fmt: skip
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if grad_clip is not None and grad_clip <= 0:
            raise ValueError(f"grad_clip must be > 0 or null, got {grad_clip}")
        self.adapter = adapter
        self.reward = build_rewards(reward, reward_kwargs or {})
        self.tree = tree
        self.advantage = advantage
        self.loss_fn = loss if loss is not None else ClippedPolicyLoss()
        if self.loss_fn.kl_beta > 0 and adapter.lora is None:
            raise ValueError("loss.kl_beta > 0 needs the adapter's lora (the reference is LoRA disabled)")
        self.pruning = pruning
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.minibatches = minibatches
        self.accumulate = accumulate
        self.inner_epochs = inner_epochs
        self.grad_clip = grad_clip
        self.seed = seed
        self.shared_noise = shared_noise
        self.val_seed = val_seed
        self.val_samples = val_samples
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
        """Total reward [L] float32 and its components (empty for a single reward)."""
        if isinstance(self.reward, MultiReward):  # the total plus its named components
            scores = self.reward.score(images, prompts)
            return scores.total.float(), {k: v.float() for k, v in scores.components.items()}
        return self.reward(images, prompts).float(), {}

    # ------------------------------------------------------------------------ training
    def training_step(self, batch: PromptBatch, batch_idx: int) -> dict[str, Any]:
        if batch.index != self.iteration:
            raise RuntimeError(
                f"data stream at batch {batch.index} but the module at iteration {self.iteration}; "
                "resume through the Trainer (--ckpt_path) so both restart together"
            )
        timer = _Timer(self.adapter.device)
        prompts = batch.prompts
        spec = self.tree.at(self.iteration)
        first = self._first_position(batch)
        gens = self._generators(0, first, len(prompts))
        cond = self.adapter.encode_prompts(prompts)
        tree = rollout(
            self.adapter.predict,
            self.adapter.step,
            spec,
            cond,
            self._root_noise(gens, spec.num_trees),
            generator=gens,
        )
        t_rollout = timer.lap()

        leaf_prompts = [prompts[i] for i in tree.leaf_prompt.tolist()]
        images = self.adapter.decode(tree.leaf_latents)  # [L, 3, H, W]
        rewards, components = self._score(images, leaf_prompts)
        t_reward = timer.lap()

        advantages = tree_advantages(
            rewards,
            tree.edge_parent,
            tree.leaf_edge,
            tree.leaf_prompt,
            method=self.advantage.method,
            edge_old_log_prob=tree.edge_old_log_prob,
            beta=self.advantage.beta,
            clip=self.advantage.clip,
        )
        keep = prune(tree, advantages, self.pruning)
        t_backup = timer.lap()
        stats = self._train_on(tree, cond, advantages, keep, first)
        t_train = timer.lap()

        self.iteration += 1
        B = len(prompts)
        self.log_dict(
            {
                "reward": rewards.mean(),
                "loss": stats["loss"],
            },
            prog_bar=True,
            batch_size=B,
        )
        self.log_dict(
            {
                "train/clip_frac": stats["clip_frac"],
                "train/approx_kl": stats["approx_kl"],
                "train/ratio_mean": stats["ratio_mean"],
                "train/kl": stats["kl"],
                "train/policy_loss": stats["policy_loss"],
                "train/edges_kept": keep.float().sum(),
                "train/edges": float(tree.num_edges),
                "train/forwards": float(stats["forwards"]),
                "adv/mean": advantages.mean() if advantages.numel() else 0.0,
                "adv/std": advantages.std(unbiased=False) if advantages.numel() else 0.0,
                "adv/abs_max": advantages.abs().max() if advantages.numel() else 0.0,
                "nfe/rollout": float(tree.nfe),
                "nfe/train": float(stats["forwards"]),
                "time/rollout_s": t_rollout,
                "time/reward_s": t_reward,
                "time/advantages_s": t_backup,
                "time/train_s": t_train,
                "iteration": float(self.iteration),
            },
            batch_size=B,
        )
        return {"rewards": rewards.detach(), "reward_components": components, "leaf_prompts": leaf_prompts,
                "images": images}  # fmt: skip

    def _train_on(
        self, tree: RolloutTree, cond: Cond, advantages: Tensor, keep: Tensor, first_position: int
    ) -> dict[str, Any]:
        """Clipped policy-gradient updates over the kept edges; returns averaged statistics."""
        optimizer = self.optimizers()
        shuffle = torch.Generator().manual_seed((self.seed * _MIX + self.iteration) * _MIX + first_position + 1)
        sums: dict[str, Tensor] = {}
        micro = 0
        forwards = 0
        for _ in range(self.inner_epochs):
            batches = source_minibatches(tree, keep, num_batches=self.minibatches * self.accumulate, generator=shuffle)
            for i, edges in enumerate(batches):
                last = (i + 1) % self.accumulate == 0
                with optimizer.toggle_model(sync_grad=last):
                    loss, out, n = self._edge_loss(tree, cond, advantages, edges)
                    if not torch.isfinite(loss):
                        raise FloatingPointError(
                            f"non-finite loss {loss.item()} at iteration {self.iteration}, micro-batch {i}"
                        )
                    self.manual_backward(loss / self.accumulate)
                forwards += n
                micro += 1
                for key, value in out.items():
                    sums[key] = sums.get(key, 0.0) + value
                if last:
                    if self.grad_clip is not None:
                        self.clip_gradients(optimizer, gradient_clip_val=self.grad_clip, gradient_clip_algorithm="norm")
                    self._check_finite_grads()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()
        stats = {k: v / max(micro, 1) for k, v in sums.items()}
        stats["forwards"] = forwards
        return stats

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
        if self.loss_fn.kl_beta > 0:
            with torch.no_grad(), self.adapter.reference():
                ref_mean = recompute_log_probs(self.adapter.predict, self.adapter.step, tree, edges, cond).step.mean
        out = self.loss_fn(
            new.step.log_prob,
            tree.edge_old_log_prob[edges],
            advantages[edges],
            group=new.group,
            mean=new.step.mean,
            ref_mean=ref_mean,
            std=new.step.std,
        )
        stats = {k: getattr(out, k).detach() for k in _LOSS_STATS}
        return out.loss, stats, new.num_forwards

    def _check_finite_grads(self) -> None:
        """Refuse to step on NaN / inf gradients (one device sync for all parameters)."""
        # FSDP2 gradients are DTensors: each rank checks its own shard
        grads = [
            p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            for p in self.adapter.trainable_parameters()
            if p.grad is not None
        ]
        if grads and not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()):
            raise FloatingPointError(f"non-finite gradient at iteration {self.iteration}; no optimizer step was taken")

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
        self._sync_data_stream()

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
        checkpoint["lit_treegrpo"] = {"iteration": self.iteration, "fingerprint": self._fingerprint()}

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
        if saved["fingerprint"]["tree"] != mine["tree"]:
            raise ValueError(
                f"the checkpoint was trained with tree {saved['fingerprint']['tree']}, this run has "
                f"{mine['tree']}; resume with the same --model.tree"
            )
        # (a sharded strategy loads the weights itself and hands over no "state_dict")
        missing = set(mine["trainable"]) - set(checkpoint.get("state_dict", mine["trainable"]))
        if missing:
            raise ValueError(f"the checkpoint lacks {len(missing)} trainable tensors, e.g. {sorted(missing)[:3]}")
        self.iteration = int(saved["iteration"])
        self._sync_data_stream()  # sharded strategies restore after on_fit_start


def build_rewards(reward: RewardModel | str | dict[str, float], kwargs: dict[str, dict[str, Any]]) -> RewardModel:
    """A RewardModel from a name, a name -> weight mapping, or a ready model (validated early)."""
    if isinstance(reward, str):
        unknown = set(kwargs) - {reward}
        if unknown:
            raise ValueError(f"reward_kwargs names {sorted(unknown)}, which are not the reward {reward!r}")
        return build_reward(reward, **kwargs.get(reward, {}))
    if isinstance(reward, dict):
        if not reward:
            raise ValueError("reward: the name -> weight mapping is empty; name at least one reward")
        unknown = set(kwargs) - set(reward)
        if unknown:
            raise ValueError(f"reward_kwargs names {sorted(unknown)}, which are not among the rewards {sorted(reward)}")
        models = {name: build_reward(name, **kwargs.get(name, {})) for name in reward}
        return MultiReward(models, weights=dict(reward))
    if not isinstance(reward, RewardModel):
        raise TypeError(f"reward must be a name, a name -> weight mapping or a RewardModel, got {type(reward).__name__}")
    if kwargs:
        raise ValueError("reward_kwargs applies to rewards given by name; this reward is already built")
    return reward


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


def _slug(text: str, length: int = 40) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower())[:length].strip("_") or "prompt"
