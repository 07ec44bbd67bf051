"""The Shapes world: grammar, rendering and scene sampling."""

from __future__ import annotations

import math

import pytest
import torch

from lit_treegrpo.shapes import world
from lit_treegrpo.shapes.world import COLOURS, POSITIONS, SHAPES, ShapeSpec, parse_prompt


def test_the_grammar_has_360_distinct_prompts_that_parse_back() -> None:
    prompts = world.all_prompts()
    assert len(prompts) == len(set(prompts)) == 8 * 3 * 3 * 5
    for p in prompts:
        assert parse_prompt(p).prompt == p
    assert "an orange triangle on the left" in prompts
    assert "a large orange circle at the top" in prompts  # the article follows the first word
    assert parse_prompt("  A Small  RED square AT THE bottom ") == ShapeSpec("red", "square", "small", "at the bottom")


@pytest.mark.parametrize(
    "prompt", ["a photo of a cat", "a red", "a purple circle", "a red hexagon", "a red circle on the moon", ""]
)
def test_prompts_outside_the_grammar_are_refused_with_the_grammar(prompt: str) -> None:
    with pytest.raises(ValueError, match=r"is not a Shapes-world prompt: expected 'a \[small\|large\]"):
        parse_prompt(prompt)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("extent", [5.0, 8.5, 11.0])
def test_coverage_integrates_to_the_exact_area(shape: str, extent: float) -> None:
    # 8x8 supersampling: the area error is below one sample's area per boundary pixel crossed
    cov = world.coverage(
        torch.tensor([SHAPES.index(shape)]),
        torch.tensor([extent]),
        torch.tensor([8.3]),
        torch.tensor([7.9]),
        16,
        supersample=8,
    )
    exact = world.expected_area(shape, extent)
    assert cov.min() >= 0 and cov.max() <= 1
    assert abs(float(cov.sum()) - exact) < 0.02 * exact + 0.1


def test_render_blends_the_colour_over_the_background_by_coverage() -> None:
    scenes = world.scenes_for(["a cyan square"], 16, torch.Generator().manual_seed(0))
    scenes = scenes._replace(extent=torch.tensor([6.0]), cx=torch.tensor([8.0]), cy=torch.tensor([8.0]))
    image = world.render(scenes, 16)[0]  # [3, 16, 16]
    bg, fg = scenes.background[0], torch.tensor(COLOURS["cyan"])
    # a 6-pixel square centred at 8 covers pixels 5..10 exactly, nothing else
    assert torch.allclose(image[:, 5:11, 5:11], fg.view(3, 1, 1).expand(3, 6, 6))
    assert torch.allclose(image[:, :5], bg.view(3, 1, 1).expand(3, 5, 16))
    assert torch.allclose(image[:, 11:], bg.view(3, 1, 1).expand(3, 5, 16))


def test_sampled_scenes_match_their_prompts_and_are_seeded() -> None:
    a = world.sample_scenes(400, 16, torch.Generator().manual_seed(3))
    b = world.sample_scenes(400, 16, torch.Generator().manual_seed(3))
    assert a.prompts == b.prompts and torch.equal(world.render(a, 16), world.render(b, 16))
    sizes = world.size_of(a.extent, 16)
    lo, hi = world.centre_range(a.extent, 16)
    assert bool(((a.cx >= lo) & (a.cx <= hi) & (a.cy >= lo) & (a.cy <= hi)).all())  # inside the canvas
    named_size = named_position = 0
    for i, prompt in enumerate(a.prompts):
        spec = parse_prompt(prompt)
        assert spec.colour == list(COLOURS)[a.colour[i]] and spec.shape == SHAPES[a.shape[i]]
        if spec.size:
            named_size += 1
            assert spec.size == sizes[i]
        if spec.position:
            named_position += 1
            assert bool(world.position_holds(spec.position, a.cx[i : i + 1], a.cy[i : i + 1], 16))
    # about half of the small / large scenes name their size, about half of the off-centre ones a position
    assert 0.2 < named_size / 400 < 0.5 and 0.2 < named_position / 400 < 0.5


def test_scenes_for_prompts_satisfy_them() -> None:
    prompts = world.all_prompts()
    scenes = world.scenes_for(prompts, 16, torch.Generator().manual_seed(0))
    sizes = world.size_of(scenes.extent, 16)
    for i, p in enumerate(prompts):
        spec = parse_prompt(p)
        assert SHAPES[scenes.shape[i]] == spec.shape and list(COLOURS)[scenes.colour[i]] == spec.colour
        assert spec.size is None or sizes[i] == spec.size
        if spec.position:
            assert bool(world.position_holds(spec.position, scenes.cx[i : i + 1], scenes.cy[i : i + 1], 16))


def test_areas_overlap_across_shapes_so_area_alone_cannot_name_them() -> None:
    lo, hi = world.SIZES["small"][0] * 16, world.SIZES["large"][1] * 16
    ranges = {s: (world.expected_area(s, lo), world.expected_area(s, hi)) for s in SHAPES}
    for s, t in [("circle", "square"), ("circle", "triangle"), ("square", "triangle")]:
        assert ranges[s][0] < ranges[t][1] and ranges[t][0] < ranges[s][1]
    assert math.isclose(ranges["square"][1], (0.70 * 16) ** 2)
    assert len(POSITIONS) == 4
