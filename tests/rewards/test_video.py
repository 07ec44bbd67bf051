"""Video rewards: per-frame image rewards in one call, temporal consistency by hand, the multi-reward
rule, the video-model hook, the registry and the image/video checks."""

from __future__ import annotations

import pytest
import torch

from lit_treegrpo.rewards import (
    REWARDS,
    Brightness,
    FrameAverage,
    MultiReward,
    RewardModel,
    TemporalConsistency,
    VideoModelReward,
    VideoMultiReward,
    build_rewards,
)
from lit_treegrpo.rewards.video import frame_indices

PROMPTS = ["a cat", "a dog", "a cat"]


def videos(b: int = 3, f: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.rand(b, f, 3, 8, 12, generator=torch.Generator().manual_seed(seed))  # [B, F, 3, H, W]


class Recorder(RewardModel):
    """An image reward that records every call: score = mean pixel + 0.1 * prompt length."""

    name = "recorder"

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[tuple[int, ...], list[str]]] = []
        self.freeze()

    def score_batch(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        self.calls.append((tuple(images.shape), list(prompts)))
        return images.mean(dim=(1, 2, 3)) + 0.1 * torch.tensor([len(p) for p in prompts], dtype=torch.float32)


def test_frame_average_scores_all_frames_in_one_call_with_their_prompts() -> None:
    image = Recorder()
    v = videos()
    scores = FrameAverage(image)(v, PROMPTS)
    assert len(image.calls) == 1 and image.calls[0][0] == (15, 3, 8, 12)
    assert image.calls[0][1] == [p for p in PROMPTS for _ in range(5)]
    expected = torch.stack(
        [torch.stack([image.score_batch(v[b, f][None], [PROMPTS[b]])[0] for f in range(5)]).mean() for b in range(3)]
    )
    torch.testing.assert_close(scores, expected)


def test_frame_average_subsamples_evenly_spaced_frames() -> None:
    assert frame_indices(9, 3) == [0, 4, 8] and frame_indices(5, None) == [0, 1, 2, 3, 4]
    assert frame_indices(4, 10) == [0, 1, 2, 3] and frame_indices(9, 1) == [4]
    v = videos(f=9)
    image = Brightness()
    torch.testing.assert_close(FrameAverage(image, frames=3)(v, PROMPTS), FrameAverage(image)(v[:, [0, 4, 8]], PROMPTS))
    built = FrameAverage("brightness", image_kwargs={"target": 0.5}, frames=2)  # by registered name
    assert isinstance(built.image, Brightness) and built.image.target == 0.5 and not built.uses_prompt


def test_temporal_consistency_by_hand() -> None:
    static = videos(b=1, f=1).expand(1, 4, 3, 8, 12).contiguous()
    l2, cosine = TemporalConsistency("l2"), TemporalConsistency("cosine")
    torch.testing.assert_close(l2(static, ["x"]), torch.ones(1))
    torch.testing.assert_close(cosine(static, ["x"]), torch.ones(1))
    # frames alternating 0 and 1: RMS difference 1 -> l2 score 0
    flicker = torch.tensor([0.0, 1.0, 0.0])[None, :, None, None, None].expand(1, 3, 3, 8, 12)
    torch.testing.assert_close(l2(flicker, ["x"]), torch.zeros(1))
    # a frame and its negative (about its mean): cosine -1
    a = videos(b=1, f=1)[:, 0]
    pair = torch.stack([a, 1.0 - a], dim=1)  # [1, 2, 3, 8, 12]
    torch.testing.assert_close(cosine(pair, ["x"]), -torch.ones(1))
    # a uniform shift of 0.1 between frames: l2 1 - 0.1, cosine unaffected
    shifted = torch.stack([a * 0.8, a * 0.8 + 0.1], dim=1)
    torch.testing.assert_close(l2(shifted, ["x"]), torch.tensor([0.9]))
    torch.testing.assert_close(cosine(shifted, ["x"]), torch.ones(1))
    with pytest.raises(ValueError, match="2 or more frames"):
        l2(videos(f=1), PROMPTS)


def test_video_multi_reward_normalises_per_prompt_then_weights() -> None:
    v = videos()
    parts = {"frame_average": FrameAverage(Brightness()), "temporal_consistency": TemporalConsistency()}
    multi = VideoMultiReward(parts, weights={"frame_average": 1.0, "temporal_consistency": 0.5})
    out = multi.score(v, PROMPTS)
    raw = {k: r(v, PROMPTS) for k, r in parts.items()}
    for k in parts:
        torch.testing.assert_close(out.components[k], raw[k])

    def norm(x: torch.Tensor) -> torch.Tensor:  # per prompt group: "a cat" is videos 0 and 2
        y = torch.zeros_like(x)
        for idx in ([0, 2], [1]):
            g = x[idx]
            y[idx] = (g - g.mean()) / (g.std(unbiased=False) + 1e-8)
        return y

    torch.testing.assert_close(out.total, norm(raw["frame_average"]) + 0.5 * norm(raw["temporal_consistency"]))
    with pytest.raises(TypeError, match="score images, not videos"):
        VideoMultiReward({"brightness": Brightness()})


def test_video_model_hook_takes_a_callable_or_an_import_path() -> None:
    v = videos()
    seen = []

    def scorer(x: torch.Tensor, prompts: list[str]) -> list[float]:
        seen.append(tuple(x.shape))
        return [float(len(p)) for p in prompts]

    torch.testing.assert_close(VideoModelReward(scorer)(v, PROMPTS), torch.tensor([5.0, 5.0, 5.0]))
    assert seen == [(3, 5, 3, 8, 12)]
    # an import path to a class, built with init_args (how a config names a Video-Align wrapper)
    hooked = VideoModelReward("lit_treegrpo.rewards.video:TemporalConsistency", init_args={"metric": "l2"})
    torch.testing.assert_close(hooked(v, PROMPTS), TemporalConsistency("l2")(v, PROMPTS))
    with pytest.raises(ValueError, match="package.module:name"):
        VideoModelReward("no_colon_here")
    with pytest.raises(OSError, match="cannot load reward 'video_model' scorer 'nowhere_pkg.mod:f'"):
        VideoModelReward("nowhere_pkg.mod:f")
    with pytest.raises(TypeError, match="must be callable"):
        VideoModelReward(42)  # type: ignore[arg-type]


def test_registry_builds_video_rewards_and_refuses_the_wrong_kind() -> None:
    assert {"frame_average", "temporal_consistency", "video_model"} <= set(REWARDS)
    built = build_rewards(
        {"frame_average": 1.0, "temporal_consistency": 0.5}, {"frame_average": {"frames": 2}}, video=True
    )
    assert isinstance(built, VideoMultiReward) and built.rewards["frame_average"].frames == 2
    assert isinstance(build_rewards({"brightness": 1.0}, {}), MultiReward)
    with pytest.raises(ValueError, match="mixes image and video rewards"):
        build_rewards({"brightness": 1.0, "temporal_consistency": 1.0}, {}, video=True)
    with pytest.raises(ValueError, match="the adapter makes videos but reward 'brightness' scores images"):
        build_rewards("brightness", {}, video=True)
    with pytest.raises(ValueError, match="scores videos but the adapter makes images"):
        build_rewards("temporal_consistency", {})


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        (torch.rand(3, 3, 8, 8), r"scores videos \[B, F, 3, H, W\], got \[3, 3, 8, 8\]"),
        (torch.rand(3, 2, 3, 8, 8) * 2, r"must lie in \[0, 1\]"),
        (torch.full((3, 2, 3, 8, 8), float("nan")), "contain NaN or inf"),
        (torch.rand(2, 2, 3, 8, 8), "got 2 images but 3 prompts"),
    ],
)
def test_bad_videos_are_refused_in_one_line(bad: torch.Tensor, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        TemporalConsistency()(bad, PROMPTS)
