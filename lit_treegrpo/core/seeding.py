"""The one way this project turns a run's seed and a position in the run into a random generator."""

from __future__ import annotations

import torch

MIX = 1_000_003  # odd, prime: consecutive parts never collide modulo 2**63 for realistic ranges


def seed_of(seed: int, *parts: int) -> int:
    """``seed`` and ``parts`` mixed into one generator seed in ``[0, 2**63)``."""
    value = int(seed)
    for part in parts:
        value = value * MIX + int(part)
    return value % 2**63


def generator(seed: int, *parts: int, device: torch.device | str | None = None) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` (CPU by default) seeded with :func:`seed_of`."""
    gen = torch.Generator(device) if device is not None else torch.Generator()
    return gen.manual_seed(seed_of(seed, *parts))
