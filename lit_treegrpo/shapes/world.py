"""The Shapes world: procedural images of one coloured shape on a dark background, with prompts."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.90, 0.12, 0.12),
    "green": (0.15, 0.75, 0.20),
    "blue": (0.15, 0.30, 0.95),
    "yellow": (0.95, 0.90, 0.15),
    "magenta": (0.90, 0.15, 0.85),
    "cyan": (0.15, 0.85, 0.90),
    "white": (0.95, 0.95, 0.95),
    "orange": (0.98, 0.55, 0.10),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
SIZES: dict[str, tuple[float, float]] = {  # extent / canvas side
    "small": (0.30, 0.42),
    "medium": (0.42, 0.56),
    "large": (0.56, 0.70),
}
SIZE_WORDS: tuple[str, ...] = ("small", "large")  # "medium" has no word: it is the unmarked size
POSITIONS: tuple[str, ...] = ("on the left", "on the right", "at the top", "at the bottom")
REGION = 0.42  # a position phrase holds when the centre lies within this fraction of that side
BACKGROUND = (0.05, 0.25)  # grey level range of the background
BACKGROUND_JITTER = 0.02  # per-channel tint of the background
MARGIN = 0.5  # pixels kept free between a shape's bounding box and the canvas border

_SHAPE_IDS = {name: i for i, name in enumerate(SHAPES)}
_COLOUR_IDS = {name: i for i, name in enumerate(COLOURS)}


class ShapeSpec(NamedTuple):
    """What a prompt asks for; ``size`` / ``position`` are ``None`` when the prompt leaves them free."""

    colour: str
    shape: str
    size: str | None = None
    position: str | None = None

    @property
    def prompt(self) -> str:
        """The canonical prompt of this spec (``an`` before a vowel)."""
        words = [w for w in (self.size, self.colour, self.shape) if w]
        article = "an" if words[0][0] in "aeiou" else "a"
        return " ".join([article, *words] + ([self.position] if self.position else []))


class Scenes(NamedTuple):
    """A batch of scenes, one entry per image (tensors are [B])."""

    shape: Tensor  # long, index into SHAPES
    colour: Tensor  # long, index into COLOURS
    extent: Tensor  # float, bounding-box side in pixels
    cx: Tensor  # float, bounding-box centre, pixels from the left edge
    cy: Tensor  # float, pixels from the top edge
    background: Tensor  # [B, 3] float, background colour
    prompts: list[str]


def all_prompts() -> list[str]:
    """Every prompt of the grammar (8 colours x 3 shapes x 3 sizes x 5 positions = 360), in a
    fixed order: colour, shape, size (none, small, large), position (none, left, right, top, bottom)."""
    return [
        ShapeSpec(colour, shape, size, position).prompt
        for colour in COLOURS
        for shape in SHAPES
        for size in (None, *SIZE_WORDS)
        for position in (None, *POSITIONS)
    ]


def parse_prompt(prompt: str) -> ShapeSpec:
    """Read a prompt of the grammar back into a :class:`ShapeSpec` (case and spacing ignored)."""
    words = prompt.lower().split()
    rest = words[1:] if words and words[0] in ("a", "an") else words
    size = rest[0] if rest and rest[0] in SIZE_WORDS else None
    rest = rest[1:] if size else rest
    position = " ".join(rest[2:]) or None
    if len(rest) < 2 or rest[0] not in COLOURS or rest[1] not in SHAPES or (position and position not in POSITIONS):
        raise ValueError(
            f"{prompt!r} is not a Shapes-world prompt: expected 'a [small|large] <colour> <shape> "
            f"[<position>]' with colour in {', '.join(COLOURS)}, shape in {', '.join(SHAPES)} and "
            f"position in {', '.join(POSITIONS)}"
        )
    return ShapeSpec(rest[0], rest[1], size, position)


# ---------------------------------------------------------------------------------------------
# rendering
# ---------------------------------------------------------------------------------------------


def coverage(shape: Tensor, extent: Tensor, cx: Tensor, cy: Tensor, image_size: int, supersample: int = 4) -> Tensor:
    """Anti-aliased coverage [B, H, W] in [0, 1] of shapes [B] (indices into SHAPES) with bounding-box side ``extent``
    [B] centred at ``(cx, cy)`` [B] (pixels; pixel ``i`` spans ``[i, i + 1)``)."""
    n = image_size * supersample
    device = extent.device
    u = (torch.arange(n, device=device, dtype=torch.float32) + 0.5) / supersample  # [n] sample coords
    x = u.view(1, 1, n) - cx.float().view(-1, 1, 1)  # [B, 1, n] offset from the centre
    y = u.view(1, n, 1) - cy.float().view(-1, 1, 1)  # [B, n, 1]
    h = extent.float().view(-1, 1, 1) / 2  # [B, 1, 1] half extent
    circle = x * x + y * y <= h * h  # [B, n, n]
    square = (x.abs() <= h) & (y.abs() <= h)
    # apex at y = -h, base at y = +h; the half-width grows from 0 to h over the height 2h
    triangle = (y <= h) & (x.abs() <= (y + h) / 2)
    masks = torch.stack([circle, square, triangle], dim=1)  # [B, 3, n, n]
    picked = masks.gather(1, shape.view(-1, 1, 1, 1).expand(-1, 1, n, n)).squeeze(1)  # [B, n, n]
    return torch.nn.functional.avg_pool2d(picked.float().unsqueeze(1), supersample).squeeze(1)  # [B, H, W]


def render(scenes: Scenes, image_size: int, supersample: int = 4) -> Tensor:
    """Images [B, 3, H, W] in [0, 1] of ``scenes``: the colour blended over the background by the shape's coverage."""
    cov = coverage(scenes.shape, scenes.extent, scenes.cx, scenes.cy, image_size, supersample)  # [B, H, W]
    palette = torch.tensor(list(COLOURS.values()), device=cov.device)  # [K, 3]
    fg = palette[scenes.colour].view(-1, 3, 1, 1)  # [B, 3, 1, 1]
    bg = scenes.background.to(cov.device).view(-1, 3, 1, 1)  # [B, 3, 1, 1]
    return bg + cov.unsqueeze(1) * (fg - bg)  # [B, 3, H, W]


# ---------------------------------------------------------------------------------------------
# sampling
# ---------------------------------------------------------------------------------------------


def _uniform(lo: Tensor | float, hi: Tensor | float, n: int, generator: torch.Generator | None) -> Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=generator)  # [n]


def centre_range(extent: Tensor, image_size: int) -> tuple[Tensor, Tensor]:
    """Lowest and highest bounding-box centre [B] that keeps the shape ``MARGIN`` inside the canvas."""
    lo = extent / 2 + MARGIN
    return lo, image_size - lo


def position_holds(position: str, cx: Tensor, cy: Tensor, image_size: int) -> Tensor:
    """Whether centres ``(cx, cy)`` [B] satisfy a position phrase (bool [B])."""
    W = image_size
    return {
        "on the left": cx < REGION * W,
        "on the right": cx > (1 - REGION) * W,
        "at the top": cy < REGION * W,
        "at the bottom": cy > (1 - REGION) * W,
    }[position]


def size_of(extent: Tensor, image_size: int) -> list[str]:
    """The size class (``small`` / ``medium`` / ``large``) of each extent [B] in pixels."""
    rel = (extent / image_size).tolist()
    return ["small" if r < SIZES["medium"][0] else "large" if r >= SIZES["large"][0] else "medium" for r in rel]


def sample_scenes(
    n: int,
    image_size: int,
    generator: torch.Generator | None = None,
    *,
    size_word_prob: float = 0.5,
    position_word_prob: float = 0.5,
) -> Scenes:
    """``n`` random scenes and their prompts (CPU tensors; a pure function of the generator state)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    for name, p in (("size_word_prob", size_word_prob), ("position_word_prob", position_word_prob)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {p}")
    shape = torch.randint(len(SHAPES), (n,), generator=generator)
    colour = torch.randint(len(COLOURS), (n,), generator=generator)
    size_class = torch.randint(len(SIZES), (n,), generator=generator)
    bounds = torch.tensor(list(SIZES.values()))[size_class]  # [n, 2]
    extent = _uniform(bounds[:, 0], bounds[:, 1], n, generator) * image_size
    lo, hi = centre_range(extent, image_size)
    cx, cy = _uniform(lo, hi, n, generator), _uniform(lo, hi, n, generator)
    grey = _uniform(BACKGROUND[0], BACKGROUND[1], n, generator).view(n, 1)
    tint = (torch.rand(n, 3, generator=generator) * 2 - 1) * BACKGROUND_JITTER
    background = (grey + tint).clamp(0, 1)  # [n, 3]
    say_size = torch.rand(n, generator=generator) < size_word_prob
    say_position = torch.rand(n, generator=generator) < position_word_prob
    pick = torch.rand(n, generator=generator)  # which of the phrases that hold
    holds = torch.stack([position_holds(p, cx, cy, image_size) for p in POSITIONS], dim=1)  # [n, 4]
    sizes = size_of(extent, image_size)
    prompts = []
    for i in range(n):
        options = [p for p, ok in zip(POSITIONS, holds[i].tolist()) if ok]
        position = options[int(pick[i] * len(options))] if options and say_position[i] else None
        size = sizes[i] if say_size[i] and sizes[i] in SIZE_WORDS else None
        prompts.append(ShapeSpec(list(COLOURS)[colour[i]], SHAPES[shape[i]], size, position).prompt)
    return Scenes(shape, colour, extent, cx, cy, background, prompts)


def scenes_for(prompts: list[str], image_size: int, generator: torch.Generator | None = None) -> Scenes:
    """One random scene per prompt that satisfies it (its free attributes drawn as in :func:`sample_scenes`)."""
    specs = [parse_prompt(p) for p in prompts]
    n = len(specs)
    shape = torch.tensor([_SHAPE_IDS[s.shape] for s in specs])
    colour = torch.tensor([_COLOUR_IDS[s.colour] for s in specs])
    classes = [s.size or ("small", "medium", "large")[int(torch.randint(3, (), generator=generator))] for s in specs]
    bounds = torch.tensor([SIZES[c] for c in classes])  # [n, 2]
    extent = _uniform(bounds[:, 0], bounds[:, 1], n, generator) * image_size
    lo, hi = centre_range(extent, image_size)
    near, far = REGION * image_size, (1 - REGION) * image_size
    cx_lo, cx_hi, cy_lo, cy_hi = lo.clone(), hi.clone(), lo.clone(), hi.clone()
    for i, s in enumerate(specs):  # narrow the centre's range to the region the phrase names
        if s.position == "on the left":
            cx_hi[i] = min(float(hi[i]), near)
        elif s.position == "on the right":
            cx_lo[i] = max(float(lo[i]), far)
        elif s.position == "at the top":
            cy_hi[i] = min(float(hi[i]), near)
        elif s.position == "at the bottom":
            cy_lo[i] = max(float(lo[i]), far)
    cx, cy = _uniform(cx_lo, cx_hi, n, generator), _uniform(cy_lo, cy_hi, n, generator)
    grey = _uniform(BACKGROUND[0], BACKGROUND[1], n, generator).view(n, 1)
    tint = (torch.rand(n, 3, generator=generator) * 2 - 1) * BACKGROUND_JITTER
    return Scenes(shape, colour, extent, cx, cy, (grey + tint).clamp(0, 1), [s.prompt for s in specs])


def expected_area(shape: str, extent: float) -> float:
    """Exact area in pixels of a shape of bounding-box side ``extent``."""
    return {"circle": math.pi / 4, "square": 1.0, "triangle": 0.5}[shape] * extent * extent
