"""Cost of the pure-torch engine, measured side by side in one run (CPU, one thread by default).

1. Size of each method preset's tree (configs/methods): leaves, model evaluations (NFE) per prompt and per
   leaf, trained edges and the forwards needed to recompute them.
2. Advantage estimators on a tree of ~10^4 edges: milliseconds per call.
3. Rollout wall-clock on a small convolutional velocity model at matched leaves:
   - tree (k=3 at steps 0-2, 27 leaves) vs flat GRPO (27 independent chains), and
   - one batched call per depth vs one call per node (how BranchGRPO's code forwards).

Ratios are what to read: absolute times depend on the machine. Run:
    python benchmarks/core_cost.py [--threads 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from lit_treegrpo.common.config_yaml import read_yaml_file
from lit_treegrpo.core import TreeSpec, flow_sde_step, rollout, tree_advantages
from lit_treegrpo.core.advantages import METHODS

PRESETS = Path(__file__).resolve().parents[1] / "configs" / "methods"


def load_preset(path: Path) -> TreeSpec:
    """The tree of a method preset (its ``model.tree``), at the window's first offset."""
    return TreeSpec.from_dict(read_yaml_file(path, str(path))["model"]["tree"])  # duplicate keys, bombs refused


def flow_step(num_steps: int):
    """The rollout's ``step`` callable for a linear sigma schedule (Flow-GRPO SDE / Euler ODE)."""
    sigmas = torch.linspace(1, 0, num_steps + 1).tolist()

    def step(v, x, t, *, stochastic, noise=None, prev_sample=None):
        dyn = "flow_sde" if stochastic else "ode"
        return flow_sde_step(v, x, sigmas[t], sigmas[t + 1], dynamics=dyn, noise=noise, prev_sample=prev_sample)

    return step


def preset_table() -> None:
    print("\n## The method presets' trees (per prompt)\n")
    print("| preset | T | leaves | NFE | NFE / leaf | trained edges | training forwards |")
    print("|---|---|---|---|---|---|---|")
    for path in sorted(PRESETS.glob("*.yaml")):
        s = load_preset(path)
        print(
            f"| {path.stem} | {s.num_steps} | {s.num_leaves} | {s.nfe()} | "
            f"{s.nfe() / s.num_leaves:.1f} | {s.num_edges()} | {s.train_nfe()} |"
        )


class ConvVelocity(nn.Module):
    """A small conv net standing in for a denoiser: enough compute that batching matters."""

    def __init__(self, channels: int = 4, width: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1),
            nn.SiLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.SiLU(),
            nn.Conv2d(width, channels, 3, padding=1),
        )

    def forward(self, x: torch.Tensor, step_index: int | torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return self.net(x) + cond.reshape(-1, 1, 1, 1)


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def advantage_cost(repeats: int) -> None:
    spec = TreeSpec(10, branch_steps=(0, 1, 2), branching=3, sde_steps=(3, 4, 5))
    step = flow_step(spec.num_steps)
    P = 80
    gen = torch.Generator().manual_seed(0)
    tree = rollout(
        lambda x, t, c: torch.zeros_like(x),
        step,
        spec,
        torch.zeros(P),
        torch.randn(P, 1, 2, 2, generator=gen),
        generator=gen,
    )
    rewards = torch.randn(tree.num_leaves, generator=gen)
    print(f"\n## Advantages on {tree.num_edges} edges, {tree.num_leaves} leaves, {P} prompts\n")
    print("| method | ms per call |")
    print("|---|---|")
    for method in METHODS:
        sec = timed(
            lambda: tree_advantages(
                rewards,
                tree.edge_parent,
                tree.leaf_edge,
                tree.leaf_prompt,
                method=method,  # noqa: B023 (timed calls it in this iteration only)
                edge_old_log_prob=tree.edge_old_log_prob,
            ),
            repeats,
        )
        print(f"| {method} | {sec * 1e3:.2f} |")


def rollout_cost(repeats: int, size: int, device: str) -> None:
    model = ConvVelocity().eval().to(device)
    T = 10
    step = flow_step(T)

    tree = TreeSpec(T, branch_steps=(0, 1, 2), branching=3)
    flat = TreeSpec(T, sde_steps=tuple(range(T - 1)), num_trees=27)
    per_node = TreeSpec(T, branch_steps=(0, 1, 2), branching=3)  # run with max_batch 1
    cond = torch.zeros(1, device=device)

    def run(spec: TreeSpec, max_batch: int = 64) -> None:
        gen = torch.Generator(device).manual_seed(0)
        noise = torch.randn(spec.num_trees, 4, size, size, generator=gen, device=device)
        rollout(model, step, spec, cond, noise, generator=gen, max_batch=max_batch)
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    results = {
        name: timed(lambda s=s, b=b: run(s, b), repeats)
        for name, s, b in [("tree k3 d3", tree, 64), ("flat G=27", flat, 64), ("tree, one call per node", per_node, 1)]
    }
    print(f"\n## Rollout of 27 leaves, T={T}, conv model on 4x{size}x{size} latents, {device}\n")
    print("| rollout | NFE | seconds | time / tree's |")
    print("|---|---|---|---|")
    nfe = {"tree k3 d3": tree.nfe(), "flat G=27": flat.nfe(), "tree, one call per node": per_node.nfe()}
    for name, sec in results.items():
        print(f"| {name} | {nfe[name]} | {sec:.3f} | {sec / results['tree k3 d3']:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats, median reported")
    parser.add_argument("--size", type=int, default=16, help="latent height/width of the rollout model")
    parser.add_argument("--device", default="cpu", help="device of the rollout comparison (cpu, cuda)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    preset_table()
    advantage_cost(args.repeats)
    rollout_cost(args.repeats, args.size, args.device)


if __name__ == "__main__":
    main()
