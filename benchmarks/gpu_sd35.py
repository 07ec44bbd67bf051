"""Per-iteration seconds and peak memory of TreeGRPO vs DanceGRPO on an SD3.5-Medium-shaped transformer, on a GPU,
through the training step ``fit`` runs (``TreeGRPO.step``), with LoRA and with full fine-tuning.

No download: the transformer is diffusers' ``SD3Transformer2DModel`` built on the GPU from SD3.5
Medium's published configuration (``lit_treegrpo.models.published.SD35_MEDIUM``: 24 MMDiT blocks of
width 1536, dual attention in blocks 0-12, RMS QK-norm; 2,243,171,520 parameters plus a
226,492,416-value position-embedding buffer) with random weights, in bf16. Text encoders are left
out: each prompt gets fixed random embeddings of the shapes configs/sd35.yaml trains with (CLIP's 77
tokens and the 128 T5 tokens of SD3Adapter's ``max_sequence_length``: 205 x 4096, pooled 2048),
since the denoiser is what a GRPO iteration spends its time on. Rewards are random and no VAE
decodes (every method pays those alike per leaf). CFG doubles every forward (guidance 4.5), 512 px
images (64x64x16 latents), gradient checkpointing. Two trainings, each row on a freshly built model
and optimizer: ``lora``, a rank-32 LoRA (configs/sd35.yaml's, without the last block's unused text
query) at lr 3e-4; ``full``, the whole transformer over float32 master weights computing in bf16
(configs/sd35_fsdp.yaml's) at lr 1e-5. AdamW (weight decay 1e-4, fused on CUDA as the module makes it).

One *iteration* is one ``TreeGRPO.step`` built by ``TreeGRPOModule`` (benchmarks/_drive.py): rollout without
grad, scoring, advantages, pruning, then the policy-gradient update (micro-batches of whole parents, as many
optimizer steps as the method's ``minibatches``, the memory guard sizing the forwards). Methods (per prompt):

- ``treegrpo``: k=3 on steps 0-2 of 10 (27 leaves, 202 NFE, 13 training forwards), 4 optimizer steps
  (configs/sd35.yaml);
- ``dancegrpo_g12``: 12 SDE chains (DanceGRPO's group), a random 60% of the 9 SDE steps trained (its
  ``PruningSchedule`` step_fraction), 3 optimizer steps (configs/methods/dancegrpo.yaml);
- ``dancegrpo_g27``: the same with 27 chains (matched leaves);
- ``mixgrpo_g12``: 12 chains with an SDE window of 4 steps, 4 optimizer steps (not run unless named).

Prints seconds per iteration (rollout, reward, training, total; median of the timed iterations after one
warm-up), the peak memory of each row (CUDA: the most torch allocated over the timed iterations; CPU: the
process's peak RSS) and ratios to dancegrpo_g12 and to the matched dancegrpo_g27 of the same training;
``--json`` writes them. ``--tiny --device cpu`` runs the same code on a tiny transformer (what the test suite
does). ``--max-seconds`` bounds the run: no row or timed iteration starts after that many seconds (the rows so
far are reported, the rest named as skipped).

Switches (the project's own options, so a run shows what each is worth on the GPU):

- ``--precision``: ``bf16`` (weights in bfloat16 as configs/sd35.yaml loads them, the default on CUDA; full
  fine-tuning keeps float32 masters over them), ``bf16-mixed`` (float32 weights under bfloat16 autocast, as
  ``--trainer.precision bf16-mixed``) or ``fp32``;
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

    python benchmarks/gpu_sd35.py [--prompts 1] [--repeats 2] [--methods ...] [--training lora full]
        [--precision bf16] [--compile] [--prompt-cache] [--max-seconds S] [--json results.json]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import statistics
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
from _drive import PeakMemory, StepResult, TorchOptimization, adamw, build_algorithm, random_reward, run_step
from torch import Tensor

from lit_treegrpo.core import ClippedPolicyLoss, TreeSpec
from lit_treegrpo.core.pruning import PruningPlan
from lit_treegrpo.core.spec import RolloutLimits
from lit_treegrpo.models.base import Cond
from lit_treegrpo.models.flow import FlowMatchingAdapter
from lit_treegrpo.models.lora import SD3_LORA_TARGETS, LoraSettings
from lit_treegrpo.models.published import SD35_MEDIUM
from lit_treegrpo.models.sd3 import SD3Adapter, sd3_transformer_forward, sd3_unused_modules
from lit_treegrpo.training.prompt_cache import PromptCacheSettings

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
    """An SD3-shaped policy with random weights and random per-prompt text embeddings; ``lora_rank`` None fine-tunes
    the whole transformer (float32 master weights under bf16 weights, as SD3Adapter)."""

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
        lora_rank: int | None = 32,
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
            lora=None if lora_rank is None else LoraSettings(rank=lora_rank, alpha=2.0 * lora_rank),
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
        """A grey 8 x 8 stand-in per leaf: the rewards are random, so no VAE runs."""
        return torch.full((latents.shape[0], 3, 8, 8), 0.5, device=latents.device)


@dataclass(frozen=True)
class Method:
    """A method's tree per prompt and how it trains: TreeGRPO as configs/sd35.yaml, the others as their
    configs/methods presets (the trees fixed, so that every iteration costs the same)."""

    tree: TreeSpec
    minibatches: int
    """optimizer steps per iteration"""
    step_fraction: float = 1.0
    """the stochastic steps trained each iteration (DanceGRPO's ``PruningSchedule``: 0.6)"""


def methods() -> dict[str, Method]:
    sde = tuple(range(9))
    return {
        "treegrpo": Method(TreeSpec(10, branch_steps=(0, 1, 2), branching=3), minibatches=4),
        "dancegrpo_g27": Method(TreeSpec(10, sde_steps=sde, num_trees=27), minibatches=3, step_fraction=0.6),
        "dancegrpo_g12": Method(TreeSpec(10, sde_steps=sde, num_trees=12), minibatches=3, step_fraction=0.6),
        "mixgrpo_g12": Method(TreeSpec(10, sde_steps=(0, 1, 2, 3), num_trees=12), minibatches=4),
    }


DEFAULT_METHODS = ("treegrpo", "dancegrpo_g27", "dancegrpo_g12")
#: training -> learning rate: the LoRA of configs/sd35.yaml, the full fine-tuning of configs/sd35_fsdp.yaml
LEARNING_RATE = {"lora": 3e-4, "full": 1e-5}


@dataclass(frozen=True)
class Run:
    """What every row of a run shares."""

    prompts: list[str]
    repeats: int
    max_batch: int
    prompt_cache: PromptCacheSettings
    autocast: torch.dtype | None
    fused_adamw: bool
    deadline: float | None
    """``time.perf_counter()`` after which no row or timed iteration starts (None: no bound)"""

    def in_time(self) -> bool:
        return self.deadline is None or time.perf_counter() < self.deadline


def measure(adapter: RandomSD3Adapter, method: Method, lr: float, run: Run) -> dict[str, float]:
    """One row: ``TreeGRPO.step`` of ``method`` on ``adapter`` with a fresh AdamW, one warm-up iteration, then up to
    ``run.repeats`` timed ones: their median seconds per phase, the work counted and the peak memory."""
    optimization = TorchOptimization(adamw(adapter, lr, fused=run.fused_adamw))
    algorithm = build_algorithm(
        adapter,
        random_reward(video=False),
        method.tree,
        loss=ClippedPolicyLoss(clip_range=1e-4, adv_clip=5.0, aggregation="sum"),  # configs/sd35.yaml's
        minibatches=method.minibatches,
        rollout=RolloutLimits(max_batch=run.max_batch),
        prompt_cache=run.prompt_cache,
    )
    pruning = PruningPlan(step_fraction=method.step_fraction)

    def step(iteration: int) -> StepResult:
        return run_step(
            algorithm, optimization, run.prompts, iteration=iteration, pruning=pruning, autocast=run.autocast
        )

    step(0)  # warm-up: the memory guard's probe, the optimizer's state, compilation, allocator growth
    peak = PeakMemory(adapter.device).reset()
    runs: list[StepResult] = []
    for r in range(run.repeats):
        if runs and not run.in_time():
            break
        runs.append(step(r + 1))
    seconds = {phase: statistics.median(r.seconds[phase] for r in runs) for phase in runs[0].seconds}
    return {
        "rollout_s": seconds["rollout"],
        "reward_s": seconds["reward"] + seconds["advantages"],
        "train_s": seconds["train"],
        "total_s": sum(seconds.values()),
        "leaves": method.tree.num_leaves,
        "nfe": runs[0].grown.tree.nfe,
        "train_forwards": runs[0].trained_forwards,
        "optimizer_steps": runs[0].update.steps,
        "peak_gib": peak.mb() * 1e6 / 2**30,
        "timed_iterations": len(runs),
    }


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [
        "| training | method | leaves / prompt | NFE | training forwards | optimizer steps | rollout s | reward s "
        "| training s | iteration s | peak GiB | speed-up vs dancegrpo_g12 | speed-up vs dancegrpo_g27 (matched leaves) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for training, rows in results.items():
        for method, r in rows.items():
            ratios = [f"{rows[ref]['total_s'] / r['total_s']:.2f}x" if ref in rows else "—"
                      for ref in ("dancegrpo_g12", "dancegrpo_g27")]  # fmt: skip
            lines.append(
                f"| {training} | {method} | {r['leaves']} | {r['nfe']} | {r['train_forwards']} "
                f"| {r['optimizer_steps']} | {r['rollout_s']:.2f} | {r['reward_s']:.3f} | {r['train_s']:.2f} "
                f"| {r['total_s']:.2f} | {r['peak_gib']:.2f} | {ratios[0]} | {ratios[1]} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (the benchmark's purpose) or cpu (with --tiny)")
    p.add_argument("--tiny", action="store_true", help="a tiny transformer instead of SD3.5 Medium's shape")
    p.add_argument("--prompts", type=int, default=1, help="prompts per iteration")
    p.add_argument("--repeats", type=int, default=2, help="timed iterations per row (median), after one warm-up")
    p.add_argument("--resolution", type=int, default=512, help="image side in pixels (latents are 1/8)")
    p.add_argument("--max-batch", type=int, default=64, help="nodes per rollout model call (--model.rollout.max_batch)")
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=list(methods()))
    p.add_argument("--training", nargs="+", default=list(LEARNING_RATE), choices=list(LEARNING_RATE),
                   help="lora (rank 32) and / or full (float32 master weights)")  # fmt: skip
    p.add_argument("--precision", choices=("bf16", "bf16-mixed", "fp32"), default=None,
                   help="bf16 weights (default on CUDA), float32 weights under bf16 autocast, or float32 (default on CPU)")  # fmt: skip
    p.add_argument("--compile", action="store_true", help="torch.compile the denoiser (the adapters' compile option)")
    p.add_argument("--prompt-cache", action="store_true", help="the prompt-embedding cache in front of the embeddings")
    p.add_argument("--no-fused-adamw", action="store_true", help="AdamW's default implementation, not the fused one")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="start no row or timed iteration after this many seconds from the start")  # fmt: skip
    p.add_argument("--json", type=Path, default=None, help="also write the results (and the switches) to this file")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no GPU is visible; run on a GPU machine, or pass --tiny --device cpu for a smoke run")
    device = torch.device(args.device)
    precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    config = TINY if args.tiny else SD35_MEDIUM
    resolution = config["sample_size"] * 8 if args.tiny else args.resolution
    run = Run(
        prompts=[f"prompt {i}" for i in range(args.prompts)],
        repeats=args.repeats,
        max_batch=args.max_batch,
        prompt_cache=PromptCacheSettings(size=max(8, 2 * args.prompts) if args.prompt_cache else 0),
        autocast=torch.bfloat16 if precision == "bf16-mixed" else None,
        fused_adamw=not args.no_fused_adamw,
        deadline=None if args.max_seconds is None else time.perf_counter() + args.max_seconds,
    )

    def build(training: str) -> RandomSD3Adapter:
        rank = None if training == "full" else 4 if args.tiny else 32
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        return RandomSD3Adapter(
            config, dtype=dtype, resolution=resolution, lora_rank=rank, compile=args.compile, device=device
        ).to(device)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    switches: dict[str, object] = {}
    results: dict[str, dict[str, dict[str, float]]] = {training: {} for training in args.training}
    skipped: list[str] = []
    # method by method, both trainings each, so that a bound run keeps the comparisons it reached
    for method in args.methods:
        for training in args.training:
            if not run.in_time():
                skipped.append(f"{method} ({training})")
                continue
            adapter = build(training)
            switches = switches or describe(adapter, name, precision, resolution, args)
            results[training][method] = row = measure(adapter, methods()[method], LEARNING_RATE[training], run)
            print(f"{method} ({training}): {row['total_s']:.2f} s / iteration, {row['peak_gib']:.2f} GiB", flush=True)
            del adapter
            release(device)
    print(f"\n{table(results)}")
    if skipped:
        print(f"\nskipped (past --max-seconds {args.max_seconds:g}): {', '.join(skipped)}")
    if args.json is not None:
        report = {"switches": switches, "peak_memory": PeakMemory(device).kind, "results": results, "skipped": skipped}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return results


def describe(
    adapter: RandomSD3Adapter, device_name: str, precision: str, resolution: int, args: argparse.Namespace
) -> dict[str, object]:
    """Print and return what the run measures: the model, the switches and the machine."""
    params = sum(p.numel() for n, p in adapter.denoiser.named_parameters() if "lora_" not in n)
    buffered = sum(b.numel() for b in adapter.denoiser.buffers())
    fused = not args.no_fused_adamw and adapter.device.type == "cuda"  # what adamw() builds
    print(
        f"\n## SD3.5-Medium-shaped transformer ({params:,} parameters + a {buffered:,}-value position buffer; "
        f"{TEXT_TOKENS} text tokens) on {device_name}: {args.prompts} prompt(s), {resolution} px, CFG; "
        f"training {' and '.join(args.training)}; precision {precision}, compile {args.compile}, "
        f"prompt cache {args.prompt_cache}, fused AdamW {fused}\n"
    )
    return {"precision": precision, "compile": args.compile, "prompt_cache": args.prompt_cache, "fused_adamw": fused,
            "device": device_name, "torch": torch.__version__, "parameters": params, "position_buffer": buffered,
            "text_tokens": TEXT_TOKENS, "prompts": args.prompts, "resolution": resolution}  # fmt: skip


def release(device: torch.device) -> None:
    """Free a row's model and optimizer before the next is built, so that each row's peak is its own."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
