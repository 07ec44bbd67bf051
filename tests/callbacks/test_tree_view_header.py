"""The tree view's header says what pruned the drawn tree: ``none`` when nothing did (it read
``pruning: none width``)."""

from __future__ import annotations

from lit_treegrpo.callbacks.tree_view import describe_pruning
from lit_treegrpo.core.pruning import PruningConfig


def test_the_header_names_the_pruning_or_none() -> None:
    assert describe_pruning(PruningConfig()) == "none"
    assert describe_pruning(PruningConfig(width="parent_top1")) == "parent_top1 width"
    assert describe_pruning(PruningConfig(depth_window=(1, 3))) == "depth (1, 3) drop"
    both = PruningConfig(width="extreme", depth_window=(0, 1), depth_mode="keep", steps=(0, 2))
    assert describe_pruning(both) == "extreme width, depth (0, 1) keep, steps [0, 2]"
