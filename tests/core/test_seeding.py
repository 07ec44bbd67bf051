"""The seeding function's values are pinned: a change here changes every run's randomness, so a
checkpoint written before it would resume onto other noise (and the README's results would move)."""

from __future__ import annotations

import torch

from lit_treegrpo.core.seeding import MIX, generator, seed_of


def test_pinned_values() -> None:
    assert MIX == 1_000_003
    assert seed_of(0) == 0 and seed_of(5) == 5
    assert seed_of(1, 2, 3, 4) == 1_000_011_000_042_000_058  # ((1 M + 2) M + 3) M + 4, by hand
    assert seed_of(123, 0, 300, 17) == 123_001_107_003_621_004_238 % 2**63
    assert seed_of(2**62, 5) == 4_611_686_018_427_387_909  # reduced modulo 2**63
    assert 0 <= seed_of(-1, 3) < 2**63


def test_the_formulas_of_earlier_versions_are_kept() -> None:
    # each caller's seed before the one function existed (checkpoints from then resume exactly)
    s, it, pos = 7, 42, 13
    assert seed_of(s, 0, it, pos) == ((s * MIX + 0) * MIX + it) * MIX + pos  # training noise
    assert seed_of(s, it, pos + 1) == (s * MIX + it) * MIX + pos + 1  # minibatch shuffle
    assert seed_of(s, it) == (s * MIX + it) % 2**63  # window / step-fraction draws


def test_generator_draws_are_pinned() -> None:
    draw = torch.randn(3, generator=generator(1, 2, 3, 4))
    expected = torch.randn(3, generator=torch.Generator().manual_seed(1_000_011_000_042_000_058))
    assert torch.equal(draw, expected)
    torch.testing.assert_close(torch.randn(2, generator=generator(0)), torch.tensor([1.5409961, -0.2934289]))
    assert not torch.equal(torch.randn(3, generator=generator(1, 2, 3, 5)), draw)
