"""Compute as a first-class quantity: what one training step spent, in counted model work.

Methods differ in where they spend: a tree shares its early steps and trains few edges, flat GRPO
samples every chain and trains most of its edges, Flow-GRPO adds a reference forward per trained
one. Comparing them at equal *sampling* NFE hides the training pass, so every step counts four
kinds of work (:class:`Compute`) and weighs them with one cost model (:class:`ComputeCost`) into
*compute units*, where one unit is one sampling forward of the denoiser for one batch element:

- ``sampling``: the rollout's model evaluations (batch elements; CFG doubling is not counted
  separately, it doubles every kind alike);
- ``trained``: forwards that recompute log-probs with grad, each followed by its backward;
  weighted ``trained`` (3 by default: a backward costs about two forwards);
- ``reference``: the KL reference's forwards, no grad; weighted ``reference`` (1);
- ``reward_images``: images (or videos) scored by the reward; weighted ``reward`` per image (0 by
  default: a real reward model is a forward of its own size and should be given its measured
  ratio; the Shapes reward is analytic and costs a few percent of a denoiser forward).

``units = sampling + trained_factor * trained + reference_factor * reference + reward_factor *
reward_images``. Pure arithmetic on counts: nothing here measures time.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class ComputeCost:
    """Weights of each kind of work, in sampling forwards (see the module docstring)."""

    trained: float = 3.0
    """A trained forward with its backward, in sampling forwards (3: the backward costs about 2)."""
    reference: float = 1.0
    """A reference-model forward without grad (Flow-GRPO's KL), in sampling forwards."""
    reward: float = 0.0
    """One image (or video) scored by the reward, in sampling forwards of the denoiser."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, (int, float)) and value >= 0 and value == value and value != float("inf")):
                raise ValueError(f"compute_cost.{f.name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class Compute:
    """Counted model work (integers; see the module docstring)."""

    sampling: int = 0
    trained: int = 0
    reference: int = 0
    reward_images: int = 0

    def __add__(self, other: Compute) -> Compute:
        return Compute(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def units(self, cost: ComputeCost) -> float:
        """The total in compute units under ``cost``."""
        return (
            self.sampling
            + cost.trained * self.trained
            + cost.reference * self.reference
            + cost.reward * self.reward_images
        )

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
