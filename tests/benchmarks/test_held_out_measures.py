"""What every held-out evaluation of the comparison records beside the reward: the score's factors and the
samples' diversity (benchmarks/compare/runs.py, ``held_out_scores``)."""

from __future__ import annotations

import math

import torch
from compare.runs import held_out_scores

from lit_treegrpo.core.diversity import mean_pairwise_rms, spread_per_prompt
from lit_treegrpo.shapes import ShapesAdapter, ShapesReward
from lit_treegrpo.shapes.reward import ATTRIBUTES, FACTORS, attributes

PROMPTS = ["a red circle", "a small blue square on the left", "a green triangle at the top"]


def test_spread_by_hand() -> None:
    # three samples of one prompt at (0, 0), (3, 4), (0, 0): the pairs at distance 5 (twice each way) and 0,
    # RMS over the 2 coordinates 5 / sqrt(2); the mean over the 6 ordered pairs 4 * 5 / sqrt(2) / 6
    features = torch.tensor([[[0.0, 0.0]], [[3.0, 4.0]], [[0.0, 0.0]]])  # [S=3, P=1, D=2]
    assert math.isclose(float(spread_per_prompt(features)[0]), 4 * 5 / math.sqrt(2) / 6, rel_tol=1e-12)
    assert float(mean_pairwise_rms(torch.zeros(4, 7))) == 0.0


def _samples(seeds: int) -> torch.Tensor:
    adapter = ShapesAdapter(pretrained="builtin", num_steps=4)
    gen = torch.Generator().manual_seed(0)
    from lit_treegrpo.core.rollout import rollout
    from lit_treegrpo.core.spec import TreeSpec

    with torch.no_grad():
        cond = adapter.encode_prompts(PROMPTS * seeds)
        noise = adapter.initial_noise(len(PROMPTS) * seeds, gen)
        tree = rollout(adapter.predict, adapter.step, TreeSpec(4), cond, noise)
        return adapter.decode(tree.leaf_latents)  # [S * P, 3, H, W] seed-major


def test_the_total_is_the_reward_the_records_always_held_and_the_parts_are_its_factors() -> None:
    images = _samples(3)
    scores, measures = held_out_scores(images, PROMPTS, 3)
    # bitwise the reward every cached run's curve was computed with
    assert torch.equal(scores.flatten(), ShapesReward()(images, PROMPTS * 3))
    analysis = ShapesReward().analyse(images, PROMPTS * 3)
    assert set(measures["parts"]) == set(FACTORS) == {"presence", "purity", "shape", "size", "position"}
    assert measures["parts"]["size"] == float(analysis.size_score.mean())
    # the product of the factors is the score, image by image
    product = torch.stack([analysis[i] for i in FACTORS.values()]).prod(dim=0)
    assert torch.allclose(product, analysis.score, atol=1e-6)


def test_diversity_is_the_spread_over_the_seeds_of_each_prompt() -> None:
    images = _samples(3)
    _, measures = held_out_scores(images, PROMPTS, 3)
    per_seed = images.view(3, len(PROMPTS), *images.shape[1:])  # [S, P, 3, H, W]
    by_hand = [float(mean_pairwise_rms(per_seed[:, p].flatten(1))) for p in range(len(PROMPTS))]
    assert math.isclose(measures["diversity_pixels"], sum(by_hand) / len(by_hand), rel_tol=1e-12)
    described = attributes(ShapesReward().analyse(images, PROMPTS * 3), images.shape[-1])  # [S * P, 8]
    assert described.shape == (9, len(ATTRIBUTES)) and bool(((described >= 0) & (described <= 1)).all())
    assert measures["diversity_attributes"] > 0
    # one sample repeated: no spread in either space
    same = per_seed[:1].expand(3, *per_seed.shape[1:]).reshape_as(images)
    _, collapsed = held_out_scores(same, PROMPTS, 3)
    assert collapsed["diversity_pixels"] == collapsed["diversity_attributes"] == 0.0
    _, single = held_out_scores(images[: len(PROMPTS)], PROMPTS, 1)
    assert single["diversity_pixels"] is None and single["diversity_attributes"] is None
