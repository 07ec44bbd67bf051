"""Per-iteration cost of TreeGRPO vs flat GRPO on an SD3.5-Medium-shaped transformer, on a GPU.

No download: the transformer is diffusers' ``SD3Transformer2DModel`` built on the GPU from SD3.5
Medium's published configuration (``lit_treegrpo.models.published.SD35_MEDIUM``: 24 MMDiT blocks of
width 1536, dual attention in blocks 0-12, RMS QK-norm; 2,243,171,520 parameters plus a
226,492,416-value position-embedding buffer) with random weights, in bf16. Text encoders are left
out: each prompt gets fixed random embeddings of the shapes configs/sd35.yaml trains with (CLIP's 77
tokens and the 128 T5 tokens of SD3Adapter's ``max_sequence_length``: 205 x 4096, pooled 2048),
since the denoiser is what a GRPO iteration spends its time on. Rewards are random (every method
pays the reward model equally per leaf). CFG doubles every forward (guidance 4.5), 512 px images
(64x64x16 latents), a rank-32 LoRA trains (configs/sd35.yaml's, without the last block's unused text
query) with gradient checkpointing.

One *iteration* = rollout (no grad) + recomputing the trained edges' log-probs with grad in
micro-batches + backward + one optimizer step. Methods (per prompt):

- ``treegrpo``: k=3 on steps 0-2 of 10 (27 leaves, 202 NFE, 13 training forwards);
- ``dancegrpo_g12``: 12 SDE chains (DanceGRPO's group), 60% of the 9 SDE steps trained;
- ``dancegrpo_g27``: 27 SDE chains (matched leaves), 60% of the steps trained;
- ``mixgrpo_g12``: 12 chains with an SDE window of 4 steps.

Prints absolute seconds per iteration (rollout, reward, training, total), the peak accelerator
memory of each method and ratios to dancegrpo_g12 and to the matched dancegrpo_g27; ``--json``
writes them. ``--tiny --device cpu`` runs the same code path on a tiny transformer (what the test
suite does). ``--max-seconds`` bounds the run: no method or timed iteration starts after that many
seconds (the rows so far are reported, the rest named as skipped).

Switches (the project's own options, so a run shows what each is worth on the GPU):

- ``--precision``: ``bf16`` (weights in bfloat16, the default on CUDA), ``bf16-mixed`` (float32
  weights under bfloat16 autocast, as ``--trainer.precision bf16-mixed``) or ``fp32``;
- ``--compile``: ``torch.compile`` of the denoiser (the adapters' ``compile`` option; the warm-up
  iteration pays the compilation, the timed ones do not);
- ``--prompt-cache``: the prompt-embedding cache (``--model.prompt_cache``) in front of the text
  embeddings;
- ``--no-fused-adamw``: AdamW's default implementation instead of the fused one the module picks on
  CUDA.

On a GPU machine without network access (docs/benchmarks.md, "The GPU benchmark on a machine
without a registry"): carry the wheels ``benchmarks/gpu_wheels.sh`` downloads, then run
``bash benchmarks/gpu_machine.sh`` (installs them with ``--no-index``, prints the versions, runs
this script with ``--max-seconds 360``). Not yet run on a GPU: none has been lent to this project.

    python benchmarks/gpu_sd35.py [--prompts 1] [--repeats 2] [--resolution 512] [--precision bf16]
        [--compile] [--prompt-cache] [--max-seconds S] [--json results.json]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import statistics
import time
import zlib
from pathlib import Path

import torch
from torch import Tensor

from lit_treegrpo.core import (
    ClippedPolicyLoss,
    TreeSpec,
    recompute_log_probs,
    rollout,
    source_minibatches,
    tree_advantages,
)
from lit_treegrpo.models.base import Cond
from lit_treegrpo.models.flow import FlowMatchingAdapter
from lit_treegrpo.models.lora import SD3_LORA_TARGETS, LoraSettings
from lit_treegrpo.models.published import SD35_MEDIUM
from lit_treegrpo.models.sd3 import SD3Adapter, sd3_transformer_forward, sd3_unused_modules
from lit_treegrpo.training.accelerator import fused_on_cuda
from lit_treegrpo.training.prompt_cache import PromptCache, PromptCacheSettings

TINY = dict(
    sample_size=16,
    patch_size=2,
    in_channels=4,
    out_channels=4,
    num_layers=2,
    attention_head_dim=8,
    num_attention_heads=2,
    joint_attention_dim=32,
    caption_projection_dim=16,
    pooled_projection_dim=24,
    pos_embed_max_size=16,
    qk_norm="rms_norm",
    dual_attention_layers=(0,),
)
SD35_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "sd35.yaml"


def sd35_text_tokens() -> int:
    """Text tokens per prompt as configs/sd35.yaml trains: CLIP's 77 plus T5's ``max_sequence_length``
    (the config's, else SD3Adapter's default)."""
    import yaml

    args = yaml.safe_load(SD35_CONFIG.read_text())["model"]["adapter"]["init_args"]
    return 77 + args.get("max_sequence_length", inspect.signature(SD3Adapter).parameters["max_sequence_length"].default)


TEXT_TOKENS = sd35_text_tokens()  # 77 + 128 = 205


class RandomSD3Adapter(FlowMatchingAdapter):
    """An SD3-shaped policy with random weights and random per-prompt text embeddings."""

    lora_layers_arg = "transformer"

    def __init__(
        self,
        config: dict,
        *,
        dtype: torch.dtype,
        resolution: int,
        num_steps: int = 10,
        guidance_scale: float = 4.5,
        noise_level: float = 0.7,
        dynamics: str = "flow_sde",
        lora_rank: int = 32,
        gradient_checkpointing: bool = True,
        text_tokens: int = TEXT_TOKENS,
        compile: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel

        super().__init__(
            num_steps=num_steps,
            guidance_scale=guidance_scale,
            negative_prompt="",
            lora=LoraSettings(rank=lora_rank, alpha=2.0 * lora_rank),
            decode_batch_size=1,
            gradient_checkpointing=gradient_checkpointing,
            compile=compile,
        )
        self._init_flow(noise_level, dynamics)
        torch.manual_seed(0)
        with torch.device(device):  # initialised where it runs: a CPU initialises 2.2B weights for minutes
            self.denoiser = SD3Transformer2DModel(**config).to(dtype)
        self.text_tokens = text_tokens
        self.latent_side = resolution // 8
        self._set_schedule(FlowMatchEulerDiscreteScheduler(shift=3.0))
        self._setup_training(SD3_LORA_TARGETS)

    def unused_modules(self, model: torch.nn.Module) -> tuple[str, ...]:
        return sd3_unused_modules(model)

    def _embed(self, text: str, device: torch.device) -> tuple[Tensor, Tensor]:
        gen = torch.Generator().manual_seed(zlib.crc32(text.encode()))
        c = self.denoiser.config
        tokens = torch.randn(self.text_tokens, c.joint_attention_dim, generator=gen)  # [L, D]
        pooled = torch.randn(c.pooled_projection_dim, generator=gen)  # [D']
        return tokens.to(device, self.dtype), pooled.to(device, self.dtype)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        text, pooled = zip(*(self._embed(p, self.device) for p in prompts))
        cond = {"prompt_embeds": torch.stack(text), "pooled_prompt_embeds": torch.stack(pooled)}
        if self.do_cfg:
            neg_text, neg_pooled = self._embed("", self.device)
            cond["negative_prompt_embeds"] = neg_text.expand(len(prompts), -1, -1)
            cond["negative_pooled_prompt_embeds"] = neg_pooled.expand(len(prompts), -1)
        return cond

    def _denoise(self, x: Tensor, t: Tensor, cond: Cond, *, negative: bool) -> Tensor:
        return sd3_transformer_forward(self.denoiser, x, t, cond, negative=negative, dtype=self.dtype)

    def initial_noise(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        return self._draw_noise((n, self.denoiser.config.in_channels, self.latent_side, self.latent_side), generator)

    def decode(self, latents: Tensor) -> Tensor:
        raise NotImplementedError("the benchmark scores random rewards; nothing is decoded")


def specs() -> dict[str, tuple[TreeSpec, float]]:
    """name -> (tree, fraction of the stochastic steps trained)."""
    sde = tuple(range(9))
    return {
        "treegrpo": (TreeSpec(10, branch_steps=(0, 1, 2), branching=3), 1.0),
        "dancegrpo_g12": (TreeSpec(10, sde_steps=sde, num_trees=12), 0.6),
        "dancegrpo_g27": (TreeSpec(10, sde_steps=sde, num_trees=27), 0.6),
        "mixgrpo_g12": (TreeSpec(10, sde_steps=(0, 1, 2, 3), num_trees=12), 1.0),
    }


def iteration(
    adapter: RandomSD3Adapter,
    spec: TreeSpec,
    fraction: float,
    prompts: list[str],
    optimizer: torch.optim.Optimizer,
    train_batch: int,
    seed: int,
    max_batch: int = 64,
    cache: PromptCache | None = None,
    autocast: torch.dtype | None = None,
) -> tuple[float, float, float, int, int]:
    """One timed GRPO iteration: (rollout s, reward s, training s, NFE, training forwards)."""
    device = adapter.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    amp = torch.autocast(device.type, dtype=autocast) if autocast is not None else contextlib.nullcontext()
    gens = [torch.Generator(device).manual_seed(seed * 1000 + i) for i in range(len(prompts))]
    cond = cache.encode(adapter, prompts) if cache is not None else adapter.encode_prompts(prompts)
    noise = torch.cat([adapter.initial_noise(spec.num_trees, g) for g in gens])
    sync()
    start = time.perf_counter()
    with amp:
        tree = rollout(adapter.predict, adapter.step, spec, cond, noise, generator=gens, max_batch=max_batch)
    sync()
    rolled = time.perf_counter()
    # random rewards: every method would pay the reward model alike per leaf
    rewards = torch.rand(tree.num_leaves, generator=torch.Generator().manual_seed(seed)).to(device)
    adv = tree_advantages(rewards, tree.edge_parent, tree.leaf_edge, tree.leaf_prompt)
    sync()
    scored = time.perf_counter()
    stochastic = [t for t in range(spec.num_steps) if spec.is_stochastic(t)]
    chosen = torch.randperm(len(stochastic), generator=torch.Generator().manual_seed(seed))
    trained = torch.tensor(
        [stochastic[i] for i in chosen[: math.ceil(fraction * len(stochastic) - 1e-9)]], device=device
    )
    keep = torch.isin(tree.edge_step, trained)
    sources = int(torch.unique(tree.edge_source[keep]).numel())
    chunks = max(1, -(-sources // train_batch))
    loss_fn = ClippedPolicyLoss()
    for edges in source_minibatches(tree, keep, num_batches=chunks, generator=torch.Generator().manual_seed(seed)):
        if edges.numel() == 0:
            continue
        with amp:
            new = recompute_log_probs(adapter.predict, adapter.step, tree, edges, cond)
            out = loss_fn(new.step.log_prob, tree.edge_old_log_prob[edges], adv[edges], group=new.group)
        (out.loss / chunks).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync()
    return rolled - start, scored - rolled, time.perf_counter() - scored, tree.nfe, sources


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (the benchmark's purpose) or cpu (with --tiny)")
    p.add_argument("--tiny", action="store_true", help="a tiny transformer instead of SD3.5 Medium's shape")
    p.add_argument("--prompts", type=int, default=1, help="prompts per iteration")
    p.add_argument("--repeats", type=int, default=2, help="timed iterations per method (median), after one warm-up")
    p.add_argument("--resolution", type=int, default=512, help="image side in pixels (latents are 1/8)")
    p.add_argument("--max-batch", type=int, default=64, help="nodes per rollout model call (x2 rows with CFG)")
    p.add_argument("--train-batch", type=int, default=16, help="sources per training micro-batch")
    p.add_argument("--methods", nargs="+", default=None, help="subset of " + ", ".join(specs()))
    p.add_argument("--precision", choices=("bf16", "bf16-mixed", "fp32"), default=None,
                   help="bf16 weights (default on CUDA), float32 weights under bf16 autocast, or float32 (default on CPU)")  # fmt: skip
    p.add_argument("--compile", action="store_true", help="torch.compile the denoiser (the adapters' compile option)")
    p.add_argument("--prompt-cache", action="store_true", help="the prompt-embedding cache in front of the embeddings")
    p.add_argument("--no-fused-adamw", action="store_true", help="AdamW's default implementation, not the fused one")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="start no method or timed iteration after this many seconds from the model's build")  # fmt: skip
    p.add_argument("--json", type=Path, default=None, help="also write the results (and the switches) to this file")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no GPU is visible; run on a GPU machine, or pass --tiny --device cpu for a smoke run")
    device = torch.device(args.device)
    precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    autocast = torch.bfloat16 if precision == "bf16-mixed" else None
    config = TINY if args.tiny else SD35_MEDIUM
    resolution = config["sample_size"] * 8 if args.tiny else args.resolution
    adapter = RandomSD3Adapter(
        config,
        dtype=dtype,
        resolution=resolution,
        lora_rank=4 if args.tiny else 32,
        compile=args.compile,
        device=device,
    ).to(device)
    started = time.perf_counter()
    optimizer = torch.optim.AdamW(adapter.trainable_parameters(), lr=1e-6)
    if not args.no_fused_adamw:
        optimizer = fused_on_cuda(optimizer, device)
    cache = PromptCache(PromptCacheSettings(size=max(8, 2 * args.prompts))) if args.prompt_cache else None
    prompts = [f"prompt {i}" for i in range(args.prompts)]
    params = sum(p.numel() for n, p in adapter.denoiser.named_parameters() if "lora_" not in n)
    buffered = sum(b.numel() for b in adapter.denoiser.buffers())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"\n## SD3.5-Medium-shaped transformer ({params:,} parameters + a {buffered:,}-value position buffer, "
        f"{dtype}; {TEXT_TOKENS} text tokens) on {name}: "
        f"{args.prompts} prompt(s), {resolution} px, CFG, LoRA r{adapter.lora.rank}; precision {precision}, "
        f"compile {args.compile}, prompt cache {args.prompt_cache}, fused AdamW {optimizer.defaults.get('fused')}\n"
    )
    run = dict(max_batch=args.max_batch, cache=cache, autocast=autocast)
    chosen = {k: v for k, v in specs().items() if args.methods is None or k in args.methods}
    results: dict[str, dict[str, float]] = {}
    skipped: list[str] = []

    def in_time() -> bool:
        return args.max_seconds is None or time.perf_counter() - started < args.max_seconds

    for method, (spec, fraction) in chosen.items():
        if not in_time():
            skipped.append(method)
            continue
        iteration(adapter, spec, fraction, prompts, optimizer, args.train_batch, seed=0, **run)  # warm-up
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        runs = []
        for r in range(args.repeats):
            if runs and not in_time():
                break
            runs.append(iteration(adapter, spec, fraction, prompts, optimizer, args.train_batch, seed=r + 1, **run))
        roll, reward, train = (statistics.median(r[i] for r in runs) for i in range(3))
        results[method] = {
            "rollout_s": roll,
            "reward_s": reward,
            "train_s": train,
            "total_s": roll + reward + train,
            "leaves": spec.num_leaves,
            "nfe": runs[0][3],
            "train_forwards": runs[0][4],
            "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan"),
            "timed_iterations": len(runs),
        }
        print(f"{method}: {results[method]['total_s']:.2f} s / iteration", flush=True)
    print(
        "\n| method | leaves / prompt | NFE | training forwards | rollout s | reward s | training s | iteration s "
        "| peak GiB | speed-up vs dancegrpo_g12 | speed-up vs dancegrpo_g27 (matched leaves) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for method, r in results.items():
        ratios = []
        for ref in ("dancegrpo_g12", "dancegrpo_g27"):
            ratios.append(f"{results[ref]['total_s'] / r['total_s']:.2f}x" if ref in results else "—")
        print(
            f"| {method} | {r['leaves']} | {r['nfe']} | {r['train_forwards']} | {r['rollout_s']:.2f} | "
            f"{r['reward_s']:.3f} | {r['train_s']:.2f} | {r['total_s']:.2f} | {r['peak_gib']:.1f} | "
            f"{ratios[0]} | {ratios[1]} |"
        )
    if skipped:
        print(f"\nskipped (past --max-seconds {args.max_seconds:g}): {', '.join(skipped)}")
    if args.json is not None:
        switches = {"precision": precision, "compile": args.compile, "prompt_cache": args.prompt_cache,
                    "fused_adamw": bool(optimizer.defaults.get("fused")), "device": name, "torch": torch.__version__,
                    "parameters": params, "position_buffer": buffered, "text_tokens": TEXT_TOKENS}  # fmt: skip
        report = {"switches": switches, "methods": results, "skipped": skipped}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
