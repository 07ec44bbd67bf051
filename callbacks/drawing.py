"""Captions drawn into images, with PIL's built-in bitmap font (nothing downloaded): the captioned
sample grid (:func:`captioned_grid`) and the picture of one rollout tree (:func:`draw_tree`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

BACKGROUND = (255, 255, 255)
INK = (20, 20, 20)
GREY = (170, 170, 170)
POSITIVE = (0, 130, 60)  # edges with a positive advantage
NEGATIVE = (200, 40, 40)  # ... and a negative one
LINE_H = 12  # pixels per text line of the bitmap font (11 px glyphs + 1)


def font() -> Any:
    """PIL's built-in bitmap font (6 x 11 px glyphs); no file is read or downloaded."""
    from PIL import ImageFont

    loader = getattr(ImageFont, "load_default_imagefont", None)  # Pillow >= 10.1
    return loader() if loader is not None else ImageFont.load_default()


def text_width(text: str, face: Any) -> int:
    left, _, right, _ = face.getbbox(text)
    return int(right - left)


def wrap(text: str, width_px: int, face: Any) -> list[str]:
    """``text`` broken at spaces into lines no wider than ``width_px`` (a longer word is cut)."""
    lines: list[str] = []
    current = ""
    for word in text.split():
        trial = f"{current} {word}".strip()
        if text_width(trial, face) <= width_px or not current:
            current = trial
        else:
            lines.append(current)
            current = word
        while text_width(current, face) > width_px and len(current) > 1:  # a word wider than the column
            cut = max(1, int(len(current) * width_px / max(text_width(current, face), 1)))
            lines.append(current[:cut])
            current = current[cut:]
    return lines + ([current] if current else [])


def still(image: Tensor) -> Tensor:
    """[3, H, W] of an image, or the middle frame of a video [F, 3, H, W]."""
    if image.ndim == 4:
        return image[image.shape[0] // 2]
    if image.ndim != 3:
        raise ValueError(f"expected an image [3, H, W] or a video [F, 3, H, W], got shape {tuple(image.shape)}")
    return image


def to_pil(image: Tensor, scale: int = 1) -> Any:
    """A PIL RGB image of ``image`` ([3, H, W] or a video, see :func:`still`) in [0, 1], enlarged
    ``scale`` times (nearest neighbour, so small images stay sharp)."""
    from PIL import Image

    pixels = (still(image).detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu()
    picture = Image.fromarray(pixels.numpy(), mode="RGB")
    if scale > 1:
        picture = picture.resize((picture.width * scale, picture.height * scale), Image.NEAREST)
    return picture


def fmt(value: float) -> str:
    """A reward or advantage in at most 6 characters."""
    if not math.isfinite(value):
        return str(value)
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.3g}"


def captioned_grid(
    images: Tensor,
    prompts: Sequence[str],
    column_labels: Sequence[str],
    rewards: Tensor | None,
    padding: int = 2,
    title: str = "",
) -> Any:
    """The sample grid with its captions, as a PIL image: ``images`` [R, C, 3, H, W] in [0, 1] (row
    ``r`` is ``prompts[r]``, column ``c`` is ``column_labels[c]``), the prompt written left of each
    row, the column labels above, and under every image its reward (``rewards`` [R, C]) if given."""
    from PIL import Image, ImageDraw

    face = font()
    R, C, _, H, W = images.shape
    label_w = 150  # the prompt column: ~25 characters a line
    header = LINE_H * (2 if title else 1) + padding
    below = LINE_H if rewards is not None else 0
    cell_w, cell_h = max(W, 36) + padding, H + below + padding
    canvas = Image.new("RGB", (label_w + C * cell_w + padding, header + R * cell_h + padding), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    if title:
        draw.text((padding, 0), title, fill=INK, font=face)
    for c, label in enumerate(column_labels):
        draw.text((label_w + c * cell_w + padding, header - LINE_H - padding // 2), label, fill=INK, font=face)
    for r, prompt in enumerate(prompts):
        top = header + r * cell_h + padding
        lines = wrap(prompt, label_w - 2 * padding, face)[: max(1, (H + below) // LINE_H)]
        for i, line in enumerate(lines):
            draw.text((padding, top + i * LINE_H), line, fill=INK, font=face)
        for c in range(C):
            left = label_w + c * cell_w + padding
            canvas.paste(to_pil(images[r, c]), (left, top))
            if rewards is not None:
                draw.text((left, top + H), fmt(float(rewards[r, c])), fill=INK, font=face)
    return canvas


def _leaf_ranges(edge_parent: Tensor, leaf_edge: Tensor) -> tuple[list[float], list[int]]:
    """Per edge: the mean index of the leaves below it (its x position, in leaf columns) and
    how many leaves it has below."""
    E = edge_parent.shape[0]
    total, count = [0.0] * E, [0] * E
    for leaf, edge in enumerate(leaf_edge.tolist()):
        while edge >= 0:
            total[edge] += leaf
            count[edge] += 1
            edge = int(edge_parent[edge])
    return [t / max(n, 1) for t, n in zip(total, count)], count


def _root_positions(edge_parent: Tensor, edge_source: Tensor, centre: Any) -> dict[int, float]:
    """The column of each root: one per rollout source of the first edges (num_trees per prompt), above
    the middle of its first edges."""
    E = edge_parent.shape[0]
    root_x: dict[int, float] = {}
    for e in range(E):
        if int(edge_parent[e]) < 0:
            root_x.setdefault(int(edge_source[e]), 0.0)
    for source in root_x:
        members = [centre[e] for e in range(E) if int(edge_parent[e]) < 0 and int(edge_source[e]) == source]
        root_x[source] = sum(members) / len(members)
    return root_x


def _draw_edge(
    draw: Any, face: Any, start: tuple[int, int], end: tuple[int, int], advantage: float, kept: bool
) -> tuple[int, int, str, tuple[int, int, int]]:
    """One edge from ``start`` to ``end``, coloured by its advantage's sign (grey and crossed when
    pruned); returns where and how its advantage label goes."""
    (x0, y0), (x1, y1) = start, end
    colour = GREY if not kept else (POSITIVE if advantage >= 0 else NEGATIVE)
    draw.line((x0, y0, x1, y1), fill=colour, width=2 if kept else 1)
    draw.ellipse((x1 - 3, y1 - 3, x1 + 3, y1 + 3), fill=colour)
    if not kept:  # the pruned mark, on the edge's midpoint
        mx, my = (x0 + x1) // 2, (y0 + y1) // 2
        draw.line((mx - 4, my - 4, mx + 4, my + 4), fill=NEGATIVE, width=2)
        draw.line((mx - 4, my + 4, mx + 4, my - 4), fill=NEGATIVE, width=2)
    text = fmt(advantage)
    return x1 - text_width(text, face) // 2, y1 + 4, text, colour


def _canvas(width: int, height: int) -> tuple[Any, Any]:
    """A blank image (at least 420 pixels wide) and its drawing context."""
    from PIL import Image, ImageDraw

    canvas = Image.new("RGB", (max(width, 420), height), BACKGROUND)
    return canvas, ImageDraw.Draw(canvas)


def draw_tree(
    *,
    edge_parent: Tensor,
    edge_source: Tensor,
    edge_depth: Tensor,
    edge_step: Tensor,
    advantages: Tensor,
    keep: Tensor,
    leaf_edge: Tensor,
    leaf_images: Tensor,
    rewards: Tensor,
    title: Sequence[str],
    scale: int = 1,
) -> Any:
    """One prompt's rollout tree as a PIL image: the root(s) on top, one row per depth of recorded
    edges (labelled with the steps they sample), each edge coloured by its advantage's sign (pruned:
    grey, crossed), and under each leaf its image and reward."""
    face = font()
    L, E = leaf_edge.shape[0], edge_parent.shape[0]
    thumbs = [to_pil(leaf_images[i], scale) for i in range(L)]
    th = max(t.height for t in thumbs)
    col = max(max(t.width for t in thumbs), 40) + 8  # pixels per leaf column (an advantage label is 6 characters)
    levels = int(edge_depth.max()) + 1 if E else 0
    row_h = 3 * LINE_H + 10
    margin_left, top = 60, LINE_H * len(title) + 14
    canvas, draw = _canvas(margin_left + L * col + 8, top + (levels + 1) * row_h + th + 2 * LINE_H + 8)
    for i, line in enumerate(title):
        draw.text((6, 4 + i * LINE_H), line, fill=INK, font=face)
    centre, _ = _leaf_ranges(edge_parent, leaf_edge)

    def x_of(position: float) -> int:
        return int(margin_left + position * col + col / 2)

    def y_of(level: int) -> int:  # level -1: the roots
        return top + (level + 1) * row_h + LINE_H // 2

    root_x = _root_positions(edge_parent, edge_source, centre)
    for level in range(-1, levels):  # each row's label: the denoising steps its edges sample
        steps = sorted({int(edge_step[e]) for e in range(E) if int(edge_depth[e]) == level})
        label = "root" if level < 0 else "t=" + ",".join(map(str, steps[:3])) + ("..." if len(steps) > 3 else "")
        draw.text((6, y_of(level) - LINE_H // 2), label, fill=INK, font=face)
    for x in root_x.values():
        cx, cy = x_of(x), y_of(-1)
        draw.ellipse((cx - 4, cy - 4, cx + 4, cy + 4), fill=INK)
    labels = []  # drawn over the lines, on white
    for e in range(E):
        parent, level = int(edge_parent[e]), int(edge_depth[e])
        start = (x_of(root_x[int(edge_source[e])] if parent < 0 else centre[parent]), y_of(level - 1))
        end = (x_of(centre[e]), y_of(level))
        labels.append(_draw_edge(draw, face, start, end, float(advantages[e]), bool(keep[e])))
    for x, y, text, colour in labels:
        draw.rectangle((x - 1, y, x + text_width(text, face), y + LINE_H - 1), fill=BACKGROUND)
        draw.text((x, y), text, fill=colour, font=face)
    leaves_top = y_of(levels - 1) + 3 * LINE_H
    for i, thumb in enumerate(thumbs):
        edge = int(leaf_edge[i])
        above = (x_of(centre[edge]), y_of(int(edge_depth[edge])) + LINE_H + 4) if edge >= 0 else None
        _draw_leaf(canvas, draw, face, thumb, (x_of(i), leaves_top), above, float(rewards[i]), th)
    return canvas


def _draw_leaf(
    canvas: Any, draw: Any, face: Any, thumb: Any, at: tuple[int, int], above: Any, reward: float, height: int
) -> None:
    """A leaf's image centred at ``at`` (x, top), joined to its last edge's end ``above``, its reward under it."""
    x, top = at
    if above is not None:
        draw.line((*above, x, top), fill=GREY)
    canvas.paste(thumb, (x - thumb.width // 2, top))
    text = fmt(reward)
    draw.text((x - text_width(text, face) // 2, top + height + 2), text, fill=INK, font=face)
