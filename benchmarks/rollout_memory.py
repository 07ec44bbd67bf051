"""Peak memory of one rollout as the tree grows: 8, 27 and 64 leaves per prompt, next to the
estimate the module's memory guard makes (:func:`lit_treegrpo.core.memory.rollout_memory`).

Each row runs in a fresh process. On CPU it reports the process's peak RSS during the rollout
(``VmHWM`` of /proc/self/status, reset through /proc/self/clear_refs right before the rollout) and
how far that is above the RSS at its start (model and prompts loaded); on CUDA the peak of
``max_memory_allocated`` during the rollout and its increase. Rows come in pairs: chunked at
``--max-batch`` nodes per model call, and unchunked (one call per denoising step, however wide the
frontier): the chunked peak stays flat as the leaves grow while the unchunked one climbs with the
model's activations, which the estimate leaves out (it counts what the rollout keeps).

    python benchmarks/rollout_memory.py [--adapter lit_treegrpo.models.tiny.TinySD3Adapter]  # or ...shapes.ShapesAdapter
        [--adapter-kwargs '{"resolution": 64}'] [--prompts 4] [--max-batch 16] [--device cpu]
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import multiprocessing as mp
import resource

import torch
from _measure import peak_rss_mb, reset_peak_rss, rss_mb

LEAVES = {8: 2, 27: 3, 64: 4}  # leaves per prompt -> branching k at three splits (k^3 leaves)
NUM_STEPS = 10
# Shapes-world prompts, so that the Shapes model knows every word (the other models do not care)
PROMPTS = [
    "a red circle",
    "a blue square",
    "a green triangle",
    "a large yellow circle on the left",
    "a small white square",
    "a magenta triangle at the top",
]


def measure(
    adapter_path: str, adapter_kwargs: dict, leaves: int, prompts: int, max_batch: int | None, device: str
) -> dict:
    from lit_treegrpo.core import TreeSpec, rollout
    from lit_treegrpo.core.memory import cond_row_bytes, rollout_memory

    torch.set_num_threads(1)
    module, _, name = adapter_path.rpartition(".")
    adapter = getattr(importlib.import_module(module), name)(**{"num_steps": NUM_STEPS, **adapter_kwargs}).to(device)
    P = prompts
    k = LEAVES[leaves]
    unchunked = leaves * P  # the widest frontier fits in one call
    spec = TreeSpec(NUM_STEPS, branch_steps=(0, 1, 2), branching=k)
    max_batch = max_batch or unchunked
    names = [PROMPTS[i % len(PROMPTS)] for i in range(P)]
    gens = [torch.Generator(device).manual_seed(i) for i in range(P)]
    cond = adapter.encode_prompts(names)
    noise = torch.cat([adapter.initial_noise(1, g) for g in gens])  # [P, *S]
    estimate = rollout_memory(
        spec,
        P,
        tuple(noise.shape[1:]),
        noise.dtype,
        cond_bytes=cond_row_bytes(cond),
        cfg=adapter.do_cfg,
        max_batch=max_batch,
    )
    # a warm-up rollout of one chain per prompt: lazy initialisation is not the tree's memory
    rollout(adapter.predict, adapter.step, TreeSpec(NUM_STEPS), cond, noise)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
    else:
        reset = reset_peak_rss()
        start_mb = rss_mb()
    tree = rollout(adapter.predict, adapter.step, spec, cond, noise, generator=gens, max_batch=max_batch)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak_mb = peak_rss_mb() if reset else math.nan
        if math.isnan(peak_mb):  # no /proc: ru_maxrss, the peak of the whole process (KiB on Linux)
            peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6
        peak, start = peak_mb * 1e6, (0.0 if math.isnan(start_mb) else start_mb * 1e6)
    return {
        "leaves": tree.num_leaves // P,
        "max_batch": max_batch,
        "calls": tree.num_model_calls,
        "estimate_mb": estimate.total / 1e6,
        "peak_mb": peak / 1e6,
        "increase_mb": (peak - start) / 1e6,
    }


def _child(queue, *args) -> None:
    queue.put(measure(*args))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--adapter", default="lit_treegrpo.models.tiny.TinySD3Adapter", help="import path of a DiffusionAdapter class"
    )
    parser.add_argument(
        "--adapter-kwargs",
        "--adapter_kwargs",
        dest="adapter_kwargs",
        default="{}",
        help="JSON keyword arguments of the adapter (num_steps is 10)",
    )
    parser.add_argument("--prompts", type=int, default=4, help="prompts per rollout")
    parser.add_argument(
        "--max-batch",
        "--max_batch",
        dest="max_batch",
        type=int,
        default=16,
        help="nodes per model call of the chunked rows",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    kwargs = json.loads(args.adapter_kwargs)
    ctx = mp.get_context("spawn")
    where = "peak RSS" if args.device == "cpu" else "peak allocated"
    print(
        f"\n## {args.adapter} {kwargs or ''}, {args.prompts} prompts, T={NUM_STEPS}, splits at 0, 1, 2, {args.device}\n"
    )
    print(f"| leaves / prompt | max_batch | model calls | estimate (MB) | {where} (MB) | rollout increase (MB) |")
    print("|---|---|---|---|---|---|")
    for leaves in LEAVES:
        for max_batch in (args.max_batch, None):
            queue = ctx.Queue()
            proc = ctx.Process(
                target=_child, args=(queue, args.adapter, kwargs, leaves, args.prompts, max_batch, args.device)
            )
            proc.start()
            r = queue.get()
            proc.join()
            if proc.exitcode != 0:
                raise RuntimeError(f"measurement with {leaves} leaves failed with exit code {proc.exitcode}")
            print(
                f"| {r['leaves']} | {r['max_batch']} | {r['calls']} | {r['estimate_mb']:.2f} | "
                f"{r['peak_mb']:.0f} | {r['increase_mb']:.1f} |"
            )


if __name__ == "__main__":
    main()
