"""Peak memory of one training micro-batch (forward and backward of ``U`` parents with their
children, as the module's training pass runs it) next to the training guard's estimate
(:func:`lit_treegrpo.training.memory_guard.probe_training`, :func:`lit_treegrpo.core.memory.training_memory`).

The peak is the most tensor bytes alive at once during the micro-batch, counted on any device by
a dispatch mode that follows every storage an operation creates until it is freed: what an
allocator without caching or fragmentation would need (on CPU the process's RSS is too coarse for
a tiny model; on CUDA ``max_memory_allocated`` says the same within the allocator's rounding).
Memory alive before the micro-batch (weights, the tree) is not in it; the gradients it creates
are. Rows come for 1, 4 and 16 parents, with and without gradient checkpointing and CFG: the
estimate's per-parent cost is compared with the measured slope.

    python benchmarks/training_memory.py [--adapter lit_treegrpo.models.tiny.TinySD3Adapter]
        [--adapter-kwargs '{}'] [--device cpu]
"""

from __future__ import annotations

import argparse
import importlib
import json
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

PARENTS = (1, 4, 16)
NUM_STEPS = 3


class LiveTensorBytes(TorchDispatchMode):
    """The most bytes of storages created inside it that were alive at once (:attr:`peak`)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and type(t) is torch.Tensor:
                storage = t.untyped_storage()
                known = self.live.get(storage.data_ptr())
                if known is None or known[0].expired():
                    self.live[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
        self.live = {address: entry for address, entry in self.live.items() if not entry[0].expired()}
        self.peak = max(self.peak, sum(size for _, size in self.live.values()))
        return out


def measure(adapter: Any, parents: int, children: int) -> int:
    """Peak live bytes of a forward and backward over ``parents`` source rows, ``children`` each."""
    cond = adapter.encode_prompts(["a red circle"] * parents)
    x = adapter.initial_noise(parents, torch.Generator(adapter.device).manual_seed(0))  # [U, *S]
    group = torch.arange(parents, device=x.device).repeat_interleave(children)  # [U * k]
    steps = torch.zeros(parents, dtype=torch.long, device=x.device)
    for p in adapter.trainable_parameters():
        p.grad = None
    with LiveTensorBytes() as live:
        out = adapter.predict(x, steps, cond)
        step = adapter.step(out[group], x[group], steps[group], stochastic=True, prev_sample=x[group])
        step.log_prob.sum().backward()
    return live.peak


def rows(adapter_path: str, adapter_kwargs: dict, device: str) -> list[dict]:
    from lit_treegrpo.core.memory import training_memory
    from lit_treegrpo.core.spec import TreeSpec
    from lit_treegrpo.training.memory_guard import probe_training

    torch.set_num_threads(1)
    module, _, name = adapter_path.rpartition(".")
    spec = TreeSpec(NUM_STEPS, branch_steps=(0,), branching=2)
    results = []
    for guidance in (1.0, 4.5):
        for checkpointing in (False, True):
            kwargs = {"num_steps": NUM_STEPS, "guidance_scale": guidance, "gradient_checkpointing": checkpointing}
            adapter = getattr(importlib.import_module(module), name)(**{**kwargs, **adapter_kwargs}).to(device)
            cond = adapter.encode_prompts(["a red circle"])
            noise = adapter.initial_noise(1, torch.Generator(device).manual_seed(0))
            saved = probe_training(adapter, spec, cond, noise)
            trainable = sum(p.numel() * p.element_size() for p in adapter.trainable_parameters())
            estimate = training_memory(
                saved, checkpointing=checkpointing, trainable_bytes=trainable, optimizer_state_bytes=0, held_bytes=0
            )
            peaks = [measure(adapter, parents, 2) for parents in PARENTS]
            slope = (peaks[-1] - peaks[0]) / (PARENTS[-1] - PARENTS[0])
            results.append(
                {
                    "cfg": adapter.do_cfg,
                    "checkpointing": checkpointing,
                    "per_parent": estimate.per_parent,
                    "slope": slope,
                    "estimates": [estimate.total(u) for u in PARENTS],
                    "peaks": peaks,
                }
            )
    return results


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--adapter", default="lit_treegrpo.models.tiny.TinySD3Adapter", help="import path of a DiffusionAdapter class"
    )
    parser.add_argument(
        "--adapter-kwargs",
        "--adapter_kwargs",
        dest="adapter_kwargs",
        default="{}",
        help="JSON keyword arguments of the adapter",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args(argv)
    results = rows(args.adapter, json.loads(args.adapter_kwargs), args.device)
    print(f"\n## {args.adapter}, T={NUM_STEPS}, 2 children per parent, {args.device}\n")
    print(
        "| CFG | checkpointing | estimate / parent (kB) | measured slope (kB) | estimate / measured | "
        + " | ".join(f"{u} parents: estimate / peak (kB)" for u in PARENTS)
        + " |"
    )
    print("|---|---|---|---|---|" + "---|" * len(PARENTS))
    for r in results:
        pairs = " | ".join(f"{e / 1e3:.0f} / {p / 1e3:.0f}" for e, p in zip(r["estimates"], r["peaks"]))
        print(
            f"| {r['cfg']} | {r['checkpointing']} | {r['per_parent'] / 1e3:.0f} | {r['slope'] / 1e3:.0f} | "
            f"{r['per_parent'] / r['slope']:.2f} | {pairs} |"
        )
    return results


if __name__ == "__main__":
    main()
