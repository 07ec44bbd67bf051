"""Which denoising steps can be stochastic without spoiling the sample: reward per SDE step.

For each sampler (SDE kind and noise level) and each denoising step ``t``, samples whose *only*
stochastic step is ``t`` (every other step the deterministic ODE step) are scored with the reward,
next to the fully deterministic (ODE) samples and samples with every step but the last stochastic
(what flat GRPO trains on). All rows start from the same root noises, so a difference between
rows is the step's injected noise alone.

A step whose noise the remaining steps cannot remove shows up as a reward far below the ODE
row. On the Shapes model (pixel space, no VAE to absorb residual noise) that is step 8, the step
into sigma ~ 0.001: the reason ``ode_tail: 2`` is part of every method's configuration in
``benchmarks/compare_methods.py``.

    python benchmarks/step_noise.py --out benchmarks/results/step_noise   # Shapes model, ~2 min
    python benchmarks/step_noise.py --adapter lit_treegrpo.models.tiny.TinySD3Adapter \\
        --reward brightness --prompts animals --out runs/step_noise_tiny

Writes ``step_noise.json`` and ``step_noise.md`` (the table printed last) to ``--out``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from lit_treegrpo.core import TreeSpec, rollout
from lit_treegrpo.core.seeding import generator
from lit_treegrpo.data import PromptDataModule
from lit_treegrpo.models.base import DiffusionAdapter
from lit_treegrpo.rewards import build_reward

DEFAULT_SAMPLERS = '[{"dynamics": "dance_sde", "noise_level": 0.3}, {"dynamics": "flow_sde", "noise_level": 0.7}]'


def build_adapter(path: str, kwargs: dict[str, Any]) -> DiffusionAdapter:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


@torch.no_grad()
def score(adapter: DiffusionAdapter, reward: Any, spec: TreeSpec, prompts: list[str], seed: int) -> list[float]:
    """Mean reward per prompt of ``spec``'s leaves; root and step noises from per-prompt seeds."""
    cond = adapter.encode_prompts(prompts)
    roots = [generator(seed, i, device=adapter.device) for i in range(len(prompts))]
    noise = torch.cat([adapter.initial_noise(spec.num_trees, g) for g in roots])  # [P * chains, *S]
    steps = [generator(seed, 500_000 + i, device=adapter.device) for i in range(len(prompts))]
    tree = rollout(adapter.predict, adapter.step, spec, cond, noise, generator=steps)
    images = adapter.decode(tree.leaf_latents)  # [P * chains, 3, H, W]
    leaf_prompts = [prompts[i] for i in tree.leaf_prompt.tolist()]
    rewards = reward(images, leaf_prompts).float()  # [P * chains]
    per_prompt = torch.zeros(len(prompts)).index_add_(0, tree.leaf_prompt.cpu(), rewards.cpu())
    return (per_prompt / spec.num_trees).tolist()


def summary(values: list[float]) -> dict[str, float]:
    """Mean over prompts and its standard error."""
    sem = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "sem": sem}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    adapter_kwargs = json.loads(args.adapter_kwargs)
    samplers = json.loads(args.samplers)
    data = PromptDataModule(
        args.prompts, batch_size=1, val_fraction=args.val_fraction, val_size=args.num_prompts, seed=0
    )
    prompts = (data.val_set.prompts if args.val_fraction > 0 else data.train_set.prompts)[: args.num_prompts]
    reward = build_reward(args.reward)
    rows: list[dict[str, Any]] = []
    sigmas = None
    for sampler in samplers:
        adapter = build_adapter(args.adapter, {**adapter_kwargs, **sampler, "num_steps": args.steps})
        adapter.to(args.device)
        if hasattr(adapter, "sigmas"):  # flow adapters: the noise level before / after each step
            sigmas = [round(float(s), 4) for s in adapter.sigmas()]
        T = adapter.num_steps
        label = ", ".join(f"{k} {v}" for k, v in sampler.items())
        specs = [("ODE (no stochastic step)", None, TreeSpec(T, num_trees=args.chains))]
        specs += [
            (f"SDE at step {t} only", t, TreeSpec(T, sde_steps=(t,), num_trees=args.chains)) for t in range(T - 1)
        ]
        specs += [
            (
                f"SDE at steps 0..{T - 2} (flat GRPO)",
                "all",
                TreeSpec(T, sde_steps=tuple(range(T - 1)), num_trees=args.chains),
            )
        ]
        for name, step, spec in specs:
            start = time.perf_counter()
            per_prompt = score(adapter, reward, spec, prompts, args.seed)
            rows.append({"sampler": label, "rows": name, "step": step, **summary(per_prompt), "per_prompt": per_prompt})
            print(
                f"{label:>32} | {name:<32} reward {rows[-1]['mean']:.4f} ± {rows[-1]['sem']:.4f} "
                f"({time.perf_counter() - start:.1f} s)",
                flush=True,
            )
    return {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "prompts": prompts,
        "sigmas": sigmas,
        "rows": rows,
    }


def table(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        f"Reward `{s['reward']}` of {s['num_prompts']} prompts x {s['chains']} samples ({s['adapter'].rsplit('.', 1)[-1]}, "
        f"T={s['steps']}); mean over prompts ± standard error",
        "",
    ]
    sigmas = report["sigmas"]
    samplers = list(dict.fromkeys(r["sampler"] for r in report["rows"]))
    header = "| samples |" + (" sigma -> next |" if sigmas else "") + " " + " | ".join(samplers) + " |"
    lines += [header, "|---|" + ("---|" if sigmas else "") + "---|" * len(samplers)]
    names = list(dict.fromkeys(r["rows"] for r in report["rows"]))
    for name in names:
        cells = [r for r in report["rows"] if r["rows"] == name]
        step = cells[0]["step"]
        sig = ""
        if sigmas:
            sig = f" {sigmas[step]:.3f} -> {sigmas[step + 1]:.3f} |" if isinstance(step, int) else " |"
        lines.append(f"| {name} |{sig} " + " | ".join(f"{c['mean']:.3f} ± {c['sem']:.3f}" for c in cells) + " |")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, help="folder for step_noise.json and step_noise.md")
    p.add_argument(
        "--adapter", default="lit_treegrpo.models.shapes.ShapesAdapter", help="import path of a DiffusionAdapter class"
    )
    p.add_argument("--adapter-kwargs", default="{}", help="JSON keyword arguments of the adapter")
    p.add_argument(
        "--samplers",
        default=DEFAULT_SAMPLERS,
        help="JSON list of adapter keyword sets, one column each (flow adapters: dynamics, noise_level; SD 1.x: eta)",
    )
    p.add_argument("--reward", default="shapes", help="registered reward name")
    p.add_argument("--prompts", default="shapes_world", help="prompt file or built-in set")
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        help="score the held-out split of --prompts (as compare_methods does); 0 takes the first prompts",
    )
    p.add_argument("--num-prompts", type=int, default=12, help="prompts scored")
    p.add_argument("--chains", type=int, default=27, help="samples per prompt")
    p.add_argument("--steps", type=int, default=10, help="denoising steps T")
    p.add_argument("--seed", type=int, default=0, help="seed of the root and step noises")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    args = p.parse_args(argv)
    if args.num_prompts < 2 or args.chains < 1 or args.steps < 2:
        p.error("--num-prompts must be >= 2, --chains >= 1 and --steps >= 2")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    report = measure(args)
    text = table(report)
    (args.out / "step_noise.json").write_text(json.dumps(report, indent=2))
    (args.out / "step_noise.md").write_text(text + "\n")
    print(f"\nwrote {args.out / 'step_noise.json'}\n\n{text}")
    return report


if __name__ == "__main__":
    main()
