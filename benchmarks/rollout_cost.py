"""Tree vs flat at matched leaves: time per iteration and peak memory as the model and T grow.

One *iteration* is one ``TreeGRPO.step``, the training step ``fit`` runs, built by ``TreeGRPOModule``
(benchmarks/_drive.py): the rollout (no grad), decoding and a random reward (a real reward model costs both kinds
alike per leaf), advantages, then recomputing the log-probs of every trained edge with grad, backward and one AdamW
step. Compared, per prompt, at 27 leaves:

- ``tree``: TreeGRPO, k=3 at steps 0, 1, 2, ODE elsewhere (13 sources, 39 edges trained);
- ``flat``: DanceGRPO / Flow-GRPO, 27 chains with the SDE on every step but the last
  (27 (T-1) edges trained, one forward each).

Every edge trains (no pruning), in micro-batches of at most ``--max-batch`` parents accumulated into the one
optimizer step (``--model.accumulate``), which bounds the backward's activations alike for both kinds. Models are
Shapes-architecture transformers (diffusers' SD3Transformer2DModel on 16x16 pixels) with random weights, from 0.1M
to a few M parameters; T is 10 and 16. Every row runs in a fresh process so that its peak RSS (VmHWM, reset after
the warm-up iteration) is its own.

    python benchmarks/rollout_cost.py [--prompts 4] [--repeats 3] [--threads 1] [--sizes xs ...] [--steps 10 16]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics

import torch
from _measure import rss_mb

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
    from _drive import PeakMemory, TorchOptimization, adamw, build_algorithm, random_reward, run_step

    from lit_treegrpo.core.spec import RolloutLimits

    torch.set_num_threads(threads)
    adapter = build(size, num_steps)
    spec = spec_of(kind, num_steps)
    parents = spec.train_nfe() * prompts  # every parent of every prompt trains
    algorithm = build_algorithm(
        adapter,
        random_reward(video=False),
        spec,
        rollout=RolloutLimits(max_batch=max_batch),
        accumulate=max(1, -(-parents // max_batch)),
    )
    optimization = TorchOptimization(adamw(adapter, lr=1e-6))
    names = [f"a {c} circle" for c in ("red", "green", "blue", "white", "cyan", "yellow", "magenta", "orange")]
    batch = [names[i % len(names)] for i in range(prompts)]

    run_step(algorithm, optimization, batch, iteration=0)  # warm-up: lazy initialisation, allocator growth
    peak = PeakMemory(adapter.device).reset()
    base = rss_mb()
    runs = [run_step(algorithm, optimization, batch, iteration=r + 1) for r in range(repeats)]
    peak_mb = peak.mb()
    return {
        "params_m": sum(p.numel() for p in adapter.denoiser.parameters()) / 1e6,
        "rollout_s": statistics.median(r.seconds["rollout"] for r in runs),
        "reward_s": statistics.median(r.seconds["reward"] + r.seconds["advantages"] for r in runs),
        "train_s": statistics.median(r.seconds["train"] for r in runs),
        "nfe": runs[0].grown.tree.nfe,
        "train_forwards": runs[0].trained_forwards,
        "peak_mb": peak_mb,
        "increase_mb": peak_mb - base,
    }


def iteration_s(row: dict) -> float:
    return row["rollout_s"] + row["reward_s"] + row["train_s"]


def _child(queue, *args) -> None:
    queue.put(measure(*args))


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=4, help="prompts per iteration")
    p.add_argument("--repeats", type=int, default=3, help="timed iterations per row (median)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per measurement")
    p.add_argument(
        "--max-batch", type=int, default=64, help="nodes per rollout model call / parents per training forward"
    )
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
        "| model | params (M) | T | kind | NFE rollout | train forwards | rollout s | reward s | train s "
        "| iteration s | flat / tree | peak RSS (MB) | peak increase (MB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
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
                proc.join()  # the child's one small row fits the queue's pipe, so it can exit before it is read
                if proc.exitcode != 0:
                    raise RuntimeError(f"{size} T={num_steps} {kind} failed with exit code {proc.exitcode}")
                r = queue.get()
                pair[kind] = r = {"model": size, "T": num_steps, "kind": kind, **r}
                rows.append(r)
            tree_s = iteration_s(pair["tree"])
            for kind, r in pair.items():
                total = iteration_s(r)
                ratio = f"{total / tree_s:.2f}x" if kind == "flat" else "1x"
                print(
                    f"| {size} | {r['params_m']:.2f} | {num_steps} | {kind} | {r['nfe']} | {r['train_forwards']} | "
                    f"{r['rollout_s']:.3f} | {r['reward_s']:.3f} | {r['train_s']:.3f} | {total:.3f} | {ratio} | "
                    f"{r['peak_mb']:.0f} | {r['increase_mb']:.0f} |",
                    flush=True,
                )
    return rows


if __name__ == "__main__":
    main()
