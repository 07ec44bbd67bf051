"""A fixed grid of deterministic samples, logged to TensorBoard as training goes."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor
from typing_extensions import override

from lit_treegrpo.common.text import check_prompt, cut_prompts

from ._media import MediaWriters, check_enlarged, check_padding, check_scale
from ._video import gif_bytes, strip_frames
from .drawing import captioned_grid
from .ema import EMA
from .iterations import EveryNIterations

DEFAULT_PROMPTS = ("a red circle", "a blue square", "a green triangle", "a photo of a cat")


def make_grid(images: Tensor, padding: int = 2, pad_value: float = 1.0) -> Tensor:
    """Tile ``images`` [R, C, 3, H, W] into one image [3, R*H + (R+1)*p, C*W + (C+1)*p]: row ``r``,
    column ``c`` at ``[p + r*(H+p) : ..., p + c*(W+p) : ...]``, ``pad_value`` between and around."""
    if images.ndim != 5:
        raise ValueError(f"make_grid expects [rows, cols, channels, H, W], got shape {tuple(images.shape)}")
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    R, C, ch, H, W = images.shape
    p = padding
    grid = images.new_full((ch, R * H + (R + 1) * p, C * W + (C + 1) * p), pad_value)  # [ch, H', W']
    for r in range(R):
        for c in range(C):
            top, left = p + r * (H + p), p + c * (W + p)
            grid[:, top : top + H, left : left + W] = images[r, c]
    return grid


def to_uint8_hwc(image: Tensor) -> Tensor:
    """[3, H, W] in [0, 1] -> [H, W, 3] uint8 on the CPU, rounded to the nearest level."""
    return (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu()


class SampleGridLogger(EveryNIterations):
    """Every ``every_n_steps`` training steps, sample ``prompts`` x ``seeds`` and log one grid.

    Args:
        prompts: one grid row each (default: four simple prompts).
        seeds: one grid column each, passed to ``pl_module.sample(prompts, seed)``.
        every_n_steps: training steps between two grids.
        tag: TensorBoard tag of the image (the prompt list goes to ``<tag>/prompts``).
        save_png: also save each grid as a PNG file.
        padding: pixels between and around the images of the grid.
        scale: enlarge every image by this integer factor (nearest neighbour) before tiling, so
            that small images (the Shapes world's 16 px) are legible in TensorBoard.
        captions: draw the prompt left of each row, the seed above each column, the iteration on
            top and, when the module has a ``reward``, each image's reward under it (images only).
        fps: frames per second of the animated GIF of a video grid.
        strip_frames: frames of a video grid shown side by side in the filmstrip image.
    """

    def __init__(
        self,
        prompts: Sequence[str] | None = None,
        seeds: Sequence[int] = (0, 1),
        every_n_steps: int = 50,
        tag: str = "samples",
        save_png: bool = True,
        padding: int = 2,
        scale: int = 1,
        captions: bool = True,
        fps: int = 8,
        strip_frames: int = 8,
    ) -> None:
        if isinstance(prompts, str):
            raise ValueError(f"SampleGridLogger.prompts must be a list of prompts, got the string {prompts!r}")
        prompts = list(DEFAULT_PROMPTS if prompts is None else prompts)
        if not prompts:
            raise ValueError("SampleGridLogger.prompts must be a non-empty list of prompts")
        where = "SampleGridLogger.prompts"
        prompts = cut_prompts([check_prompt(p, f"{where}[{i}]") for i, p in enumerate(prompts)], where)
        if not seeds:
            raise ValueError("SampleGridLogger.seeds must be a non-empty list of seeds")
        if every_n_steps < 1:
            raise ValueError(f"SampleGridLogger.every_n_steps must be >= 1, got {every_n_steps}")
        if not tag:
            raise ValueError("SampleGridLogger.tag must be a non-empty string")
        self.prompts = prompts
        self.seeds = [int(s) for s in seeds]
        self.every_n_steps = every_n_steps
        self.tag = tag
        self.save_png = save_png
        self.padding = check_padding("SampleGridLogger", padding)
        self.scale = check_scale("SampleGridLogger", scale)
        self.captions = captions
        if fps < 1 or strip_frames < 1:
            raise ValueError(f"SampleGridLogger.fps and strip_frames must be >= 1, got {fps} and {strip_frames}")
        self.fps, self.strip_frames = int(fps), int(strip_frames)
        self.last_logged: int | None = None  # iteration of the latest grid
        self._writers = MediaWriters(f"SampleGridLogger(tag={tag!r})")
        self._prompts_written = False

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(tag=self.tag)

    # ------------------------------------------------------------------------ the grid
    def make(self, pl_module: pl.LightningModule, ema: EMA | None = None) -> Tensor:
        """The grid [3, H', W'] of the current weights (the EMA's if ``ema`` is given); for videos,
        one grid per frame [F, 3, H', W']."""
        return self._grid(self.cells(pl_module, ema))

    def _grid(self, cells: Tensor) -> Tensor:
        if cells.ndim == 5:  # [P, S, 3, H, W]
            return make_grid(cells, padding=self.padding)
        return torch.stack([make_grid(cells[:, :, f], padding=self.padding) for f in range(cells.shape[2])])

    def cells(self, pl_module: pl.LightningModule, ema: EMA | None = None) -> Tensor:
        """The images [P, S, 3, H, W] (videos [P, S, F, 3, H, W]) of the grid (prompts x seeds,
        enlarged by ``scale``)."""
        context = ema.swapped(pl_module) if ema is not None else contextlib.nullcontext()
        columns = []
        with torch.no_grad(), context:
            for seed in self.seeds:
                images = pl_module.sample(self.prompts, seed)  # [P, 3, H, W] or videos [P, F, 3, H, W]
                if images.ndim not in (4, 5) or images.shape[0] != len(self.prompts) or images.shape[-3] != 3:
                    raise ValueError(
                        f"pl_module.sample returned shape {tuple(images.shape)} for {len(self.prompts)} "
                        "prompts; expected [P, 3, H, W] or videos [P, F, 3, H, W]"
                    )
                images = images.detach().float().cpu()
                if self.scale > 1:
                    count = images.shape[0] * len(self.seeds) * (images.shape[1] if images.ndim == 5 else 1)
                    check_enlarged("SampleGridLogger", count, images.shape[-2], images.shape[-1], self.scale)
                    images = images.repeat_interleave(self.scale, dim=-2).repeat_interleave(self.scale, dim=-1)
                columns.append(images)
        return torch.stack(columns, dim=1)  # rows: prompts

    def captioned(self, pl_module: pl.LightningModule, cells: Tensor, iteration: int) -> Any:
        """The captioned grid (a PIL image) of ``cells`` [P, S, 3, H, W]."""
        P, S = cells.shape[:2]
        full = cells[:, :, :, :: self.scale, :: self.scale].flatten(0, 1)  # [P*S, 3, H, W] unscaled
        with torch.no_grad():
            scores = pl_module.score(full.to(pl_module.device), [p for p in self.prompts for _ in range(S)])
        rewards = scores.float().cpu().view(P, S)
        labels = [f"seed {s}" for s in self.seeds]
        title = f"iteration {iteration}" + ("   (reward under each image)" if rewards is not None else "")
        return captioned_grid(cells, self.prompts, labels, rewards, padding=max(self.padding, 2), title=title)

    def log_grid(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        iteration = pl_module.iteration
        cells = self.cells(pl_module, _ema_for_grids(trainer))
        self.last_logged = iteration
        if not trainer.is_global_zero:
            return
        frames = None
        if cells.ndim == 6:  # videos: a GIF of the grid per frame, and its filmstrip as the image
            grid = self._grid(cells)  # [F, 3, H', W']
            frames = torch.stack([to_uint8_hwc(f) for f in grid])  # [F, H', W', 3]
            pixels = to_uint8_hwc(
                make_grid(grid[strip_frames(len(grid), self.strip_frames)][None], padding=self.padding)
            )
        elif self.captions:
            pixels = torch.from_numpy(np.asarray(self.captioned(pl_module, cells, iteration)).copy())  # [H, W, 3]
        else:  # quantised once: TensorBoard and the PNG hold the same bytes
            pixels = to_uint8_hwc(make_grid(cells, padding=self.padding))
        for writer in self._writers(trainer):
            if not self._prompts_written:
                rows = "\n".join(f"| {r} | {_cell(p)} |" for r, p in enumerate(self.prompts))
                text = f"columns: seeds {self.seeds}\n\n| row | prompt |\n|---|---|\n{rows}"
                writer.text(f"{self.tag}/prompts", text, iteration)
            writer.image(self.tag, np.asarray(pixels), iteration)
            if frames is not None:
                writer.gif(f"{self.tag}/video", frames, iteration, self.fps)
            writer.flush()
        self._prompts_written = True
        if self.save_png:
            from PIL import Image

            folder = Path(trainer.default_root_dir) / "samples"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels.numpy()).save(folder / f"step_{iteration:06d}.png")
            if frames is not None:
                (folder / f"step_{iteration:06d}.gif").write_bytes(gif_bytes(frames, self.fps))

    # ------------------------------------------------------------------------ hooks: EveryNIterations
    def log_at(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.log_grid(trainer, pl_module)


def _ema_for_grids(trainer: pl.Trainer) -> EMA | None:
    emas = [cb for cb in trainer.callbacks if isinstance(cb, EMA)]
    if len(emas) > 1:
        raise ValueError(f"SampleGridLogger found {len(emas)} EMA callbacks; use one")
    return emas[0] if emas and "sample_grid" in emas[0].apply_on else None


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
