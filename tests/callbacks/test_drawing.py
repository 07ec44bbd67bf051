"""The drawings by hand: a tree of known shape (images and videos), wrapping, the captioned grid."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_treegrpo.callbacks.drawing import captioned_grid, draw_tree, font, still, wrap

# one root, 2 children at depth 0, each with 2 children at depth 1: edges 0, 1 (depth 0), 2..5
PARENT = torch.tensor([-1, -1, 0, 0, 1, 1])
DEPTH = torch.tensor([0, 0, 1, 1, 1, 1])
LEAF_EDGE = torch.tensor([2, 3, 4, 5])
COLOURS = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 1.0, 0]])  # one per leaf


def _tree(images: torch.Tensor, keep: torch.Tensor) -> np.ndarray:
    picture = draw_tree(
        edge_parent=PARENT,
        edge_source=torch.tensor([0, 0, 1, 1, 2, 2]),
        edge_depth=DEPTH,
        edge_step=torch.tensor([1, 1, 2, 2, 2, 2]),
        advantages=torch.tensor([0.5, -0.5, 1, -1, 2, -2.0]),
        keep=keep,
        leaf_edge=LEAF_EDGE,
        leaf_images=images,
        rewards=torch.tensor([0.1, 0.2, 0.3, 0.4]),
        title=["a title"],
        scale=2,
    )
    return np.asarray(picture)


def _leaf_colours(pixels: np.ndarray, side: int = 16) -> list[int]:
    """The mean column of each colour's ``side`` x ``side`` image (a thumbnail or a grid cell)."""
    found = []
    for colour in COLOURS:
        target = (colour * 255).round().to(torch.uint8).numpy()
        mask = (pixels == target).all(axis=2)
        assert mask.sum() >= side * side, f"no image of colour {target}"
        found.append(int(np.nonzero(mask)[1].mean()))
    return found


def test_leaves_are_drawn_in_rollout_order_for_images_and_videos() -> None:
    images = COLOURS[:, :, None, None].expand(4, 3, 8, 8)  # [L, 3, 8, 8]
    kept = torch.tensor([True, True, True, False, True, False])
    plain = _tree(images, kept)
    xs = _leaf_colours(plain)
    assert xs == sorted(xs)  # leaf i in column i
    # a video [L, F, 3, H, W] is drawn by its middle frame: only frame 1 of 3 carries the colours
    video = torch.zeros(4, 3, 3, 8, 8)
    video[:, 1] = images
    assert np.array_equal(_tree(video, kept), plain)
    # pruned edges are drawn differently (grey, crossed)
    assert not np.array_equal(_tree(images, torch.ones(6, dtype=torch.bool)), plain)


def test_still_and_wrap() -> None:
    assert still(torch.zeros(3, 4, 4)).shape == (3, 4, 4)
    assert torch.equal(still(torch.arange(5.0)[:, None, None, None].expand(5, 3, 2, 2)), torch.full((3, 2, 2), 2.0))
    with pytest.raises(ValueError, match="expected an image"):
        still(torch.zeros(4, 4))
    face = font()
    lines = wrap("a small yellow circle on the left", 60, face)
    assert " ".join(lines) == "a small yellow circle on the left" and len(lines) > 1
    assert all(face.getbbox(line)[2] <= 60 for line in lines)


def test_captioned_grid_holds_every_image_and_caption() -> None:
    cells = COLOURS[:, None, :, None, None].expand(4, 1, 3, 10, 10).reshape(2, 2, 3, 10, 10)  # [R=2, C=2, ...]
    picture = np.asarray(captioned_grid(cells, ["one", "two"], ["seed 0", "seed 1"], torch.rand(2, 2), title="it 3"))
    _leaf_colours(picture, side=10)  # every cell pasted whole
    without = np.asarray(captioned_grid(cells, ["one", "two"], ["seed 0", "seed 1"], None))
    assert picture.shape[0] > without.shape[0]  # a line per row for the rewards (and the title)
