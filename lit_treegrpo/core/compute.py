"""Compute as a first-class quantity: what one training step spent, in counted model work."""

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
