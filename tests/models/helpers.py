"""What the adapter tests share: real policy-gradient steps on a small tree, rewarded by brightness."""

from __future__ import annotations

import torch

from lit_treegrpo.core import ClippedPolicyLoss, TreeSpec, recompute_log_probs, rollout, tree_advantages


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
