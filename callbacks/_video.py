"""Video summaries without moviepy: an animated GIF (PIL) in a TensorBoard image summary, and a
filmstrip of frames."""

from __future__ import annotations

import io
from typing import Any

import torch
from torch import Tensor


def gif_bytes(frames: Tensor, fps: int) -> bytes:
    """``frames`` [F, H, W, 3] uint8 -> an animated GIF that loops forever, ``fps`` frames a second."""
    from PIL import Image

    images = [Image.fromarray(f.numpy()) for f in frames]
    out = io.BytesIO()
    duration = max(1, round(1000 / fps))  # milliseconds per frame
    images[0].save(out, format="GIF", save_all=True, append_images=images[1:], duration=duration, loop=0)
    return out.getvalue()


def add_gif(writer: Any, tag: str, frames: Tensor, global_step: int, fps: int) -> None:
    """Write ``frames`` [F, H, W, 3] uint8 to ``writer`` (a ``SummaryWriter``) as an animated
    image summary, the record ``add_video`` writes when moviepy is installed."""
    from torch.utils.tensorboard.summary import Summary

    frame_count, height, width, channels = frames.shape
    image = Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=gif_bytes(frames, fps))
    writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), global_step)


def strip_frames(num_frames: int, max_frames: int) -> list[int]:
    """At most ``max_frames`` evenly spaced frame indices, first and last included."""
    if num_frames <= max_frames:
        return list(range(num_frames))
    return torch.linspace(0, num_frames - 1, max_frames).round().long().tolist()
