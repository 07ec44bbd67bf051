"""ShapesReward: a verifiable prompt-following score in [0, 1] for the Shapes world."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, NamedTuple

import torch
from torch import Tensor

from ..common.values import Range
from ..rewards.base import BatchSize, RewardModel, RewardScores, check_finite
from . import world
from .world import COLOURS, SHAPES, SIZES, ShapeSpec, parse_prompt

_TAU = 0.12  # colour residual scale: anti-aliasing keeps residuals ~0, a neighbouring colour is > 0.3
_DEAD = 0.06  # per-pixel stray mass below this is background texture, not a stray colour
_SHARP = 0.03  # IoU margin scale of the shape term
_UNEXPLAINED = 0.3  # residual above tau that makes a pixel fully stray


class ShapesAnalysis(NamedTuple):
    """Everything :class:`ShapesReward` measured, per image (tensors [B] unless noted)."""

    score: Tensor  # float in [0, 1]: presence * purity * shape * size * position
    presence: Tensor
    purity: Tensor
    shape_score: Tensor
    size_score: Tensor
    position_score: Tensor
    colour: Tensor  # long, index into COLOURS: the colour with the most mass
    shape: Tensor  # long, index into SHAPES: best-fitting template of the whole foreground
    iou: Tensor  # [B, 3] soft IoU of the requested colour's mask with each fitted template
    extent: Tensor  # fitted extent of the requested shape, pixels
    cx: Tensor  # fitted centre of the requested shape, pixels
    cy: Tensor
    colour_ok: Tensor  # bool: dominant colour is the requested one
    shape_ok: Tensor  # bool: the foreground's best template is the requested shape


def _border_median(images: Tensor) -> Tensor:
    """Median colour [B, 3] of the one-pixel frame of ``images`` [B, 3, H, W]."""
    top, bottom = images[:, :, 0, :], images[:, :, -1, :]  # [B, 3, W]
    left, right = images[:, :, 1:-1, 0], images[:, :, 1:-1, -1]  # [B, 3, H-2]
    return torch.cat([top, bottom, left, right], dim=2).median(dim=2).values  # [B, 3]


def _moment_fit(mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Extent [B, 3] (one per template) and centre [B, 3] x2 fitted to ``mask`` [B, H, W]."""
    B, H, W = mask.shape
    mass = mask.sum(dim=(1, 2)).clamp_min(1e-6)  # [B]
    xs = torch.arange(W, device=mask.device, dtype=mask.dtype) + 0.5  # [W] pixel centres
    ys = torch.arange(H, device=mask.device, dtype=mask.dtype) + 0.5  # [H]
    px, py = mask.sum(dim=1), mask.sum(dim=2)  # [B, W], [B, H] marginals
    mx, my = (px * xs).sum(1) / mass, (py * ys).sum(1) / mass  # [B]
    vx = (px * (xs - mx[:, None]) ** 2).sum(1) / mass  # [B]
    vy = (py * (ys - my[:, None]) ** 2).sum(1) / mass
    # coverage is the shape blurred by the one-pixel box, which adds 1/12 to each variance
    vx, vy = (vx - 1 / 12).clamp_min(1e-6), (vy - 1 / 12).clamp_min(1e-6)
    s = (vx * vy) ** 0.25  # [B] geometric mean of sigma_x, sigma_y
    k = torch.tensor([4.0, 12**0.5, 432**0.25], device=mask.device, dtype=mask.dtype)  # circle, square, triangle
    extent = s[:, None] * k  # [B, 3]
    cx = mx[:, None].expand(B, 3)
    cy = my[:, None] - torch.tensor([0.0, 0.0, 1.0], device=mask.device) * extent / 6  # [B, 3]
    return extent, cx, cy.contiguous()


def _template_iou(mask: Tensor, supersample: int = 4) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Soft IoU [B, 3] of ``mask`` [B, H, W] with each moment-fitted template, and the fits."""
    B, H, W = mask.shape
    extent, cx, cy = _moment_fit(mask)  # [B, 3] each
    shapes = torch.arange(3, device=mask.device).repeat(B)  # [B*3]
    templates = world.coverage(shapes, extent.reshape(-1), cx.reshape(-1), cy.reshape(-1), W, supersample)
    templates = templates.view(B, 3, H, W)
    m = mask.unsqueeze(1)  # [B, 1, H, W]
    inter = torch.minimum(m, templates).sum(dim=(2, 3))  # [B, 3]
    union = torch.maximum(m, templates).sum(dim=(2, 3)).clamp_min(1e-6)
    return inter / union, extent, cx, cy


def _ramp_inside(value: Tensor, lo: Tensor | float, hi: Tensor | float, slack: float) -> Tensor:
    """1 inside ``[lo, hi]``, falling linearly to 0 at ``slack`` outside."""
    outside = torch.relu(lo - value) + torch.relu(value - hi)
    return (1 - outside / slack).clamp(0, 1)


def _explained(x: Tensor) -> tuple[Tensor, Tensor]:
    """How well each palette colour explains each pixel of ``x`` [B, 3, H, W] over the background
    (``explain`` [B, K, H, W] in [0, 1]), and the squared residual of that explanation [B, K, H, W]."""
    palette = torch.tensor(list(COLOURS.values()), device=x.device)  # [K, 3]
    bg = _border_median(x)  # [B, 3]
    delta = x - bg[:, :, None, None]  # [B, 3, H, W]
    d = palette[None] - bg[:, None]  # [B, K, 3] from the background to each colour
    dd = (d * d).sum(-1).clamp_min(1e-4)  # [B, K]
    proj = torch.einsum("bchw,bkc->bkhw", delta, d) / dd[:, :, None, None]  # [B, K, H, W]
    alpha = proj.clamp(0, 1)
    delta2 = (delta * delta).sum(1, keepdim=True)  # [B, 1, H, W]
    resid2 = (delta2 + dd[:, :, None, None] * (alpha * alpha - 2 * alpha * proj)).clamp_min(0)  # [B, K, H, W]
    return alpha * torch.exp(-resid2 / _TAU**2), resid2


def _position_score(specs: list[ShapeSpec], ux: Tensor, uy: Tensor, slack: float) -> Tensor:
    """[B] how far inside its asked region each shape's centre (``ux``, ``uy`` [B], canvas fractions) lies."""
    near, far = world.REGION, 1 - world.REGION
    bounds = {  # (x range, y range) of the centre, as fractions of the canvas
        None: ((0.0, 1.0), (0.0, 1.0)),
        "on the left": ((0.0, near), (0.0, 1.0)),
        "on the right": ((far, 1.0), (0.0, 1.0)),
        "at the top": ((0.0, 1.0), (0.0, near)),
        "at the bottom": ((0.0, 1.0), (far, 1.0)),
    }
    box = torch.tensor([bounds[s.position] for s in specs], device=ux.device)  # [B, 2, 2]
    return _ramp_inside(ux, box[:, 0, 0], box[:, 0, 1], slack) * _ramp_inside(uy, box[:, 1, 0], box[:, 1, 1], slack)


def analyse(images: Tensor, specs: list[ShapeSpec], *, slack: float = 0.08) -> ShapesAnalysis:
    """Score ``images`` [B, 3, H, W] in [0, 1] (square) against ``specs`` (one per image)."""
    B, _, H, W = images.shape
    if H != W:
        raise ValueError(f"ShapesReward needs square images, got {H}x{W}")
    x = images.float()
    device = x.device
    explain, resid2 = _explained(x)  # [B, K, H, W] each

    want_colour = torch.tensor([list(COLOURS).index(s.colour) for s in specs], device=device)  # [B]
    want_shape = torch.tensor([SHAPES.index(s.shape) for s in specs], device=device)  # [B]
    own = explain[torch.arange(B, device=device), want_colour]  # [B, H, W]
    best, best_colour = explain.max(dim=1)  # [B, H, W]
    unexplained = ((resid2.min(dim=1).values.sqrt() - _TAU) / _UNEXPLAINED).clamp(0, 1)  # [B, H, W]
    foreground = torch.maximum(best, unexplained)  # [B, H, W]
    stray = torch.relu(foreground - own - _DEAD).sum(dim=(1, 2))  # [B]
    own_mass = own.sum(dim=(1, 2))  # [B]

    min_area = 0.5 * world.expected_area("triangle", SIZES["small"][0] * W)
    presence = (own_mass / min_area).clamp(max=1.0)
    purity = own_mass / (own_mass + stray + 1e-6)

    iou, extent, cx, cy = _template_iou(own)  # [B, 3] each
    rows = torch.arange(B, device=device)
    iou_req = iou[rows, want_shape]  # [B]
    others = iou.scatter(1, want_shape[:, None], -1.0).max(dim=1).values  # [B]
    shape_score = iou_req * torch.sigmoid((iou_req - others) / _SHARP)

    e, ux, uy = extent[rows, want_shape], cx[rows, want_shape], cy[rows, want_shape]  # [B]
    size_lo = torch.tensor([SIZES[s.size][0] if s.size else SIZES["small"][0] for s in specs], device=device)
    size_hi = torch.tensor([SIZES[s.size][1] if s.size else SIZES["large"][1] for s in specs], device=device)
    size_score = _ramp_inside(e / W, size_lo, size_hi, slack)
    position_score = _position_score(specs, ux / W, uy / W, slack)
    score = presence * purity * shape_score * size_score * position_score

    # what is drawn, whatever was asked: the colour with the most mass and the foreground's shape
    mass_per_colour = torch.zeros(B, len(COLOURS), device=device).scatter_add_(
        1, best_colour.flatten(1), best.flatten(1)
    )  # [B, K]
    colour = mass_per_colour.argmax(dim=1)
    fg_iou = _template_iou(best)[0]  # [B, 3]
    shape = fg_iou.argmax(dim=1)
    return ShapesAnalysis(
        score=score,
        presence=presence,
        purity=purity,
        shape_score=shape_score,
        size_score=size_score,
        position_score=position_score,
        colour=colour,
        shape=shape,
        iou=iou,
        extent=e,
        cx=ux,
        cy=uy,
        colour_ok=(colour == want_colour) & (presence > 0.5),
        shape_ok=(shape == want_shape) & (presence > 0.5),
    )


#: the coordinates of :func:`attributes`, in its column order
ATTRIBUTES = ("cx", "cy", "extent", *(f"iou_{shape}" for shape in SHAPES), "presence", "purity")


def attributes(analysis: ShapesAnalysis, side: int) -> Tensor:
    """[B, 8] what each image depicts, each coordinate in [0, 1] (:data:`ATTRIBUTES`): the requested shape's fitted
    centre and extent as fractions of the canvas (``side`` pixels, clamped to it), its soft IoU with each template, and its
    colour's presence and purity. A fixed, interpretable feature space for diversity: two samples that
    differ only by a pixel-level texture lie close, two that draw another size or place lie far apart."""
    # a diffuse mask's moment fit can reach past the canvas: clamped, so that no coordinate outweighs the others
    geometry = (torch.stack([analysis.cx, analysis.cy, analysis.extent], dim=1) / side).clamp(0, 1)  # [B, 3]
    colour = torch.stack([analysis.presence, analysis.purity], dim=1)  # [B, 2]
    return torch.cat([geometry, analysis.iou, colour], dim=1).float()


#: the score's factors as reward components: name -> field of :class:`ShapesAnalysis`
FACTORS = {
    "presence": ShapesAnalysis._fields.index("presence"),
    "purity": ShapesAnalysis._fields.index("purity"),
    "shape": ShapesAnalysis._fields.index("shape_score"),
    "size": ShapesAnalysis._fields.index("size_score"),
    "position": ShapesAnalysis._fields.index("position_score"),
}


class ShapesReward(RewardModel):
    """Verifiable prompt following in the Shapes world, in [0, 1] (see the module docstring).

    Args:
        slack: how far outside a named size range or region (fraction of the canvas) the size and
            position terms fall from 1 to 0.
        max_batch: images per scoring call (``None``: all at once).
    """

    name = "shapes"
    uses_prompt = True

    def __init__(
        self, slack: Annotated[float, Range(0.0, 0.5, low_open=True)] = 0.08, max_batch: BatchSize | None = None
    ) -> None:
        super().__init__(max_batch=max_batch)
        if not 0.0 < slack <= 0.5:
            raise ValueError(f"reward 'shapes': slack must be in (0, 0.5], got {slack}")
        self.slack = slack
        self.freeze()

    def analyse(self, images: Tensor, prompts: list[str]) -> ShapesAnalysis:
        """All the measurements behind the score (validated like ``forward``)."""
        from lit_treegrpo.rewards.base import check_inputs

        check_inputs(images, prompts, self.name)
        return analyse(images, [parse_prompt(p) for p in prompts], slack=self.slack)

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        return analyse(images, [parse_prompt(p) for p in prompts], slack=self.slack).score

    def score(self, images: Tensor, prompts: Sequence[str], *, check: bool = True) -> RewardScores:
        """The score [B] and the factors it is the product of, as components (logged as ``reward/<name>`` by
        ``RewardMetrics``): ``presence``, ``purity``, ``shape``, ``size``, ``position``."""
        self.check(images, prompts)
        specs = [parse_prompt(p) for p in prompts]
        step = self.max_batch or images.shape[0]
        with torch.no_grad():
            parts = [
                analyse(images[i : i + step], specs[i : i + step], slack=self.slack) for i in range(0, len(specs), step)
            ]
        total = torch.cat([a.score for a in parts]).float()  # [B]
        if check:
            check_finite(total, self.name, list(prompts))
        components = {name: torch.cat([a[i] for a in parts]).float() for name, i in FACTORS.items()}  # name -> [B]
        return RewardScores(total, components)

    def extra_repr(self) -> str:
        return f"slack={self.slack}, " + super().extra_repr()
