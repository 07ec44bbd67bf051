"""What a step hands the callbacks: :class:`ScoredSamples`, the samples it drew and their rewards.

The training step (the leaves of the prompts that trained) and validation / test (each prompt's
deterministic samples) return the same named result, so that a callback reads both alike, by
attribute. It lives in the engine, not beside the module, because the callbacks may import the
engine but never the module (tests/test_layering.py).
"""

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
        """What ``training_step`` returns: under manual optimization Lightning takes a mapping (or a
        tensor) and hands a copy of it to ``on_train_batch_end`` as ``outputs``; the named result
        rides in it under :data:`STEP_KEY`. Validation and test return it as it is."""
        return {STEP_KEY: self}

    @classmethod
    def of(cls, outputs: Any) -> ScoredSamples | None:
        """The named result in a batch-end hook's ``outputs``: as validation / test returned it, or
        from a training step's mapping (:meth:`as_step_output`); None when there is none."""
        if isinstance(outputs, Mapping):
            outputs = outputs.get(STEP_KEY)
        return outputs if isinstance(outputs, cls) else None
