"""ShapesReward: verifiable prompt following, checked on rendered references and adversarial images."""

from __future__ import annotations

import pytest
import torch

from lit_treegrpo.rewards import ShapesReward, build_reward
from lit_treegrpo.rewards.shapes import _moment_fit
from lit_treegrpo.shapes import world
from lit_treegrpo.shapes.world import COLOURS, SHAPES, parse_prompt

PROMPTS = world.all_prompts()


def references(prompts: list[str], seed: int = 0) -> tuple[torch.Tensor, world.Scenes]:
    scenes = world.scenes_for(prompts, 16, torch.Generator().manual_seed(seed))
    return world.render(scenes, 16), scenes


def one(shape: str, colour: str, extent: float, cx: float = 8.0, cy: float = 8.0, grey: float = 0.15) -> world.Scenes:
    return world.Scenes(
        torch.tensor([SHAPES.index(shape)]),
        torch.tensor([list(COLOURS).index(colour)]),
        torch.tensor([extent]),
        torch.tensor([cx]),
        torch.tensor([cy]),
        torch.full((1, 3), grey),
        [""],
    )


def test_rendered_references_score_near_one_and_are_identified() -> None:
    images, scenes = references(PROMPTS * 2)
    analysis = ShapesReward().analyse(images, scenes.prompts)
    # a shape drawn right at the edge of its size range or region can fit just outside it
    assert analysis.score.min() > 0.85 and analysis.score.mean() > 0.98
    assert bool(analysis.colour_ok.all()) and bool(analysis.shape_ok.all())
    assert bool((analysis.shape == scenes.shape).all()) and bool((analysis.colour == scenes.colour).all())


@pytest.mark.parametrize("shape", SHAPES)
def test_moment_fit_recovers_extent_and_centre(shape: str) -> None:
    # a noiseless render: the fitted template of the true shape has the true extent and box centre
    mask = world.coverage(
        torch.tensor([SHAPES.index(shape)]),
        torch.tensor([9.0]),
        torch.tensor([7.5]),
        torch.tensor([8.5]),
        16,
        supersample=8,
    )
    extent, cx, cy = _moment_fit(mask)
    k = SHAPES.index(shape)
    assert abs(float(extent[0, k]) - 9.0) < 0.15
    assert abs(float(cx[0, k]) - 7.5) < 0.05 and abs(float(cy[0, k]) - 8.5) < 0.05


def adversaries(prompts: list[str]) -> dict[str, torch.Tensor]:
    B = len(prompts)
    g = torch.Generator().manual_seed(1)
    wanted = torch.tensor([list(COLOURS).index(parse_prompt(p).colour) for p in prompts])
    palette = torch.tensor(list(COLOURS.values()))
    _, scenes = references(prompts)
    same = scenes._replace(
        shape=torch.zeros(B, dtype=torch.long),
        colour=torch.zeros(B, dtype=torch.long),
        extent=torch.full((B,), 8.0),
        cx=torch.full((B,), 8.0),
        cy=torch.full((B,), 8.0),
    )
    huge = scenes._replace(extent=torch.full((B,), 15.0), cx=torch.full((B,), 8.0), cy=torch.full((B,), 8.0))
    return {
        "full canvas of the requested colour": palette[wanted].view(B, 3, 1, 1).expand(B, 3, 16, 16).contiguous(),
        "uniform noise": torch.rand(B, 3, 16, 16, generator=g),
        "the same red circle for every prompt": world.render(same, 16),
        "a blank background": scenes.background.view(B, 3, 1, 1).expand(B, 3, 16, 16).contiguous(),
        "the requested shape and colour filling the canvas": world.render(huge, 16),
    }


@pytest.mark.parametrize("name", list(adversaries(PROMPTS[:2])))
def test_degenerate_images_score_near_zero(name: str) -> None:
    images = adversaries(PROMPTS)[name]
    scores = ShapesReward()(images, PROMPTS)
    assert float(scores.mean()) < 0.05, name


def test_the_right_colour_with_the_wrong_shape_or_vice_versa_scores_low() -> None:
    reward = ShapesReward()
    square = world.render(one("square", "blue", 8.0), 16)
    assert float(reward(square, ["a blue square"])) > 0.95
    assert float(reward(square, ["a blue circle"])) < 0.1
    assert float(reward(square, ["a blue triangle"])) < 0.1
    assert float(reward(square, ["a red square"])) < 0.05
    assert float(reward(square, ["an orange square"])) < 0.05  # orange is not mistaken for blue


def test_a_second_shape_of_another_colour_halves_the_purity() -> None:
    a, b = one("circle", "green", 5.0, cx=4.0, cy=4.0), one("circle", "magenta", 5.0, cx=12.0, cy=12.0)
    images = world.render(a, 16) + world.render(b, 16) - a.background.view(1, 3, 1, 1)  # both on one canvas
    analysis = ShapesReward().analyse(images.clamp(0, 1), ["a green circle"])
    assert 0.4 < float(analysis.purity) < 0.6
    assert float(analysis.score) < 0.6


def test_size_and_position_words_are_enforced() -> None:
    reward = ShapesReward()
    small_left = world.render(one("circle", "white", 5.5, cx=4.0, cy=8.0), 16)
    large_right = world.render(one("circle", "white", 10.5, cx=10.0, cy=8.0), 16)
    assert float(reward(small_left, ["a small white circle on the left"])) > 0.9
    assert float(reward(small_left, ["a large white circle"])) < 0.05
    assert float(reward(small_left, ["a white circle on the right"])) < 0.05
    assert float(reward(large_right, ["a large white circle on the right"])) > 0.9
    assert float(reward(large_right, ["a small white circle"])) < 0.05
    assert float(reward(large_right, ["a white circle"])) > 0.9  # no size word: any size of the world


def test_scores_do_not_depend_on_the_batch() -> None:
    images, scenes = references(PROMPTS[:12], seed=5)
    reward = ShapesReward()
    together = reward(images, scenes.prompts)
    alone = torch.cat([reward(images[i : i + 1], scenes.prompts[i : i + 1]) for i in range(12)])
    assert torch.allclose(together, alone, atol=1e-6)
    assert torch.equal(ShapesReward(max_batch=5)(images, scenes.prompts), together)


def test_bad_prompts_and_options_are_refused() -> None:
    images, _ = references(PROMPTS[:1])
    with pytest.raises(ValueError, match="'a photo of a cat' is not a Shapes-world prompt"):
        ShapesReward()(images, ["a photo of a cat"])
    with pytest.raises(ValueError, match="slack must be in"):
        ShapesReward(slack=0.0)
    assert isinstance(build_reward("shapes"), ShapesReward)


def test_the_score_comes_with_its_factors_as_components() -> None:
    images, scenes = references(PROMPTS[:12])
    images[3] = 0.15  # an empty canvas: nothing present, so the score and its presence are 0
    reward = ShapesReward()
    scores = reward.score(images, scenes.prompts)
    assert torch.equal(scores.total, reward(images, scenes.prompts))  # the total is the plain score
    assert list(scores.components) == ["presence", "purity", "shape", "size", "position"]
    product = torch.stack(list(scores.components.values())).prod(dim=0)  # the score is their product
    torch.testing.assert_close(product, scores.total, rtol=1e-6, atol=1e-7)
    assert scores.components["presence"][3] < 0.05 and scores.total[3] < 0.05
    chunked = ShapesReward(max_batch=5).score(images, scenes.prompts)  # chunks of 5, 5, 2
    assert torch.equal(chunked.total, scores.total)
    assert all(torch.equal(chunked.components[k], v) for k, v in scores.components.items())
