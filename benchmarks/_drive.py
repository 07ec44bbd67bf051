"""What the benchmarks run: the training step of ``fit``, on one process over a plain torch optimizer.

:func:`build_algorithm` gets :class:`~lit_treegrpo.training.algorithm.TreeGRPO` from ``TreeGRPOModule``'s own
constructor (the module's options, its defaults for the rest), and :func:`run_step` runs one ``TreeGRPO.step`` as the
module's ``training_step`` does: the memory guard at the first rollout, the pruning a ``PruningSchedule`` would put in
force, the fault ledger closed after the step, each phase timed. :class:`PeakMemory` is the memory figure every
benchmark reports; :func:`random_reward` scores leaves at random (a real reward model costs every method alike per
leaf, so the benchmarks leave it out).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from _measure import peak_rss_mb, reset_peak_rss
from torch import Tensor

from lit_treegrpo.core.pruning import PruningConfig, PruningPlan
from lit_treegrpo.core.samples import GrownTree
from lit_treegrpo.core.spec import TreeSpec
from lit_treegrpo.rewards.base import RewardModel
from lit_treegrpo.rewards.video import VideoRewardModel
from lit_treegrpo.training.accelerator import fused_on_cuda
from lit_treegrpo.training.algorithm import TreeGRPO
from lit_treegrpo.training.faults import StepPlan
from lit_treegrpo.training.step_log import PhaseTimer, Update

#: a fit without a ``PruningSchedule`` callback: every edge trains
NO_SCHEDULE = PruningPlan()


class OneProcess:
    """The rank reductions (``training.algorithm.Ranks``) of a single process: the values themselves."""

    world_size = 1

    def sum(self, values: list[int | bool]) -> list[int]:
        return [int(v) for v in values]

    def any(self, decision: bool) -> bool:
        return decision

    def max(self, values: list[int]) -> list[int]:
        return list(values)


class TorchOptimization:
    """:class:`~lit_treegrpo.training.algorithm.Optimization` over a torch optimizer on one process (nothing to
    synchronise, so ``toggle`` does nothing), as the module's manual optimization steps it."""

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: Any = None) -> None:
        self.optimizer, self.scheduler = optimizer, scheduler

    def parameters(self) -> list[Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def toggle(self, sync: bool) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def clip(self, max_norm: float) -> None:
        torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm)

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def scheduler_step(self) -> None:
        if self.scheduler is not None:
            self.scheduler.step()


def adamw(adapter: Any, lr: float, weight_decay: float = 1e-4, *, fused: bool = True) -> torch.optim.AdamW:
    """AdamW over the adapter's trainable parameters, fused on CUDA as ``configure_optimizers`` makes it
    (``fused`` false keeps torch's default implementation)."""
    optimizer = torch.optim.AdamW(adapter.trainable_parameters(), lr=lr, weight_decay=weight_decay)
    return fused_on_cuda(optimizer, adapter.device) if fused else optimizer


def build_algorithm(adapter: Any, reward: RewardModel, tree: TreeSpec, **module_options: Any) -> TreeGRPO:
    """The TreeGRPO that ``fit`` trains for these ``TreeGRPOModule`` options (``advantage``, ``loss``,
    ``minibatches``, ``faults``, ``memory_guard``...): the module's own construction, so nothing is restated."""
    from lit_treegrpo.training.module import TreeGRPOModule

    return TreeGRPOModule(adapter, reward, tree, validate_at_start=False, **module_options).algorithm


@dataclass(frozen=True)
class StepResult:
    """One training step: what ``TreeGRPO.step`` returned and the seconds of its phases."""

    grown: GrownTree
    plan: StepPlan
    update: Update
    seconds: dict[str, float]
    """phase -> seconds: ``rollout``, ``reward`` (decode and score), ``advantages`` (and pruning), ``train``"""

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    @property
    def trained_forwards(self) -> int:
        return self.update.compute.trained


def run_step(
    algorithm: TreeGRPO,
    optimization: TorchOptimization,
    prompts: list[str],
    *,
    iteration: int,
    pruning: PruningPlan = NO_SCHEDULE,
    autocast: torch.dtype | None = None,
) -> StepResult:
    """Training iteration ``iteration`` on ``prompts``, as ``TreeGRPOModule.training_step`` runs it on one process;
    ``autocast``: the compute dtype of ``--trainer.precision bf16-mixed`` (float32 weights under autocast)."""
    adapter = algorithm.adapter
    timer = PhaseTimer(adapter.device)
    precision = torch.autocast(adapter.device.type, dtype=autocast) if autocast else contextlib.nullcontext()
    with precision:
        grown, plan, update = algorithm.step(
            prompts,
            iteration=iteration,
            first_position=iteration * len(prompts),
            pruning=pruning_at(pruning, algorithm, iteration),
            optimization=lambda: optimization,
            ranks=OneProcess(),
            timer=timer,
            before_rollout=lambda spec, cond, noise: guard_memory(algorithm, optimization, spec, cond, noise, prompts),
        )
    timer.lap("train")
    algorithm.faults.end_step(plan, update.steps, update.fault, iteration)
    return StepResult(grown, plan, update, dict(timer.laps))


def pruning_at(plan: PruningPlan, algorithm: TreeGRPO, iteration: int) -> PruningConfig:
    """The pruning a ``PruningSchedule`` callback of ``plan``'s options puts in force at ``iteration`` (its rule)."""
    spec = algorithm.tree_at(iteration)
    stochastic = [t for t in range(spec.num_steps) if spec.is_stochastic(t)]
    return plan.at(iteration, None, stochastic, algorithm.seed)


def guard_memory(
    algorithm: TreeGRPO, optimization: TorchOptimization, spec: TreeSpec, cond: Any, noise: Tensor, prompts: list[str]
) -> None:
    """The module's memory guard before the first rollout (a fit without a datamodule checks there), one process."""
    memory = algorithm.memory
    if memory.checked:
        return
    memory.check(
        algorithm.adapter,
        spec,
        cond,
        noise,
        len(prompts),
        max_batch=algorithm.rollout_limits.max_batch,
        micro_batches=algorithm.update_settings.micro_batches(spec, len(prompts)),
        optimizer=optimization.optimizer,
        processes=1,
        any_rank=OneProcess().any,
    )


class PeakMemory:
    """The peak memory since :meth:`reset`: on CUDA the most bytes torch allocated, elsewhere this process's peak
    resident set (Linux's VmHWM, reset through /proc/self/clear_refs; where that cannot be reset, the peak since the
    process started, which :attr:`kind` then says)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.kind = "peak allocated" if device.type == "cuda" else "peak RSS"

    def reset(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif not reset_peak_rss():
            self.kind = "peak RSS since the process started"
        return self

    def mb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 1e6
        return peak_rss_mb()


class RandomReward(RewardModel):
    """Uniform random scores, one per image, from its own seeded generator."""

    name = "random"
    uses_prompt = False

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)
        self.freeze()

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        return torch.rand(images.shape[0], generator=self.generator).to(images.device)  # [B]


class RandomVideoReward(RandomReward, VideoRewardModel):
    """:class:`RandomReward` of videos [B, F, 3, H, W] (a video adapter needs a video reward)."""


def random_reward(video: bool, seed: int = 0) -> RewardModel:
    return RandomVideoReward(seed) if video else RandomReward(seed)
