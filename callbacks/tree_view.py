"""A picture of the tree the policy grows for one fixed prompt, logged as training goes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from typing_extensions import override

from lit_treegrpo.common.text import check_prompt, cut_prompts
from lit_treegrpo.core.seeding import generator as seeded

from ._media import MediaWriters, check_scale
from .drawing import draw_tree
from .iterations import EveryNIterations


class TreeView(EveryNIterations):
    """Every ``every_n_steps`` iterations, draw one prompt's rollout tree (see the module docstring).

    Args:
        prompt: the prompt whose tree is drawn, the same at every logging step.
        seed: seeds the root noise and every SDE draw of the drawn tree.
        every_n_steps: training iterations between two pictures.
        tag: TensorBoard tag of the image.
        save_png: also write each picture to ``samples/tree_{iteration:06d}.png``.
        scale: enlarge every leaf image by this integer factor (16 px Shapes images need 3-4).
    """

    def __init__(
        self,
        prompt: str = "a red circle",
        seed: int = 0,
        every_n_steps: int = 50,
        tag: str = "tree",
        save_png: bool = True,
        scale: int = 1,
    ) -> None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"TreeView.prompt must be a non-empty prompt, got {prompt!r}")
        prompt = cut_prompts([check_prompt(prompt, "TreeView.prompt")], "TreeView.prompt")[0]
        if every_n_steps < 1:
            raise ValueError(f"TreeView.every_n_steps must be >= 1, got {every_n_steps}")
        if not tag:
            raise ValueError("TreeView.tag must be a non-empty string")
        self.prompt = prompt
        self.seed = int(seed)
        self.every_n_steps = every_n_steps
        self.tag = tag
        self.save_png = save_png
        self.scale = check_scale("TreeView", scale)
        self.last_logged: int | None = None
        self._writers = MediaWriters(f"TreeView(tag={tag!r})")

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(tag=self.tag)

    # ------------------------------------------------------------------------ the tree
    @torch.no_grad()
    def grow(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Any:
        """The module's tree of :attr:`prompt` with the current weights (``pl_module.grow``: rolled
        out, scored, backed up and pruned as a training step does), from this callback's seed: a
        :class:`~lit_treegrpo.core.samples.GrownTree` (the module is a ``PolicyModule``)."""
        return pl_module.grow([self.prompt], [seeded(self.seed, device=pl_module.device)])

    def picture(self, grown: Any, iteration: int) -> Any:
        """The drawn tree (a PIL image) of :meth:`grow`'s result."""
        tree, spec, keep, rewards, pruning = grown.tree, grown.spec, grown.keep, grown.scored.rewards, grown.pruning
        title = [
            f"iteration {iteration}   prompt: {self.prompt!r}   seed {self.seed}",
            f"{tree.num_leaves} leaves, {tree.num_edges} recorded edges, {int(keep.sum())} kept for training; "
            f"reward mean {float(rewards.mean()):.3f}, max {float(rewards.max()):.3f}",
            f"tree: {spec.num_trees} root(s), branching {spec.branching} at steps {list(spec.branch_steps)}"
            + (f", SDE steps {list(spec.sde_steps)}" if spec.sde_steps else "")
            + "; "
            f"pruning: {describe_pruning(pruning)}",
            "edges: green advantage >= 0, red < 0, grey with x = pruned; the number under a node is its edge's advantage",
        ]
        cpu = lambda t: t.detach().cpu()  # noqa: E731
        return draw_tree(
            edge_parent=cpu(tree.edge_parent),
            edge_source=cpu(tree.edge_source),
            edge_depth=cpu(tree.edge_depth),
            edge_step=cpu(tree.edge_step),
            advantages=cpu(grown.advantages).float(),
            keep=cpu(keep),
            leaf_edge=cpu(tree.leaf_edge),
            leaf_images=cpu(grown.images).float(),
            rewards=cpu(rewards),
            title=title,
            scale=self.scale,
        )

    def log_tree(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        iteration = pl_module.iteration
        grown = self.grow(trainer, pl_module)  # every rank: a sharded model needs all of them
        self.last_logged = iteration
        if not trainer.is_global_zero:
            return
        picture = self.picture(grown, iteration)
        pixels = np.asarray(picture)  # [H, W, 3] uint8
        for writer in self._writers(trainer):
            writer.image(self.tag, pixels, iteration)
            writer.flush()
        if self.save_png:
            folder = Path(trainer.default_root_dir) / "samples"
            folder.mkdir(parents=True, exist_ok=True)
            picture.save(folder / f"tree_{iteration:06d}.png")

    # ------------------------------------------------------------------------ hooks: EveryNIterations
    def log_at(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.log_tree(trainer, pl_module)


def describe_pruning(pruning: Any) -> str:
    """The tree view's words for an iteration's pruning: ``none``, or what prunes
    (``parent_top1 width, depth (1, 3) drop, steps [0, 1]``)."""
    parts = [f"{pruning.width} width"] if pruning.width != "none" else []
    if pruning.depth_window:
        parts.append(f"depth {pruning.depth_window} {pruning.depth_mode}")
    if pruning.steps is not None:
        parts.append(f"steps {list(pruning.steps)}")
    return ", ".join(parts) or "none"
