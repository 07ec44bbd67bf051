"""What a step hands the callbacks: :class:`ScoredSamples`, the samples it drew and their rewards."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from torch import Tensor

#: the key of a training step's :class:`ScoredSamples` in the mapping Lightning requires
STEP_KEY = "samples"


class ScoredSamples(NamedTuple):
    """Samples and their rewards: a training step's leaves, or validation's / test's samples."""

    rewards: Tensor  # [N] float32, each sample's total reward
    reward_components: dict[str, Tensor]  # name -> [N] float32, a MultiReward's parts (else empty)
    prompts: list[str]  # [N] each sample's prompt
    images: Tensor | None = None  # [N, 3, H, W] in [0, 1] ([N, F, 3, H, W] videos); None: not kept

    def as_step_output(self) -> dict[str, ScoredSamples]:
        """What ``training_step`` returns: under manual optimization Lightning takes a mapping (or a tensor) and hands
        a copy of it to ``on_train_batch_end`` as ``outputs``; the named result rides in it under :data:`STEP_KEY`."""
        return {STEP_KEY: self}

    @classmethod
    def of(cls, outputs: Any) -> ScoredSamples | None:
        """The named result in a batch-end hook's ``outputs``: as validation / test returned it, or
        from a training step's mapping (:meth:`as_step_output`); None when there is none."""
        if isinstance(outputs, Mapping):
            outputs = outputs.get(STEP_KEY)
        return outputs if isinstance(outputs, cls) else None


class Scored(NamedTuple):
    """The leaves' rewards as the reward call gave them."""

    rewards: Tensor  # [L] float32; may hold NaN / inf under skip (all NaN when the call raised)
    components: dict[str, Tensor]  # name -> [L] float32, a MultiReward's parts (else empty)
    failure: str | None  # why the reward call raised (skip), else None


class Screened(NamedTuple):
    """The rewards a step trains on, and the prompts it leaves out."""

    rewards: Tensor  # [L] the dropped prompts' leaves replaced by 0 (finite stand-ins)
    dropped: Tensor  # [P] bool: prompts left out of this step

    def kept_leaves(self, leaf_prompt: Tensor) -> Tensor:
        """[L] bool: the leaves of the prompts that train."""
        return ~self.dropped[leaf_prompt]


class GrownTree(NamedTuple):
    """One batch's trees, scored, backed up and pruned: what the update trains on and ``TreeView`` draws."""

    spec: Any  # TreeSpec: the iteration's tree (a window schedule moves it)
    cond: Any  # the prompts' conditioning, P rows (the update's forwards take it again)
    tree: Any  # RolloutTree: every prompt's trees, L leaves and E recorded edges
    leaf_prompts: list[str]  # [L] each leaf's prompt
    images: Tensor  # [L, 3, H, W] the decoded leaves in [0, 1] ([L, F, 3, H, W] videos)
    scored: Scored  # the rewards [L] as the reward gave them, with their components
    screened: Screened  # the rewards [L] the advantages come from, and the prompts [P] left out
    advantages: Tensor  # [E] one per recorded edge
    pruning: Any  # PruningConfig: the iteration's pruning
    keep: Tensor  # [E] bool: the edges that train (pruning kept them and their prompt was not left out)
