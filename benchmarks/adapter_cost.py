"""Cost of one batched adapter forward and forward+backward, per model family (tiny models).

A baseline for later changes to the adapters: milliseconds per guided ``predict`` (CFG included,
so the denoiser sees 2B rows) and per ``predict`` + log-prob + backward through the LoRA, and the
peak memory of each measurement (CUDA: ``max_memory_allocated``; CPU: the peak RSS of a fresh
process per row, since torch keeps no CPU allocator statistics).

    python benchmarks/adapter_cost.py [--batch 8] [--repeats 5] [--device cpu] [--threads 1]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import time

import torch


def build(family: str, device: str):
    from lit_treegrpo.models.tiny import TinySD3Adapter, TinySD15Adapter

    cls = {"sd15": TinySD15Adapter, "sd3": TinySD3Adapter}[family]
    return cls(num_steps=10).to(device)


def measure(family: str, mode: str, batch: int, repeats: int, device: str, threads: int) -> dict:
    torch.set_num_threads(threads)
    adapter = build(family, device)
    cond = adapter.encode_prompts([f"prompt {i}" for i in range(batch)])
    x = adapter.initial_noise(batch, torch.Generator(device).manual_seed(0))
    steps = torch.arange(batch, device=device) % adapter.num_steps
    prev = adapter.step(adapter.predict(x, steps, cond).detach(), x, steps, stochastic=True).prev_sample

    def run() -> None:
        if mode == "forward":
            with torch.no_grad():
                adapter.predict(x, steps, cond)
        else:
            out = adapter.step(adapter.predict(x, steps, cond), x, steps, stochastic=True, prev_sample=prev)
            out.log_prob.sum().backward()
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    run()  # warm-up
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    if device.startswith("cuda"):
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"ms": 1e3 * statistics.median(times), "peak_mb": peak_mb}


def _child(queue, *args) -> None:
    queue.put(measure(*args))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="latents per call (CFG doubles it)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats, median reported")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    print(f"\n## Tiny adapters, batch {args.batch} (CFG: {2 * args.batch} rows), {args.device}\n")
    print("| family | mode | ms per call | peak memory (MB) |")
    print("|---|---|---|---|")
    for family in ("sd15", "sd3"):
        for mode in ("forward", "forward+backward"):
            queue = ctx.Queue()
            proc = ctx.Process(
                target=_child, args=(queue, family, mode, args.batch, args.repeats, args.device, args.threads)
            )
            proc.start()
            result = queue.get()
            proc.join()
            if proc.exitcode != 0:
                raise RuntimeError(f"measurement {family}/{mode} failed with exit code {proc.exitcode}")
            print(f"| {family} | {mode} | {result['ms']:.1f} | {result['peak_mb']:.0f} |")


if __name__ == "__main__":
    main()
