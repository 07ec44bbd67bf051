"""What the Lightning layer's parts need from each other, declared instead of probed: the module as
the callbacks see it (:class:`Iterations`, :class:`PolicyModule`, :class:`PrunedModule`) and the datamodule as the module
sees it (:class:`PromptSource`). Pure typing, so that callbacks, module and data share it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from .pruning import PruningConfig
from .samples import GrownTree
from .spec import TreeSpec


@runtime_checkable
class Iterations(Protocol):
    """The training module as the progress, interrupt and checkpoint callbacks count it."""

    iteration: int  # completed training iterations; restored from checkpoints
    optimizer_steps_per_iteration: int | None  # when fixed (None: it follows the kept edges)


@runtime_checkable
class PolicyModule(Iterations, Protocol):
    """The training module as the drawing and averaging callbacks use it."""

    device: torch.device

    def trainable_parameters(self) -> list[nn.Parameter]: ...

    def sample(self, prompts: list[str], seed: int) -> Tensor:
        """Deterministic samples [P, 3, H, W] in [0, 1] of ``prompts`` from ``seed``."""
        ...

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        """The run's reward of ``images`` [N] (non-finite scores returned, not refused)."""
        ...

    def grow(self, prompts: list[str], generators: list[torch.Generator]) -> GrownTree:
        """The tree a training step of this iteration grows for ``prompts`` from ``generators``."""
        ...


@runtime_checkable
class PrunedModule(Protocol):
    """The training module as the ``PruningSchedule`` callback sets its pruning."""

    iteration: int
    seed: int  # the run's seed, added to the schedule's own
    pruning: PruningConfig  # in force for the iteration that runs next

    def tree_at(self, iteration: int) -> TreeSpec: ...


class PromptSet(Protocol):
    prompts: Sequence[str]


@runtime_checkable
class PromptSource(Protocol):
    """The datamodule as the training module uses it: where the stream starts, the prompts per rank,
    and the prompts a fit trains and validates on (the memory guard and the prompt cache read them)."""

    start_index: int  # global index of the first training batch; the module sets it on resume
    train_set: PromptSet
    val_set: PromptSet

    def per_rank_batch_size(self, world_size: int | None = None) -> int: ...
