"""TreeGRPO.grow, the first half of a training step: what the step trains on and what TreeView draws
both go through it, and so does an advantage estimator of one's own."""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor

from lit_treegrpo.callbacks import PruningSchedule, TreeView
from lit_treegrpo.core import GrownTree, RolloutTree, ScoredSamples, TreeSpec
from lit_treegrpo.models.tiny import TinySD3Adapter
from lit_treegrpo.rewards import Brightness
from lit_treegrpo.training.module import TreeGRPOModule
from lit_treegrpo.training.settings import AdvantageSettings
from tests.training.test_module import fit

SPEC = TreeSpec(3, branch_steps=(0, 1), branching=2)


class _Spy(L.Callback):
    """The trees the training steps grew (through ``grow``) and the samples the callbacks received."""

    def __init__(self, model: TreeGRPOModule) -> None:
        self.grown: list[tuple[list[str], GrownTree]] = []
        self.samples: list[ScoredSamples | None] = []

        real = model.algorithm.grow

        def grow(prompts, generators, **kwargs) -> GrownTree:
            grown = real(prompts, generators, **kwargs)
            self.grown.append((list(prompts), grown))
            return grown

        model.algorithm.grow = grow  # this instance only

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.samples.append(ScoredSamples.of(outputs))


def _fit_one_step(model: TreeGRPOModule, tmp_path, *callbacks: L.Callback) -> L.Trainer:
    spy = _Spy(model)
    # one prompt per step: its tree is batched alone, as TreeView's is
    trainer = fit(model, 1, tmp_path, batch_size=1, callbacks=[spy, *callbacks])
    model.spy = spy
    return trainer


def test_tree_view_draws_the_tree_a_training_step_grows_from_the_same_noise(tmp_path) -> None:
    # a training step's first prompt at iteration 0 draws from generator(seed, 0, 0, 0), which for
    # seed 0 is TreeView's generator(0); lr 0 leaves the weights as the step found them
    model = TreeGRPOModule(
        TinySD3Adapter(num_steps=3, guidance_scale=1.0),
        reward=Brightness(),
        tree=SPEC,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.0),
    )
    _fit_one_step(model, tmp_path, PruningSchedule(width="extreme"))  # TreeView asks the same owner
    (prompts, trained), samples = model.spy.grown[0], model.spy.samples[0]
    assert len(model.spy.grown) == 1 and len(prompts) == 1

    model.iteration = 0  # the iteration the step grew its tree at
    drawn = TreeView(prompt=prompts[0], seed=0).grow(None, model)
    for name in ("leaf_latents", "edge_parent", "edge_step", "edge_old_log_prob", "leaf_edge"):
        assert torch.equal(getattr(drawn.tree, name), getattr(trained.tree, name)), name
    assert torch.equal(drawn.scored.rewards, trained.scored.rewards)
    assert torch.equal(drawn.advantages, trained.advantages)
    assert torch.equal(drawn.keep, trained.keep) and 0 < int(trained.keep.sum()) < trained.tree.num_edges
    assert drawn.spec == trained.spec and drawn.pruning == trained.pruning
    # the callbacks received the same leaves, by name
    assert samples is not None and samples.prompts == trained.leaf_prompts == prompts * 4
    assert torch.equal(samples.rewards, trained.scored.rewards) and samples.images is trained.images


def _flat(tree: RolloutTree, rewards: Tensor) -> Tensor:
    """Every edge's advantage 0.25: an estimator of one's own."""
    return torch.full((tree.num_edges,), 0.25)


def test_an_estimator_of_ones_own_is_what_the_step_trains_on_and_tree_view_draws(tmp_path) -> None:
    model = TreeGRPOModule(
        TinySD3Adapter(num_steps=3, guidance_scale=1.0), reward=Brightness(), tree=SPEC, advantage=_flat
    )
    trainer = _fit_one_step(model, tmp_path)
    (_, trained) = model.spy.grown[0]
    assert torch.equal(trained.advantages, torch.full((6,), 0.25))
    assert float(trainer.callback_metrics["adv/mean"]) == 0.25
    assert float(trainer.callback_metrics["adv/std"]) == 0.0
    assert torch.equal(TreeView(seed=3).grow(None, model).advantages, torch.full((6,), 0.25))
    # the default estimator gives these rewards other advantages
    default = AdvantageSettings()(trained.tree, trained.screened.rewards)
    assert not torch.equal(default, trained.advantages)
