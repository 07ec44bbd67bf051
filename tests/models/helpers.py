"""What the adapter tests share: trees grown by the real engine, and real policy-gradient steps on
them rewarded by brightness."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_treegrpo.core import ClippedPolicyLoss, TreeSpec, recompute_log_probs, rollout, tree_advantages
from lit_treegrpo.core.rollout import RolloutTree


def grow(adapter, prompts: list[str], spec: TreeSpec, seed: int = 0) -> tuple[dict[str, Tensor], RolloutTree]:
    """The prompts' conditioning and a tree of ``spec`` (one root per prompt) grown from ``seed``."""
    cond = adapter.encode_prompts(prompts)
    gen = torch.Generator().manual_seed(seed)
    return cond, rollout(
        adapter.predict, adapter.step, spec, cond, adapter.initial_noise(len(prompts), gen), generator=gen
    )


def assert_recomputes_and_trains(adapter, tree: RolloutTree, cond: dict[str, Tensor], rewards: Tensor) -> None:
    """Every edge's log-prob recomputed with gradients equals the rollout's, and one clipped policy
    loss on the tree's advantages from ``rewards`` [L] gives every trainable parameter a finite
    gradient, some of it non-zero."""
    advantages = tree_advantages(rewards, tree.edge_parent, tree.leaf_edge, tree.leaf_prompt, method="mean")
    assert advantages.shape == (tree.num_edges,) and bool(torch.isfinite(advantages).all())
    out = recompute_log_probs(adapter.predict, adapter.step, tree, torch.arange(tree.num_edges), cond)
    torch.testing.assert_close(out.step.log_prob, tree.edge_old_log_prob, atol=1e-5, rtol=0)
    ClippedPolicyLoss(clip_range=10.0)(out.step.log_prob, tree.edge_old_log_prob, advantages).loss.backward()
    grads = [p.grad for p in adapter.trainable_parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


def assert_bfloat16_tree_is_finite(adapter, prompts: list[str], num_steps: int) -> Tensor:
    """A bfloat16 adapter's tree keeps bfloat16 latents and float32 log-probs, recomputes finite
    float32 log-probs, and decodes to finite float32 leaves (returned)."""
    spec = TreeSpec(num_steps, branch_steps=(0,), branching=2, sde_steps=(1, 2))
    cond, tree = grow(adapter, prompts, spec)
    assert tree.edge_x_next.dtype == torch.bfloat16 and tree.edge_old_log_prob.dtype == torch.float32
    out = recompute_log_probs(adapter.predict, adapter.step, tree, torch.arange(tree.num_edges), cond)
    assert out.step.log_prob.dtype == torch.float32
    assert bool(torch.isfinite(out.step.log_prob).all() and torch.isfinite(tree.edge_old_log_prob).all())
    decoded = adapter.decode(tree.leaf_latents)
    assert decoded.dtype == torch.float32 and bool(torch.isfinite(decoded).all())
    return decoded


def brightness_steps(adapter, prompts: list[str], spec: TreeSpec, steps: int, lr: float) -> None:
    """``steps`` clipped policy-gradient steps (SGD at ``lr``) of ``adapter`` on trees of ``spec``,
    one root per prompt, rewarded by the mean brightness of the decoded images or videos."""
    cond = adapter.encode_prompts(prompts)
    optimizer = torch.optim.SGD(adapter.trainable_parameters(), lr=lr)
    for step in range(steps):
        gen = torch.Generator().manual_seed(step)
        noise = adapter.initial_noise(len(prompts), gen)
        tree = rollout(adapter.predict, adapter.step, spec, cond, noise, generator=gen)
        decoded = adapter.decode(tree.leaf_latents)  # [L, 3, H, W] or [L, F, 3, H, W]
        rewards = decoded.flatten(1).mean(dim=1)  # [L]
        advantages = tree_advantages(rewards, tree.edge_parent, tree.leaf_edge, tree.leaf_prompt, method="mean")
        out = recompute_log_probs(adapter.predict, adapter.step, tree, torch.arange(tree.num_edges), cond)
        ClippedPolicyLoss(clip_range=10.0)(out.step.log_prob, tree.edge_old_log_prob, advantages).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
