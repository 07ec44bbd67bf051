"""Where the callbacks' images, GIFs and text go: every logger of the Trainer that can take them."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Protocol

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from ._video import add_gif, gif_bytes


class MediaWriter(Protocol):
    """What the callbacks write through (rank zero only)."""

    def image(self, tag: str, pixels: np.ndarray, step: int) -> None:
        """``pixels`` [H, W, 3] uint8 as the image ``tag`` at ``step``."""

    def gif(self, tag: str, frames: Tensor, step: int, fps: int) -> None:
        """``frames`` [F, H, W, 3] uint8 as an animated GIF ``tag`` at ``step``."""

    def text(self, tag: str, text: str, step: int) -> None:
        """Markdown ``text`` as ``tag`` at ``step``."""

    def flush(self) -> None:
        """Make what was written visible now (a run may be killed before it ends)."""


class TensorBoardMedia:
    def __init__(self, logger: TensorBoardLogger) -> None:
        self.writer = logger.experiment  # SummaryWriter

    def image(self, tag: str, pixels: np.ndarray, step: int) -> None:
        self.writer.add_image(tag, pixels, global_step=step, dataformats="HWC")

    def gif(self, tag: str, frames: Tensor, step: int, fps: int) -> None:
        add_gif(self.writer, tag, frames, step, fps)

    def text(self, tag: str, text: str, step: int) -> None:
        self.writer.add_text(tag, text, global_step=step)

    def flush(self) -> None:
        self.writer.flush()


class WandbMedia:
    """Images and GIFs as ``wandb.Image`` / ``wandb.Video`` at ``trainer/global_step`` = the
    iteration (the x-axis Lightning gives the scalars too), text as a one-cell table."""

    def __init__(self, logger: WandbLogger) -> None:
        self.logger = logger

    def image(self, tag: str, pixels: np.ndarray, step: int) -> None:
        self.logger.log_image(tag, [pixels], step=step)

    def gif(self, tag: str, frames: Tensor, step: int, fps: int) -> None:
        import wandb

        self.logger.log_metrics({tag: wandb.Video(io.BytesIO(gif_bytes(frames, fps)), format="gif")}, step=step)

    def text(self, tag: str, text: str, step: int) -> None:
        self.logger.log_text(tag, columns=["text"], data=[[text]], step=step)

    def flush(self) -> None:
        pass  # the wandb service writes as it goes


class MLflowMedia:
    """Images and GIFs as artifacts of the run: images through ``log_image`` (key and step, shown
    by MLflow's image view), GIFs and text as files ``<tag>/<step>.gif`` / ``.md``."""

    def __init__(self, logger: MLFlowLogger) -> None:
        self.client, self.run_id = logger.experiment, logger.run_id

    def image(self, tag: str, pixels: np.ndarray, step: int) -> None:
        self.client.log_image(self.run_id, pixels, key=tag, step=step)

    def gif(self, tag: str, frames: Tensor, step: int, fps: int) -> None:
        self._file(tag, f"{step:06d}.gif", gif_bytes(frames, fps))

    def text(self, tag: str, text: str, step: int) -> None:
        self._file(tag, f"{step:06d}.md", text.encode())

    def _file(self, tag: str, name: str, data: bytes) -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / name
            path.write_bytes(data)
            self.client.log_artifact(self.run_id, str(path), artifact_path=tag)

    def flush(self) -> None:
        pass  # every call above has stored its file


def media_writer(logger: Logger) -> MediaWriter | None:
    """The writer for ``logger``; ``None`` for a logger that takes scalars only."""
    if isinstance(logger, TensorBoardLogger):
        return TensorBoardMedia(logger)
    if isinstance(logger, WandbLogger):
        return WandbMedia(logger)
    if isinstance(logger, MLFlowLogger):
        return MLflowMedia(logger)
    return None


class MediaWriters:
    """The :class:`MediaWriter` of every logger of the trainer that takes images; warns once
    (naming ``owner``) when there is none, so that images and tables are skipped knowingly."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._warned = False

    def __call__(self, trainer: pl.Trainer) -> list[MediaWriter]:
        writers = [w for w in (media_writer(lg) for lg in trainer.loggers) if w is not None]
        if not writers and not self._warned:
            self._warned = True
            kinds = [type(lg).__name__ for lg in trainer.loggers] or ["no logger"]
            rank_zero_warn(
                f"{self.owner} writes images and text to TensorBoard, Weights & Biases or MLflow, and this "
                f"trainer has {', '.join(kinds)}; they are skipped (add one of those loggers to see them)"
            )
        return writers


#: the largest ``scale`` of a logged picture: it exists to make 16 px images legible (the Shapes world's need 3-4)
MAX_SCALE = 64
#: the widest ``padding`` between a grid's images: a frame, not a canvas (3455 px asked for 5.6 GiB)
MAX_PADDING = 64
#: the most pixels of a grid's enlarged images together (float32 RGB: 3 GiB), checked before they are enlarged
MAX_GRID_PIXELS = 2**28


def check_scale(owner: str, scale: int) -> int:
    """``scale`` as an int, refused in one line outside 1 .. :data:`MAX_SCALE`."""
    if not 1 <= scale <= MAX_SCALE:
        raise ValueError(
            f"{owner}.scale must be an integer in 1 .. {MAX_SCALE} (it enlarges small images to be legible), got {scale}"
        )
    return int(scale)


def check_enlarged(owner: str, images: int, height: int, width: int, scale: int) -> None:
    """Refuse, before any is allocated, ``images`` pictures of ``height`` x ``width`` enlarged ``scale`` times that
    together exceed :data:`MAX_GRID_PIXELS`."""
    pixels = images * height * width * scale * scale
    if pixels > MAX_GRID_PIXELS:
        raise ValueError(
            f"{owner}: {images} image(s) of {height} x {width} enlarged {scale} times are {pixels:,} pixels, more "
            f"than the {MAX_GRID_PIXELS:,} a grid may hold; lower {owner}.scale or give fewer prompts or seeds"
        )


def check_padding(owner: str, padding: int) -> int:
    """``padding`` as an int, refused in one line outside 0 .. :data:`MAX_PADDING`."""
    if not 0 <= padding <= MAX_PADDING:
        raise ValueError(
            f"{owner}.padding must be an integer in 0 .. {MAX_PADDING} (pixels between images), got {padding}"
        )
    return int(padding)
