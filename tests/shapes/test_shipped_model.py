"""The shipped Shapes model: what docs/shapes.md says of it, measured on fixed seeds."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
import yaml

from lit_treegrpo.models.shapes import ShapesAdapter, ShapesModelConfig, builtin_folder
from lit_treegrpo.rewards import ShapesReward
from lit_treegrpo.shapes import world
from lit_treegrpo.shapes.pretrain import sample

REPO = Path(__file__).resolve().parents[2]
BASIC = [world.ShapeSpec(c, s).prompt for c in world.COLOURS for s in world.SHAPES]  # 24 prompts


@pytest.fixture(scope="module")
def base() -> ShapesAdapter:
    return ShapesAdapter()


def test_the_shipped_weights_come_from_the_pretraining_config() -> None:
    meta = json.loads((builtin_folder() / "shapes_world.json").read_text())
    config = yaml.safe_load((REPO / "configs" / "shapes_pretrain.yaml").read_text())
    assert meta["steps"] == config["trainer"]["max_steps"]
    assert meta["seed"] == config["model"]["seed"] and meta["data_seed"] == config["data"]["seed"]
    assert meta["batch_size"] == config["data"]["batch_size"]
    assert meta["model"] == ShapesModelConfig().__dict__  # the config's model section is the default


def test_base_samples_get_the_colour_right_and_the_shape_well_above_chance(base: ShapesAdapter) -> None:
    # 24 colour x shape prompts x 4 seeds = 96 deterministic samples
    analyses = [ShapesReward().analyse(sample(base, BASIC, seed), BASIC) for seed in range(4)]
    colour = statistics.fmean(float(a.colour_ok.float().mean()) for a in analyses)
    shape = statistics.fmean(float(a.shape_ok.float().mean()) for a in analyses)
    assert colour >= 0.9, colour  # measured: 0.99
    assert shape >= 0.6, shape  # chance is 1/3; measured: 0.875


def test_adversarial_images_score_far_below_the_base_model(base: ShapesAdapter) -> None:
    sys.path.insert(0, str(REPO / "tests" / "rewards"))
    from test_shapes_reward import adversaries

    prompts = world.all_prompts()
    reward = ShapesReward()
    base_mean = float(reward(sample(base, prompts, 0), prompts).mean())  # measured: 0.61
    assert base_mean > 0.5
    for name, images in adversaries(prompts).items():
        assert float(reward(images, prompts).mean()) < 0.1 * base_mean, name
