"""RewardModel's checks and torch preprocessing, MultiReward's arithmetic, the name registry."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import Tensor

from lit_treegrpo.rewards import (
    REWARDS,
    JpegCompressibility,
    MultiReward,
    NonFiniteRewardError,
    RewardModel,
    build_reward,
)
from lit_treegrpo.rewards.base import (
    center_crop,
    normalize,
    resize,
    resize_longer_side_and_pad,
    resize_shorter_side,
    unique_prompts,
)


class PixelReward(RewardModel):
    """Test double for MultiReward: ``scale`` x the top-left pixel of one channel."""

    def __init__(self, channel: int, scale: float = 10.0, name: str = "pixel") -> None:
        super().__init__()
        self.channel, self.scale, self.name = channel, scale, name
        self.freeze()

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        return self.scale * images[:, self.channel, 0, 0]  # [B]


class NanAt(PixelReward):
    """Returns NaN for the images at ``bad`` (a reward that broke)."""

    def __init__(self, bad: list[int], name: str = "broken") -> None:
        super().__init__(channel=0, name=name)
        self.bad = bad

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        out = super().score_batch(images, prompts).clone()
        out[self.bad] = float("nan")
        return out


def pixel_images(a: list[float], b: list[float]) -> Tensor:
    """[B, 3, 2, 2] images whose top-left pixel is a/10 in channel 0 and b/10 in channel 1."""
    x = torch.zeros(len(a), 3, 2, 2)
    x[:, 0, 0, 0] = torch.tensor(a) / 10
    x[:, 1, 0, 0] = torch.tensor(b) / 10
    return x


# ------------------------------------------------------------------------------ MultiReward


def test_normalize_then_weight_equals_hand_numbers() -> None:
    # prompts interleaved: grouping goes by the prompt string, not by position
    prompts = ["p", "q", "p", "q", "p"]
    A = [1.0, 5.0, 2.0, 7.0, 3.0]  # p: 1, 2, 3   q: 5, 7
    B = [4.0, 2.0, 4.0, 6.0, 10.0]  # p: 4, 4, 10  q: 2, 6
    multi = MultiReward({"a": PixelReward(0), "b": PixelReward(1)}, weights={"a": 1.0, "b": 0.5})
    out = multi.score(pixel_images(A, B), prompts)
    # A, p: mean 2, population var (1 + 0 + 1) / 3 = 2/3 -> (-1, 0, 1) * sqrt(3/2)
    # A, q: mean 6, std 1                              -> (-1, 1)
    # B, p: mean 6, var (4 + 4 + 16) / 3 = 8           -> (-2, -2, 4) / (2 sqrt 2)
    # B, q: mean 4, std 2                              -> (-1, 1)
    s = math.sqrt(1.5)
    r = 1 / math.sqrt(2)
    expected_p = [-s + 0.5 * -r, 0 + 0.5 * -r, s + 0.5 * 2 * r]
    expected_q = [-1 + 0.5 * -1, 1 + 0.5 * 1]
    expected = torch.tensor([expected_p[0], expected_q[0], expected_p[1], expected_q[1], expected_p[2]])
    torch.testing.assert_close(out.total, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(multi(pixel_images(A, B), prompts), out.total)
    # the components are the raw scores, for logging
    torch.testing.assert_close(out.components["a"], torch.tensor(A), rtol=0, atol=1e-5)
    torch.testing.assert_close(out.components["b"], torch.tensor(B), rtol=0, atol=1e-5)
    assert out.total.dtype == torch.float32


def test_weighted_sum_uses_raw_scores() -> None:
    A, B = [1.0, 5.0, 2.0], [4.0, 2.0, 4.0]
    multi = MultiReward({"a": PixelReward(0), "b": PixelReward(1)}, {"a": 2.0, "b": -1.0}, "weighted_sum")
    out = multi(pixel_images(A, B), ["p", "q", "p"])
    torch.testing.assert_close(out, torch.tensor([2 * 1 - 4, 2 * 5 - 2, 2 * 2 - 4.0]), rtol=0, atol=1e-5)


def test_single_leaf_group_normalises_to_zero() -> None:
    multi = MultiReward({"a": PixelReward(0)})
    out = multi(pixel_images([3.0, 1.0, 2.0], [0, 0, 0]), ["alone", "x", "x"])
    torch.testing.assert_close(out, torch.tensor([0.0, -1.0, 1.0]), rtol=0, atol=1e-6)


def test_nan_component_is_named() -> None:
    multi = MultiReward({"good": PixelReward(0), "hps_like": NanAt([1])})
    with pytest.raises(NonFiniteRewardError, match=r"multi/hps_like.*indices \[1\].*'second'"):
        multi(pixel_images([1.0, 2.0, 3.0], [0, 0, 0]), ["first", "second", "third"])


def test_unchecked_multi_reward_spoils_only_the_prompt_of_the_nan() -> None:
    # the module's skip policy scores with check=False and drops the prompts with NaN itself
    multi = MultiReward({"good": PixelReward(0), "hps_like": NanAt([1])})
    images, prompts = pixel_images([1.0, 2.0, 3.0, 5.0], [0, 0, 0, 0]), ["p", "p", "q", "q"]
    scores = multi.score(images, prompts, check=False)
    assert scores.total[:2].isnan().all() and scores.components["hps_like"][1].isnan()
    # prompt q is normalised on its own: (3, 5) -> (-1, 1) in both components, weights 1
    torch.testing.assert_close(scores.total[2:], torch.tensor([-2.0, 2.0]), rtol=0, atol=1e-6)
    assert multi.raw_scores(images, prompts)[:2].isnan().all()  # raw_scores checks nothing, as for any reward
    with pytest.raises(NonFiniteRewardError):
        multi.score(images, prompts)


def test_a_single_reward_scores_like_a_multi_reward_without_components() -> None:
    # score() is the one scoring call for every reward: the total (10 x the channel-0 pixel) and
    # no components; check=False lets the NaN through, still validating the inputs
    images = pixel_images([1.0, 2.0, 3.0], [0, 0, 0])
    scores = PixelReward(0).score(images, ["a", "b", "c"])
    torch.testing.assert_close(scores.total, torch.tensor([1.0, 2.0, 3.0]), rtol=0, atol=1e-6)
    assert scores.components == {}
    unchecked = NanAt([1]).score(images, ["a", "b", "c"], check=False)
    assert unchecked.total[1].isnan() and unchecked.total[[0, 2]].tolist() == pytest.approx([1.0, 3.0])
    with pytest.raises(NonFiniteRewardError, match="'broken'"):
        NanAt([1]).score(images, ["a", "b", "c"])
    with pytest.raises(ValueError, match="got 3 images but 2 prompts"):
        NanAt([1]).score(images, ["a", "b"], check=False)


def test_nan_from_a_single_reward_names_it_and_the_prompts() -> None:
    with pytest.raises(NonFiniteRewardError, match=r"'broken'.*2 of 3.*indices \[0, 2\].*'a'.*'c'"):
        NanAt([0, 2])(pixel_images([1.0, 2.0, 3.0], [0, 0, 0]), ["a", "b", "c"])


def test_multi_reward_validates_its_arguments() -> None:
    with pytest.raises(ValueError, match="rewards is empty"):
        MultiReward({})
    with pytest.raises(ValueError, match=r"missing \['b'\], unknown \['c'\]"):
        MultiReward({"a": PixelReward(0), "b": PixelReward(1)}, {"a": 1.0, "c": 1.0})
    with pytest.raises(ValueError, match="aggregate must be 'normalize_then_weight' or 'weighted_sum'"):
        MultiReward({"a": PixelReward(0)}, aggregate="mean")
    with pytest.raises(TypeError, match="reward 'x' must be a RewardModel, got Linear"):
        MultiReward({"x": torch.nn.Linear(1, 1)})
    with pytest.raises(ValueError, match="not finite"):
        MultiReward({"a": PixelReward(0)}, {"a": float("nan")})


def test_unique_prompts_follow_first_appearance() -> None:
    distinct, index = unique_prompts(["b", "a", "b", "c"])
    assert distinct == ["b", "a", "c"] and index.tolist() == [0, 1, 0, 2]


# ------------------------------------------------------------------------------ input checks


@pytest.mark.parametrize(
    ("images", "prompts", "error", "pattern"),
    [
        (
            np.zeros((1, 3, 4, 4)),
            ["x"],
            TypeError,
            r"'jpeg_compressibility': images must be a torch.Tensor",
        ),
        (torch.zeros(3, 4, 4), ["x"], ValueError, r"shape \[B, 3, H, W\], got \[3, 4, 4\]"),
        (torch.zeros(1, 4, 4, 4), ["x"], ValueError, r"shape \[B, 3, H, W\], got \[1, 4, 4, 4\]"),
        (torch.zeros(0, 3, 4, 4), [], ValueError, "empty batch"),
        (
            torch.zeros(1, 3, 4, 4, dtype=torch.uint8),
            ["x"],
            ValueError,
            r"floating point.*images.float\(\) / 255",
        ),
        (torch.zeros(2, 3, 4, 4), ["x"], ValueError, "got 2 images but 1 prompts"),
        (torch.zeros(1, 3, 4, 4), "x", TypeError, "prompts must be a list of strings"),
        (torch.zeros(1, 3, 4, 4), [3], TypeError, "prompts must be a list of strings"),
        (
            torch.full((1, 3, 4, 4), 2.0),
            ["x"],
            ValueError,
            r"must lie in \[0, 1\], got values in \[2, 2\]",
        ),
        (-torch.ones(1, 3, 4, 4), ["x"], ValueError, r"\(x / 2 \+ 0.5\).clamp\(0, 1\)"),
        (
            torch.tensor([0.5, float("nan")]).view(2, 1, 1, 1).expand(2, 3, 4, 4),
            ["x", "y"],
            ValueError,
            r"images \[1\] contain NaN or inf",
        ),
    ],
)
def test_bad_inputs_are_refused_with_a_clear_message(images, prompts, error, pattern) -> None:
    with pytest.raises(error, match=pattern):
        JpegCompressibility()(images, prompts)


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        JpegCompressibility(max_batch=0)


# ------------------------------------------------------------------------------ preprocessing


def test_resize_to_the_same_size_is_the_identity() -> None:
    x = torch.rand(2, 3, 8, 6)
    assert resize(x, (8, 6)) is x


def test_resize_shorter_side_follows_torchvision_sizes() -> None:
    # torchvision Resize(int): shorter side -> size, longer -> int(size * long / short)
    assert resize_shorter_side(torch.rand(1, 3, 48, 40), 32).shape[-2:] == (int(32 * 48 / 40), 32)
    assert resize_shorter_side(torch.rand(1, 3, 30, 70), 32).shape[-2:] == (32, int(32 * 70 / 30))


@pytest.mark.parametrize("size", [(20, 28), (80, 112), (40, 56)])
def test_resize_matches_pil_bicubic_within_a_grey_level(size) -> None:
    from PIL import Image

    # a smooth image: on pixel noise PIL's uint8 clipping between its two passes differs more
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.interpolate(torch.rand(1, 3, 5, 7, generator=g), size=(40, 56), mode="bilinear")
    x = (x * 255).round() / 255  # uint8-exact values, so PIL sees the same image
    pil = Image.fromarray((x[0].permute(1, 2, 0) * 255).round().byte().numpy())
    resized = pil.resize(size[::-1], Image.BICUBIC)
    ref = torch.from_numpy(np.array(resized)).permute(2, 0, 1).float()  # [3, h, w] in 0..255
    ours = resize(x, size)[0] * 255  # [3, h, w]
    assert (ours - ref).abs().max() <= 1.1  # PIL rounds to uint8; torch stays in float


def test_resize_clamps_bicubic_overshoot() -> None:
    x = torch.zeros(1, 3, 4, 4)
    x[..., ::2, ::2] = 1.0  # a checkerboard rings when upsampled
    y = resize(x, (13, 13))
    assert y.min() >= 0.0 and y.max() <= 1.0


def test_center_crop_uses_torchvision_offsets() -> None:
    x = torch.arange(7 * 9).float().view(1, 1, 7, 9)
    # top = round((7 - 4) / 2) = round(1.5) = 2, left = round((9 - 4) / 2) = round(2.5) = 2
    torch.testing.assert_close(center_crop(x, 4), x[..., 2:6, 2:6])
    with pytest.raises(ValueError, match="smaller than the crop"):
        center_crop(x, 8)


def test_resize_longer_side_and_pad_centres_the_image() -> None:
    x = torch.rand(1, 3, 21, 40)
    out = resize_longer_side_and_pad(x, 32)
    # scale 32 / 40: height round(21 * 0.8) = 17, padding 15 = 7 above + 8 below (HPSv2 / open_clip)
    assert out.shape == (1, 3, 32, 32)
    assert out[..., :7, :].abs().max() == 0 and out[..., 24:, :].abs().max() == 0
    torch.testing.assert_close(out[..., 7:24, :], resize(x, (17, 32)))


def test_normalize_per_channel() -> None:
    x = torch.ones(1, 3, 2, 2)
    out = normalize(x, (0.5, 0.0, 1.0), (0.5, 2.0, 1.0))
    assert out[0, :, 0, 0].tolist() == [1.0, 0.5, 0.0]


# ------------------------------------------------------------------------------ registry


def test_registry_builds_by_name_with_keyword_arguments() -> None:
    reward = build_reward("jpeg_compressibility", quality=80)
    assert isinstance(reward, JpegCompressibility) and reward.quality == 80
    assert {"hps", "image_reward", "pickscore", "clip_score", "aesthetic"} <= set(REWARDS)


def test_registry_lists_the_known_names_for_an_unknown_one() -> None:
    with pytest.raises(ValueError, match=r"unknown reward 'hpsv3'; known rewards: ") as err:
        build_reward("hpsv3")
    assert str(err.value).endswith(", ".join(sorted(REWARDS)))
