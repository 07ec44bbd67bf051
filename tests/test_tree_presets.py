"""Every shipped tree preset parses into a valid TreeSpec with the sizes its comment promises."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lit_treegrpo.core.spec import TreeSpec

PRESETS = Path(__file__).resolve().parents[1] / "configs" / "trees"

# name: (leaves per prompt, model evaluations per prompt, trained edges per prompt)
EXPECTED = {
    "treegrpo": (27, 202, 39),
    "treegrpo_code": (16, 1 + 2 + 4 + 8 + 16 * 6, 2 + 4 + 8 + 16),
    "branchgrpo": (16, 1 + 2 * 3 + 4 * 3 + 8 * 3 + 16 * 10, 2 + 2 * 2 + 4 + 4 * 2 + 8 + 8 * 2 + 16 + 16 * 9),
    # splits 0, 3, 6, 9 (k=2) and the window's SDE steps 1, 2 on the 2 nodes after the first split
    "branchgrpo_mix": (16, 203, 2 + 2 + 2 + 4 + 8 + 16),
    "dancegrpo": (12, 120, 108),
    "flowgrpo": (24, 240, 216),
    "mixgrpo": (12, 120, 48),
}


def load(path: Path) -> TreeSpec:
    return TreeSpec.from_dict(yaml.safe_load(path.read_text()))


def test_every_preset_is_covered() -> None:
    assert {p.stem for p in PRESETS.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_sizes(name: str) -> None:
    spec = load(PRESETS / f"{name}.yaml")
    assert (spec.num_leaves, spec.nfe(), spec.num_edges()) == EXPECTED[name]
    # the schedule keeps the tree valid (and its size) at every training step
    for step in (0, 1, 49, 50, 1000, 12345):
        moved = spec.at(step)
        assert moved.num_leaves == spec.num_leaves
        assert spec.num_steps - 1 not in moved.branch_steps + moved.sde_steps
        # nor in the preset's deterministic tail (MixGRPO: the last two steps)
        assert all(s < spec.num_steps - spec.ode_tail for s in moved.branch_steps + moved.sde_steps)
