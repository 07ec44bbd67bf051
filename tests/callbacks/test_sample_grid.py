"""SampleGridLogger: the grid layout by hand, option checks, loggers without images."""

from __future__ import annotations

import pytest
import torch

from lit_treegrpo.callbacks import SampleGridLogger, make_grid

from .helpers import TRAIN_PROMPTS, StandIn, prompt_loader, trainer


def test_make_grid_hand_layout() -> None:
    # 2 rows x 3 columns of 1x2 images with value 10 r + c, padding 1 of value -1 -> 5 x 10
    images = torch.tensor([[10.0 * r + c for c in range(3)] for r in range(2)])  # [2, 3]
    images = images[:, :, None, None, None].expand(2, 3, 3, 1, 2)  # [R, C, 3, H=1, W=2]
    grid = make_grid(images, padding=1, pad_value=-1.0)
    assert grid.shape == (3, 5, 10)
    pad = [-1.0] * 10
    expected = torch.tensor(
        [
            pad,
            [-1, 0, 0, -1, 1, 1, -1, 2, 2, -1],
            pad,
            [-1, 10, 10, -1, 11, 11, -1, 12, 12, -1],
            pad,
        ]
    )
    for channel in grid:
        assert torch.equal(channel, expected)


def test_make_grid_without_padding_is_concatenation() -> None:
    images = torch.rand(3, 2, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    rows = [torch.cat(list(images[r]), dim=2) for r in range(3)]  # each [3, 4, 10]
    assert torch.equal(make_grid(images, padding=0), torch.cat(rows, dim=1))
    with pytest.raises(ValueError, match="rows, cols"):
        make_grid(images[0])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(prompts=[]), "SampleGridLogger.prompts"),
        (dict(prompts="a cat"), "SampleGridLogger.prompts"),
        (dict(seeds=[]), "SampleGridLogger.seeds"),
        (dict(every_n_steps=0), "SampleGridLogger.every_n_steps"),
        (dict(tag=""), "SampleGridLogger.tag"),
        (dict(padding=-1), "SampleGridLogger.padding"),
    ],
)
def test_invalid_options_are_named(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SampleGridLogger(**options)


def test_default_prompts_and_state_key() -> None:
    cb = SampleGridLogger()
    assert cb.prompts == ["a red circle", "a blue square", "a green triangle", "a photo of a cat"]
    assert cb.seeds == [0, 1]
    assert SampleGridLogger(tag="a").state_key != SampleGridLogger(tag="b").state_key


def test_without_a_logger_for_images_warns_once_and_still_writes_pngs(tmp_path) -> None:
    from lightning.pytorch.loggers import CSVLogger

    cb = SampleGridLogger(prompts=TRAIN_PROMPTS[:1], seeds=[0], every_n_steps=1)
    fit = trainer(tmp_path, 2, [cb], logger=CSVLogger(str(tmp_path)))
    skipped = "writes images and text to TensorBoard, Weights & Biases or MLflow, and this trainer has CSVLogger"
    with pytest.warns(UserWarning, match=skipped) as record:
        fit.fit(StandIn(), prompt_loader(TRAIN_PROMPTS))
    assert sum(skipped in str(w.message) for w in record) == 1
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == [
        "step_000000.png",
        "step_000001.png",
        "step_000002.png",
    ]


def test_a_video_grid_is_one_grid_per_frame_and_a_gif_round_trips() -> None:
    import io
    from types import SimpleNamespace

    from PIL import Image

    from lit_treegrpo.callbacks._video import gif_bytes, strip_frames

    def sample(prompts: list[str], seed: int) -> torch.Tensor:  # video [P, F=4, 3, H=2, W=3]: (10 p + seed + 2 f) / 40
        p = torch.arange(len(prompts), dtype=torch.float32)[:, None]
        f = torch.arange(4, dtype=torch.float32)[None, :]
        return ((10 * p + seed + 2 * f) / 40)[:, :, None, None, None].expand(len(prompts), 4, 3, 2, 3)

    cb = SampleGridLogger(prompts=["a", "b"], seeds=[0, 1], padding=1, scale=2)
    grid = cb.make(SimpleNamespace(sample=sample))
    assert grid.shape == (4, 3, 2 * 4 + 3, 2 * 6 + 3)  # [F, 3, rows * 2H + pads, cols * 2W + pads]
    for f in range(4):  # row 1 (prompt b), column 1 (seed 1), frame f
        assert torch.allclose(grid[f, :, 1 + 4 + 1, 1 + 6 + 1], torch.tensor((10 + 1 + 2 * f) / 40))
    assert strip_frames(9, 4) == [0, 3, 5, 8] and strip_frames(3, 8) == [0, 1, 2]
    frames = (grid.permute(0, 2, 3, 1) * 255).round().to(torch.uint8)  # [F, H, W, 3]
    gif = Image.open(io.BytesIO(gif_bytes(frames, fps=10)))
    assert gif.n_frames == 4 and gif.size == (15, 11) and gif.info["duration"] == 100
    with pytest.raises(ValueError, match="fps and strip_frames"):
        SampleGridLogger(fps=0)


@pytest.mark.parametrize("scale", [0, 65, 100_000])
def test_a_scale_past_the_bound_is_refused_before_anything_is_enlarged(scale: int) -> None:
    from lit_treegrpo.callbacks import TreeView

    with pytest.raises(ValueError, match=rf"^SampleGridLogger.scale must be an integer in 1 \.\. 64 .*got {scale}$"):
        SampleGridLogger(scale=scale)
    with pytest.raises(ValueError, match=rf"^TreeView.scale must be an integer in 1 \.\. 64 .*got {scale}$"):
        TreeView(scale=scale)


def test_a_grid_whose_enlarged_images_pass_the_pixel_bound_is_refused_before_they_are_made(monkeypatch) -> None:
    from lit_treegrpo.callbacks import _media

    class Sampler:  # what the grid calls: one [P, 3, H, W] batch per seed
        def sample(self, prompts, seed):
            return torch.zeros(len(prompts), 3, 16, 16)

    grid = SampleGridLogger(prompts=["a", "b"], seeds=[0, 1, 2], scale=4)
    assert grid.cells(Sampler()).shape == (2, 3, 3, 64, 64)
    # 2 prompts x 3 seeds x (16 x 4)^2 = 24,576 pixels, one more than this bound
    monkeypatch.setattr(_media, "MAX_GRID_PIXELS", 24_575)
    enlarged = []
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", lambda *a, **k: enlarged.append(a))
    with pytest.raises(ValueError, match=r"^SampleGridLogger: 6 image\(s\) of 16 x 16 enlarged 4 times are 24,576"):
        grid.cells(Sampler())
    assert enlarged == []
