"""What ``predict`` writes: one PNG per prompt (an animated GIF for a video), named after the batch,
the position and the prompt, in a folder of its own (``predictions``, ``predictions-2``, ...)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor


def save_predictions(
    images: Tensor, prompts: Sequence[str], folder: Path, batch_index: int, fps: int = 16
) -> list[str]:
    """Write ``images`` [P, 3, H, W] in [0, 1] as ``<folder>/<batch>_<i>_<prompt slug>.png``, or videos [P, F, 3, H, W]
    as looping GIFs at ``fps`` (``.gif``); returns the paths."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    pixels = (images.movedim(-3, -1) * 255).round().to(torch.uint8).cpu().numpy()  # [P, (F,) H, W, 3]
    paths = []
    for i, (prompt, array) in enumerate(zip(prompts, pixels)):
        path = folder / f"{batch_index:05d}_{i:02d}_{slug(prompt)}.{'gif' if images.ndim == 5 else 'png'}"
        if images.ndim == 5:
            frames = [Image.fromarray(f) for f in array]
            frames[0].save(path, save_all=True, append_images=frames[1:], duration=round(1000 / fps), loop=0)
        else:
            Image.fromarray(array).save(path)
        paths.append(str(path))
    return paths


def slug(text: str, length: int = 40) -> str:
    """``"A red circle!"`` -> ``"a_red_circle"``: a file-name-safe prefix of ``text``."""
    return "".join(c if c.isalnum() else "_" for c in text.lower())[:length].strip("_") or "prompt"
