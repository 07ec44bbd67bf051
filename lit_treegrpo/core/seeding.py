"""The one way this project turns a run's seed and a position in the run into a random generator.

Every random draw that must come out the same on a resumed run, on another number of processes or
in another batch (root noise, SDE noise, minibatch shuffles, window and step draws, the Shapes
pre-training) takes a ``torch.Generator`` seeded by :func:`seed_of`: the run's seed followed by
integers that say where the draw happens, mixed as a polynomial in an odd constant,

    seed_of(s, a, b, c) = ((s * M + a) * M + b) * M + c   (mod 2**63),   M = 1_000_003,

so that no two positions of a run share a generator and nothing depends on a global RNG. The
values are pinned by a test: changing this function changes every run's samples, so a checkpoint
would resume onto different randomness.

Call conventions (the callers name their parts):

=============================  ===============================================================
root and SDE noise             ``(seed, stream, iteration, prompt position)``; stream 0 = training
minibatch shuffle              ``(seed, iteration, first prompt position + 1)``
window / step-fraction draws   ``(seed, iteration)``
deterministic samples          ``(seed, crc32 of the prompt)``: a prompt's image does not depend
                               on its batch or the number of processes
=============================  ===============================================================

(The prompt order is a permutation drawn by ``lit_treegrpo.data.prompt_stream.prompt_permutation``
from a hash of its key, outside torch, so that it needs no generator at all.)
"""

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
