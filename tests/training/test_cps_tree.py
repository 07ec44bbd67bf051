"""A tree whose branching steps use coefficients-preserving sampling (``dynamics: cps``) through
rollout, advantages and the loss, on the tiny SD3 model."""

from __future__ import annotations

import math

import torch

from lit_treegrpo.core import ClippedPolicyLoss, TreeSpec, recompute_log_probs, rollout, tree_advantages
from lit_treegrpo.models.tiny import TinySD3Adapter


def test_a_cps_tree_samples_scores_and_trains() -> None:
    adapter = TinySD3Adapter(num_steps=4, guidance_scale=1.0, dynamics="cps", noise_level=0.8)
    spec = TreeSpec(4, branch_steps=(0, 1), branching=2)
    cond = adapter.encode_prompts(["a red circle", "a blue square"])
    noise = adapter.initial_noise(2, torch.Generator().manual_seed(0))
    tree = rollout(
        adapter.predict, adapter.step, spec, cond, noise, generator=[torch.Generator().manual_seed(i) for i in (1, 2)]
    )
    assert tree.num_leaves == 8
    leaves = tree.leaf_latents.view(2, 4, -1)  # the branches of a prompt's tree differ
    assert (leaves[:, 0] - leaves[:, 1]).abs().max() > 1e-3
    assert torch.isfinite(tree.edge_old_log_prob).all()
    # every edge's log-prob recomputed from the recorded states equals the sampled one: ratio 1
    edges = torch.arange(tree.num_edges)
    new = recompute_log_probs(adapter.predict, adapter.step, tree, edges, cond)
    torch.testing.assert_close(new.step.log_prob, tree.edge_old_log_prob, atol=1e-5, rtol=0)
    rewards = tree.leaf_latents.flatten(1).mean(1)  # [8] any score per leaf
    adv = tree_advantages(rewards, tree.edge_parent, tree.leaf_edge, tree.leaf_prompt)
    out = ClippedPolicyLoss()(new.step.log_prob, tree.edge_old_log_prob, adv, group=new.group)
    assert math.isfinite(out.loss.item()) and out.ratio_mean.item() == 1.0
    out.loss.backward()
    grads = [p.grad for p in adapter.trainable_parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_a_cps_noise_level_above_one_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match=r"noise_level must be in \(0, 1\] with dynamics cps"):
        TinySD3Adapter(num_steps=4, dynamics="cps", noise_level=1.5)
