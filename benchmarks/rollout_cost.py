"""Tree vs flat at matched leaves: time per iteration and peak memory as the model and T grow.

One *iteration* = the rollout (no grad) + recomputing the log-probs of every trained edge with
grad + backward + an optimizer step: what a GRPO step costs without the reward model (which both
pay equally per leaf). Compared, per prompt, at 27 leaves:

- ``tree``: TreeGRPO, k=3 at steps 0, 1, 2, ODE elsewhere (13 sources, 39 edges trained);
- ``flat``: DanceGRPO / Flow-GRPO, 27 chains with the SDE on every step but the last
  (27 (T-1) edges trained, one forward each).

Models are Shapes-architecture transformers (diffusers' SD3Transformer2DModel on 16x16 pixels) with
random weights, from 0.1M to a few M parameters; T is 10 and 16. Every row runs in a fresh process
so that its peak RSS (VmHWM, reset after the model is built) is its own.

    python benchmarks/rollout_cost.py [--prompts 4] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import torch
from _measure import peak_rss_mb, reset_peak_rss, rss_mb

SIZES = {  # name -> (layers, heads, head_dim, text width)
    "xs": (2, 2, 16, 32),
    "s (shipped)": (4, 4, 16, 64),
    "m": (6, 4, 32, 64),
    "l": (8, 6, 32, 96),
}


def build(size: str, num_steps: int):
    from lit_treegrpo.models.shapes import ShapesAdapter, ShapesModelConfig, build_components

    layers, heads, dim, text = SIZES[size]
    config = ShapesModelConfig(num_layers=layers, num_attention_heads=heads, attention_head_dim=dim, text_width=text)
    return ShapesAdapter(build_components(config, seed=0), num_steps=num_steps)


def spec_of(kind: str, num_steps: int):
    from lit_treegrpo.core import TreeSpec

    if kind == "tree":
        return TreeSpec(num_steps, branch_steps=(0, 1, 2), branching=3)
    return TreeSpec(num_steps, sde_steps=tuple(range(num_steps - 1)), num_trees=27)


def measure(size: str, num_steps: int, kind: str, prompts: int, repeats: int, threads: int, max_batch: int) -> dict:
    from lit_treegrpo.core import ClippedPolicyLoss, recompute_log_probs, rollout, source_minibatches, tree_advantages

    torch.set_num_threads(threads)
    adapter = build(size, num_steps)
    spec = spec_of(kind, num_steps)
    optimizer = torch.optim.AdamW(adapter.trainable_parameters(), lr=1e-6)
    loss_fn = ClippedPolicyLoss()
    names = [f"a {c} circle" for c in ("red", "green", "blue", "white", "cyan", "yellow", "magenta", "orange")]
    cond = adapter.encode_prompts([names[i % len(names)] for i in range(prompts)])

    def iteration(seed: int) -> tuple[float, float]:
        gens = [torch.Generator().manual_seed(seed * 100 + i) for i in range(prompts)]
        noise = torch.cat([adapter.initial_noise(spec.num_trees, g) for g in gens])
        start = time.perf_counter()
        tree = rollout(adapter.predict, adapter.step, spec, cond, noise, generator=gens, max_batch=max_batch)
        rolled = time.perf_counter()
        rewards = torch.rand(tree.num_leaves, generator=gens[0])  # the reward model is not measured
        adv = tree_advantages(rewards, tree.edge_parent, tree.leaf_edge, tree.leaf_prompt)
        keep = torch.ones(tree.num_edges, dtype=torch.bool)
        # micro-batches of at most max_batch sources bound the backward's activations (both kinds)
        chunks = max(1, -(-int(tree.source_step.shape[0]) // max_batch))
        for edges in source_minibatches(tree, keep, num_batches=chunks, generator=gens[0]):
            new = recompute_log_probs(adapter.predict, adapter.step, tree, edges, cond)
            out = loss_fn(new.step.log_prob, tree.edge_old_log_prob[edges], adv[edges], group=new.group)
            (out.loss / chunks).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return rolled - start, time.perf_counter() - rolled

    iteration(0)  # warm-up: lazy initialisation and allocator growth are not the method's cost
    reset = reset_peak_rss()
    base = rss_mb()
    times = [iteration(r + 1) for r in range(repeats)]
    peak = peak_rss_mb() if reset else float("nan")
    return {
        "params_m": sum(p.numel() for p in adapter.denoiser.parameters()) / 1e6,
        "rollout_s": statistics.median(t[0] for t in times),
        "train_s": statistics.median(t[1] for t in times),
        "nfe": spec.nfe() * prompts,
        "train_forwards": spec.train_nfe() * prompts,
        "peak_mb": peak,
        "increase_mb": peak - base,
    }


def _child(queue, *args) -> None:
    queue.put(measure(*args))


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=4, help="prompts per iteration")
    p.add_argument("--repeats", type=int, default=3, help="timed iterations per row (median)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per measurement")
    p.add_argument("--max-batch", type=int, default=64, help="nodes per model call / sources per backward")
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES), help="model sizes")
    p.add_argument("--steps", nargs="+", type=int, default=[10, 16], help="denoising steps T")
    args = p.parse_args(argv)
    ctx = mp.get_context("spawn")
    rows = []
    print(
        f"\n## Tree (k=3 at steps 0-2) vs flat (27 SDE chains), 27 leaves per prompt, {args.prompts} prompts, "
        f"{args.threads} thread(s), max_batch {args.max_batch}\n"
    )
    print(
        "| model | params (M) | T | kind | NFE rollout | train forwards | rollout s | train s | iteration s "
        "| flat / tree | peak RSS (MB) | peak increase (MB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes:
        for num_steps in args.steps:
            pair = {}
            for kind in ("tree", "flat"):
                queue = ctx.Queue()
                proc = ctx.Process(
                    target=_child,
                    args=(queue, size, num_steps, kind, args.prompts, args.repeats, args.threads, args.max_batch),
                )
                proc.start()
                r = queue.get()
                proc.join()
                if proc.exitcode != 0:
                    raise RuntimeError(f"{size} T={num_steps} {kind} failed with exit code {proc.exitcode}")
                pair[kind] = r = {"model": size, "T": num_steps, "kind": kind, **r}
                rows.append(r)
            tree_s = pair["tree"]["rollout_s"] + pair["tree"]["train_s"]
            for kind, r in pair.items():
                total = r["rollout_s"] + r["train_s"]
                ratio = f"{total / tree_s:.2f}x" if kind == "flat" else "1x"
                print(
                    f"| {size} | {r['params_m']:.2f} | {num_steps} | {kind} | {r['nfe']} | {r['train_forwards']} | "
                    f"{r['rollout_s']:.3f} | {r['train_s']:.3f} | {total:.3f} | {ratio} | {r['peak_mb']:.0f} | "
                    f"{r['increase_mb']:.0f} |",
                    flush=True,
                )
    return rows


if __name__ == "__main__":
    main()
