"""Brightness reward: hand numbers and validation."""

import pytest
import torch

from lit_treegrpo.rewards import Brightness, build_reward


def test_brightness_is_mean_luma() -> None:
    images = torch.zeros(3, 3, 4, 4)
    images[0] = 1.0  # white: luma 1
    images[1, 1] = 1.0  # pure green: luma 0.587
    images[2, :, :2] = 0.5  # half the rows grey 0.5: luma 0.25
    torch.testing.assert_close(Brightness()(images, ["", "", ""]), torch.tensor([1.0, 0.587, 0.25]), atol=1e-6, rtol=0)
    # with a target, the distance to it, negated
    torch.testing.assert_close(
        Brightness(target=0.5)(images, ["", "", ""]), torch.tensor([-0.5, -0.087, -0.25]), atol=1e-6, rtol=0
    )
    assert isinstance(build_reward("brightness"), Brightness)


def test_brightness_target_is_validated() -> None:
    with pytest.raises(ValueError, match="target must be in"):
        Brightness(target=1.5)
