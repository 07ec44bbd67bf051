"""Acceptance checks every reward passes on tiny random models (ImageReward: test_extra_parity)."""

from __future__ import annotations

import pytest
import torch

from tests.rewards.conftest import PROMPTS

NAMES = [
    "pickscore",
    "clip_score",
    "hps",
    "aesthetic",
    "jpeg_compressibility",
    "jpeg_incompressibility",
]


@pytest.mark.parametrize("name", NAMES)
def test_finite_float32_one_score_per_image(tiny_rewards, images, name) -> None:
    scores = tiny_rewards[name](images, PROMPTS)
    assert scores.dtype == torch.float32 and scores.shape == (4,)
    assert torch.isfinite(scores).all()


@pytest.mark.parametrize("name", NAMES)
def test_different_images_give_different_scores(tiny_rewards, images, name) -> None:
    same_prompt = [PROMPTS[0]] * 4
    scores = tiny_rewards[name](images, same_prompt)
    gaps = (scores[:, None] - scores[None, :]).abs() + torch.eye(4)  # [4, 4], diagonal masked
    assert gaps.min() > 1e-4, f"{name}: two images scored alike: {scores.tolist()}"


@pytest.mark.parametrize("name", NAMES)
def test_prompt_dependence_matches_the_model(tiny_rewards, images, name) -> None:
    reward = tiny_rewards[name]
    a = reward(images, PROMPTS)
    b = reward(images, ["an entirely different prompt"] * 4)
    if reward.uses_prompt:
        assert ((a - b).abs() > 1e-4).all(), f"{name} ignores the prompt: {a.tolist()} vs {b.tolist()}"
    else:
        torch.testing.assert_close(a, b, rtol=0, atol=0)


#: batched and one-by-one forwards may take other float32 kernels (seen: AVX-512 on an AMD EPYC),
#: so they agree to rounding at the score's scale: CLIPScore is 100 x a cosine, about 40, where one
#: float32 step is 3.8e-6 (measured there: 1.5e-5 apart)
SAME_SCORE = dict(rtol=2e-6, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_batched_equals_one_by_one(tiny_rewards, images, name) -> None:
    reward = tiny_rewards[name]
    batched = reward(images, PROMPTS)
    single = torch.cat([reward(images[i : i + 1], [p]) for i, p in enumerate(PROMPTS)])
    torch.testing.assert_close(batched, single, **SAME_SCORE)


@pytest.mark.parametrize("name", NAMES)
def test_max_batch_chunks_give_the_same_scores(tiny_rewards, images, name) -> None:
    reward = tiny_rewards[name]
    whole = reward(images, PROMPTS)
    reward.max_batch = 3  # chunks of 3 + 1
    try:
        chunked = reward(images, PROMPTS)
    finally:
        reward.max_batch = None
    torch.testing.assert_close(chunked, whole, **SAME_SCORE)


@pytest.mark.parametrize("name", NAMES)
def test_frozen_eval_and_no_grad(tiny_rewards, images, name) -> None:
    reward = tiny_rewards[name]
    reward.train()  # a parent module switching to train mode must not turn dropout on
    assert not reward.training and not any(m.training for m in reward.modules())
    assert all(not p.requires_grad for p in reward.parameters())
    scores = reward(images.clone().requires_grad_(True), PROMPTS)
    assert not scores.requires_grad


@pytest.mark.parametrize("name", ["pickscore", "clip_score", "hps", "aesthetic"])
def test_scores_on_another_resolution_are_finite(tiny_rewards, name) -> None:
    wide = torch.rand(2, 3, 24, 72, generator=torch.Generator().manual_seed(3))  # upsampled
    scores = tiny_rewards[name](wide, PROMPTS[:2])
    assert scores.shape == (2,) and torch.isfinite(scores).all()
