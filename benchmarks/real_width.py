"""One training iteration per model family at the real models' widths and reduced depth, on CPU, with
random weights: the check that the adapters work at real size where neither a GPU nor the weights
are available.

Each family's pipeline is built from :mod:`lit_treegrpo.models.published`: the denoiser with its
published widths, heads, norms, RoPE axes and block kinds but 1-2 blocks (SD 1.5: one layer per
UNet block instead of two); the text encoders at their real widths and heads with one layer and
their vocabularies cut to the offline test tokenizers' (which spell words out, so the text itself is
not the real one); the VAE whole; the checkpoint's scheduler. The weights load as the configs load
them, ``torch_dtype: bfloat16`` (configs/sd35.yaml, configs/flux.yaml, ...): the LoRA rows train their
adapters over bf16 base weights, the ``*_full`` rows fine-tune the whole denoiser over float32 master
weights computing in bf16 (configs/sd35_fsdp.yaml's and configs/flux.yaml's setting). Then two
iterations of ``TreeGRPO.step``, the training step ``fit`` runs, built by ``TreeGRPOModule``
(benchmarks/_drive.py): the memory guard, a tree rollout (3 steps, 2 x 2 leaves per prompt; Wan2.2 A14B 4
steps, branching on each expert's side of the boundary), decoding, a random reward, advantages, the
recomputed log-prob of every trained edge, the clipped loss, backward, gradient clipping and an AdamW
step at the config's learning rate.

Recorded per iteration: the largest ``|ratio - 1|`` of the recomputed against the sampled log-probs
before the update, as the step reports it (``logprob_deviation``: the log-prob difference to first
order; 0 up to rounding when training recomputes what sampling computed), whether the loss and every
gradient are finite, and which trainable tensors got an exactly zero gradient (counted from the
second iteration: a LoRA's A gets none while its B is still zero). The ``*_full`` rows also record the
fraction of its weights that the first AdamW step at lr 1e-5 changed, the fraction that would have
changed in bfloat16 weights, and the updates lost: weights whose step (AdamW's first,
``lr |g| / (|g| + eps)``) float32 can hold that did not change (0: the masters keep every update; the
weights left unchanged had a gradient near or at zero, whose step is below float32's resolution, as it
would be in a float32 model). Per family: the peak RSS of its process over the two iterations (after
the build), the model resident.

Each family runs in a fresh process (one thread by default); the rows go to ``--out`` with the
suffixes ``.json`` and ``.md``. ``--tiny`` builds the test suite's tiny pipelines instead (a check of
this script in seconds, not of the widths).

    python benchmarks/real_width.py [--families sd35_medium flux_dev ...] [--out benchmarks/results/real_width] [--threads 1] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _drive import PeakMemory, TorchOptimization, adamw, build_algorithm, random_reward, run_step
from torch import Tensor

#: image side (px), video frames; small: the widths are what is checked, not the resolution
IMAGE, FRAMES, VIDEO = 64, 5, 32
TEXT_TOKENS = 32  # T5 / UMT5 / Qwen2.5-VL tokens kept (CLIP keeps its 77)
FAMILIES = (
    "sd15",
    "sd35_medium",
    "sd35_medium_full",
    "sd35_large",
    "flux_dev",
    "flux_dev_full",
    "qwen_image",
    "wan21_1_3b",
    "wan22_ti2v_5b",
    "wan22_a14b",
)
#: the config's learning rate per family (LoRA: 3e-4 as configs/sd35.yaml; sd35_large.yaml: 1e-4;
#: full fine-tuning: 1e-5 as configs/sd35_fsdp.yaml and configs/flux.yaml)
LR = {"sd35_large": 1e-4, "sd35_medium_full": 1e-5, "flux_dev_full": 1e-5}


# ---------------------------------------------------------------------------------- components
def _seeded(seed: int, build, *args, **kwargs):
    torch.manual_seed(seed)
    return build(*args, **kwargs)


def clip(projection: bool, base: dict[str, Any], seed: int):
    """A real-width CLIP text tower with one layer, its ids those of the offline CLIP tokenizer."""
    from lit_treegrpo.models.published import _clip

    config = dict(base, num_hidden_layers=1, vocab_size=1024, bos_token_id=512, eos_token_id=513, pad_token_id=513)
    return _seeded(seed, _clip(projection), **config)


def t5(base: dict[str, Any], seed: int, umt5: bool = False):
    """A real-width T5 / UMT5 encoder with one layer and the offline T5 tokenizer's vocabulary."""
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    config = dict(base, num_layers=1, vocab_size=256, dropout_rate=0.0, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(seed)
    if umt5:
        return UMT5EncoderModel(UMT5Config(**config, decoder_start_token_id=0))
    return T5EncoderModel(T5Config(**config))


def diffusers_model(name: str, config: dict[str, Any], seed: int):
    import diffusers

    return _seeded(seed, getattr(diffusers, name), **config)


# ---------------------------------------------------------------------------------- pipelines
def sd15():
    from diffusers import DDIMScheduler, StableDiffusionPipeline

    from lit_treegrpo.models.published import CLIP_L, SD15_UNET, SD15_VAE
    from lit_treegrpo.models.tiny import tiny_clip_tokenizer

    folder = _tmp()
    return StableDiffusionPipeline(
        vae=diffusers_model("AutoencoderKL", SD15_VAE, 1),
        text_encoder=clip(False, CLIP_L, 2),
        tokenizer=tiny_clip_tokenizer(folder / "tokenizer"),
        unet=diffusers_model("UNet2DConditionModel", dict(SD15_UNET, layers_per_block=1), 0),
        scheduler=DDIMScheduler(  # SD 1.5's scheduler_config.json (PNDM there; the adapter steps DDIM)
            beta_start=0.00085,
            beta_end=0.012,
            beta_schedule="scaled_linear",
            clip_sample=False,
            set_alpha_to_one=False,
            steps_offset=1,
        ),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def sd3(config: dict[str, Any]):
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    from lit_treegrpo.models.published import CLIP_G, CLIP_L, SD3_VAE, T5_XXL
    from lit_treegrpo.models.tiny import tiny_clip_tokenizer, tiny_t5_tokenizer

    folder = _tmp()
    # two blocks: the first with SD3.5-Medium's dual attention (Large has none), the last
    # context_pre_only, as in the real stacks
    dual = (0,) if config.get("dual_attention_layers") else ()
    transformer = diffusers_model("SD3Transformer2DModel", dict(config, num_layers=2, dual_attention_layers=dual), 0)
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=diffusers_model("AutoencoderKL", SD3_VAE, 1),
        text_encoder=clip(True, CLIP_L, 2),
        tokenizer=tiny_clip_tokenizer(folder / "tokenizer"),
        text_encoder_2=clip(True, CLIP_G, 3),
        tokenizer_2=tiny_clip_tokenizer(folder / "tokenizer_2"),
        text_encoder_3=t5(T5_XXL, 4),
        tokenizer_3=tiny_t5_tokenizer(),
    )


def flux():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    from lit_treegrpo.models.published import CLIP_L, FLUX_DEV, FLUX_DEV_SCHEDULER, FLUX_VAE, T5_XXL
    from lit_treegrpo.models.tiny import tiny_clip_tokenizer, tiny_t5_tokenizer

    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER),
        vae=diffusers_model("AutoencoderKL", FLUX_VAE, 1),
        text_encoder=clip(False, CLIP_L, 2),
        tokenizer=tiny_clip_tokenizer(_tmp() / "tokenizer"),
        text_encoder_2=t5(T5_XXL, 3),
        tokenizer_2=tiny_t5_tokenizer(),
        transformer=diffusers_model("FluxTransformer2DModel", dict(FLUX_DEV, num_layers=1, num_single_layers=1), 0),
    )


def qwen_image():
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    from lit_treegrpo.models.published import (
        QWEN25_VL_7B_TEXT,
        QWEN25_VL_7B_VISION,
        QWEN_IMAGE,
        QWEN_IMAGE_SCHEDULER,
        WAN21_VAE,
    )
    from lit_treegrpo.models.tiny_qwen import qwen_text_encoder, tiny_qwen_tokenizer

    tokenizer = tiny_qwen_tokenizer()
    text = dict(QWEN25_VL_7B_TEXT, num_hidden_layers=1)
    vision = dict(QWEN25_VL_7B_VISION, depth=1, fullatt_block_indexes=[0])
    torch.manual_seed(2)
    text_encoder = qwen_text_encoder(tokenizer, 128, text, vision)  # the offline tokenizer's ids + 4 vision ids
    return QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER),
        vae=diffusers_model("AutoencoderKLQwenImage", WAN21_VAE, 1),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=diffusers_model("QwenImageTransformer2DModel", dict(QWEN_IMAGE, num_layers=2), 0),
    )


def wan(family: str):
    from diffusers import UniPCMultistepScheduler, WanPipeline

    from lit_treegrpo.models.published import UMT5_XXL, WAN21_1_3B, WAN21_VAE, WAN22_A14B, WAN22_TI2V_5B, WAN22_VAE
    from lit_treegrpo.models.tiny import tiny_t5_tokenizer

    # the checkpoints' UniPC with flow sigmas (the adapter steps Euler on its shift): 3.0 is Wan2.1's
    # 480p shift, 5.0 Wan2.2 TI2V-5B's; A14B's is assumed 5.0 here
    shift = 3.0 if family == "wan21_1_3b" else 5.0
    common = dict(
        tokenizer=tiny_t5_tokenizer(model_max_length=512),
        text_encoder=t5(UMT5_XXL, 2, umt5=True),
        scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift),
    )
    if family == "wan21_1_3b":
        transformer = diffusers_model("WanTransformer3DModel", dict(WAN21_1_3B, num_layers=2), 0)
        return WanPipeline(**common, vae=diffusers_model("AutoencoderKLWan", WAN21_VAE, 1), transformer=transformer)
    if family == "wan22_ti2v_5b":
        transformer = diffusers_model("WanTransformer3DModel", dict(WAN22_TI2V_5B, num_layers=2), 0)
        vae = diffusers_model("AutoencoderKLWan", WAN22_VAE, 1)
        return WanPipeline(**common, vae=vae, transformer=transformer, expand_timesteps=True)
    experts = [diffusers_model("WanTransformer3DModel", dict(WAN22_A14B, num_layers=1), s) for s in (0, 3)]
    return WanPipeline(
        **common,
        vae=diffusers_model("AutoencoderKLWan", WAN21_VAE, 1),
        transformer=experts[0],
        transformer_2=experts[1],
        boundary_ratio=0.875,
    )


def _tmp() -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix="real_width_"))


def pipeline(name: str, tiny: bool):
    """The family's real-width pipeline, or with ``tiny`` the test suite's tiny pipeline of the same family."""
    from lit_treegrpo.models.published import SD35_LARGE, SD35_MEDIUM

    if tiny:
        return tiny_pipeline(name)
    if name == "sd15":
        return sd15()
    if name.startswith("sd35"):
        return sd3(SD35_MEDIUM if name == "sd35_medium" else SD35_LARGE)
    if name == "flux_dev":
        return flux()
    if name == "qwen_image":
        return qwen_image()
    return wan(name)


def tiny_pipeline(name: str):
    from lit_treegrpo.models.tiny import tiny_flux_pipeline, tiny_sd3_pipeline, tiny_sd15_pipeline
    from lit_treegrpo.models.tiny_qwen import tiny_qwen_image_pipeline
    from lit_treegrpo.models.tiny_wan import tiny_wan22_pipeline, tiny_wan_pipeline

    builders = {
        "sd15": tiny_sd15_pipeline,
        "sd35_medium": tiny_sd3_pipeline,
        "sd35_large": lambda: tiny_sd3_pipeline(sd35=False),
        "flux_dev": tiny_flux_pipeline,
        "qwen_image": tiny_qwen_image_pipeline,
        "wan21_1_3b": tiny_wan_pipeline,
        "wan22_ti2v_5b": lambda: tiny_wan22_pipeline(kind="ti2v"),
        "wan22_a14b": tiny_wan22_pipeline,
    }
    return builders[name]()


def adapter(family: str, tiny: bool = False):
    """The family's adapter over its pipeline, loaded in bf16 as the configs load it, with the config's LoRA (or
    none: ``*_full``, over float32 master weights)."""
    from lit_treegrpo.models import FluxAdapter, QwenImageAdapter, SD3Adapter, SD15Adapter, WanAdapter
    from lit_treegrpo.models.published import TARGETS

    full = family.endswith("_full")
    name = family.removesuffix("_full")
    parts = pipeline(name, tiny)
    common = dict(num_steps=3, lora=None if full else TARGETS[name].lora, torch_dtype="bfloat16")
    if name == "sd15":
        return SD15Adapter(parts, guidance_scale=5.0, resolution=IMAGE, **common)
    if name.startswith("sd35"):
        return SD3Adapter(parts, guidance_scale=4.5, resolution=IMAGE, max_sequence_length=TEXT_TOKENS, **common)
    if name == "flux_dev":
        return FluxAdapter(
            parts, guidance_scale=3.5, shift=3.0, dynamics="dance_sde", noise_level=0.3, resolution=IMAGE,
            max_sequence_length=TEXT_TOKENS, **common,
        )  # fmt: skip
    if name == "qwen_image":
        return QwenImageAdapter(
            parts, true_cfg_scale=4.0, height=IMAGE, width=IMAGE, max_sequence_length=TEXT_TOKENS, **common
        )
    video = dict(height=VIDEO, width=VIDEO, num_frames=FRAMES, max_sequence_length=TEXT_TOKENS, guidance_scale=5.0)
    if name == "wan22_a14b":
        common["num_steps"] = 4
    return WanAdapter(parts, **video, **common)


def weights_kind(a: Any) -> str:
    """How the trained weights are held: float32 masters under a lower compute dtype, or the LoRA's dtype over the
    base weights'."""
    trained = {p.dtype for p in a.trainable_parameters()}
    name = ", ".join(sorted(str(d).removeprefix("torch.") for d in trained))
    compute = str(a.dtype).removeprefix("torch.")
    if a.lora is None:
        return f"{name} masters, {compute} compute" if trained != {a.dtype} else name
    return f"{name} LoRA over {compute} weights"


# ---------------------------------------------------------------------------------- one family
class RecordingOptimization(TorchOptimization):
    """The optimizer steps of the training step, recording what each left in the gradients (read before they are
    cleared) and, with ``record_first_step``, what the first AdamW step did to the weights."""

    def __init__(self, optimizer: torch.optim.Optimizer, named: list[tuple[str, Tensor]], record_first_step: bool):
        super().__init__(optimizer)
        self.named = named
        self.record_first_step = record_first_step
        self.zero_gradient: list[str] = []  # trained tensors with no or an all-zero gradient at the last step
        self.finite_gradients = True
        self.effect: dict[str, Any] | None = None

    def step(self) -> None:
        if not (self.record_first_step and self.effect is None):
            super().step()
            return
        before = [p.detach().clone() for _, p in self.named]
        grads = [p.grad for _, p in self.named]
        super().step()
        self.effect = first_step_effect(self.named, before, grads, self.optimizer.defaults)

    def zero_grad(self) -> None:  # after every optimizer step or its refusal: the gradients are still there
        self.zero_gradient = [n for n, p in self.named if p.grad is None or not bool(p.grad.ne(0).any())]
        self.finite_gradients = all(p.grad is None or bool(torch.isfinite(p.grad).all()) for _, p in self.named)
        super().zero_grad()


def first_step_effect(
    named: list[tuple[str, Tensor]], before: list[Tensor], grads: list[Tensor | None], defaults: dict[str, Any]
) -> dict[str, Any]:
    """The first AdamW step on float32 masters, and what bf16 weights would have kept of it."""
    moved = [p.detach() != b for (_, p), b in zip(named, before)]
    # AdamW's first step is lr |g| / (|g| + eps); one above |w| 2^-23 (at least a float32 spacing of w)
    # survives float32 rounding, so a weight with such a step that did not move lost it
    lr, eps = defaults["lr"], defaults["eps"]
    kept = [
        lr * g.abs() / (g.abs() + eps) > b.abs() * 2.0**-23 if g is not None else torch.zeros_like(b, dtype=torch.bool)
        for g, b in zip(grads, before)
    ]
    weights = sum(b.numel() for b in before)
    return {
        "weights": weights,
        "steps_below_float32_resolution": sum(int((~k).sum()) for k in kept),
        "lost_updates": sum(int((k & ~m).sum()) for k, m in zip(kept, moved)),
        "changed_fraction": sum(int(m.sum()) for m in moved) / weights,
        "changed_fraction_if_bf16_weights": sum(
            int((p.detach().bfloat16() != b.bfloat16()).sum()) for (_, p), b in zip(named, before)
        )
        / weights,
    }


def run_family(family: str, threads: int, tiny: bool = False) -> dict[str, Any]:
    from lit_treegrpo.core import ClippedPolicyLoss, TreeSpec
    from lit_treegrpo.training.faults import FaultPolicy

    torch.set_num_threads(threads)
    start = time.perf_counter()
    a = adapter(family, tiny)
    built = time.perf_counter() - start
    spec = (
        TreeSpec(4, branch_steps=(1, 2), branching=2)  # one split on each expert's side of the boundary
        if family == "wan22_a14b"
        else TreeSpec(3, branch_steps=(0, 1), branching=2)
    )
    named = [(n, p) for n, p in a.named_parameters() if p.requires_grad]
    full = family.endswith("_full")
    optimization = RecordingOptimization(adamw(a, LR.get(family, 3e-4)), named, record_first_step=full)
    algorithm = build_algorithm(
        a,
        random_reward(video=a.makes_video),
        spec,
        loss=ClippedPolicyLoss(clip_range=1e-4, adv_clip=5.0),
        faults=FaultPolicy(nonfinite="skip"),  # a non-finite loss or gradient is recorded, not raised
    )
    denoisers = a.denoisers().values()
    row: dict[str, Any] = {
        "family": family,
        "denoiser_parameters": sum(p.numel() for m in denoisers for n, p in m.named_parameters() if "lora_" not in n),
        "trainable_parameters": sum(p.numel() for _, p in named),
        "trainable_tensors": len(named),
        "weights": weights_kind(a),
        "build_s": round(built, 1),
        "iterations": [],
    }
    prompts = ["a photo of an astronaut riding a horse"]
    peak = PeakMemory(a.device).reset()
    for it in range(2):
        step = run_step(algorithm, optimization, prompts, iteration=it)
        update = step.update
        loss = float(update.stats.loss) if update.stats is not None else float("nan")
        record = {
            "nfe": step.grown.tree.nfe,
            "trained_edges": int(step.grown.keep.sum()),
            "logprob_deviation": float(update.ratio_dev_at_start) if update.ratio_dev_at_start is not None else None,
            "loss": loss,
            "finite": update.fault is None and optimization.finite_gradients and math.isfinite(loss),
            "zero_grad_tensors": len(optimization.zero_gradient),
            "zero_grad_examples": optimization.zero_gradient[:4],
            "seconds": round(step.total_s, 1),
        }
        if it == 0 and optimization.effect is not None:
            record.update(optimization.effect)
        row["iterations"].append(record)
    row["peak_rss_mb"] = round(peak.mb())
    row["peak_memory"] = peak.kind
    return row


# ---------------------------------------------------------------------------------- report
def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| family | denoiser parameters (reduced depth) | trained | weights | NFE | trained edges "
        "| max abs log-prob deviation, iterations 1 / 2 | finite | zero-gradient tensors in iteration 2 "
        "| first step: weights changed (would in bf16), updates lost | peak RSS (MB) | s / iteration |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['family']} | failed: {r['error']} |" + " |" * 10)
            continue
        i1, i2 = r["iterations"]
        changed = (
            f"{i1['changed_fraction']:.4%} ({i1['changed_fraction_if_bf16_weights']:.1%}), {i1['lost_updates']}"
            if "changed_fraction" in i1
            else "—"
        )
        deviation = " / ".join(
            "—" if i["logprob_deviation"] is None else f"{i['logprob_deviation']:.1e}" for i in (i1, i2)
        )
        lines.append(
            f"| {r['family']} | {r['denoiser_parameters']:,} | {r['trainable_parameters']:,} | {r['weights']} "
            f"| {i1['nfe']} | {i1['trained_edges']} | {deviation} "
            f"| {'yes' if i1['finite'] and i2['finite'] else 'NO'} | {i2['zero_grad_tensors']} | {changed} "
            f"| {r['peak_rss_mb']:,} | {i1['seconds']:.0f} / {i2['seconds']:.0f} |"
        )
    return "\n".join(lines)


def environment(threads: int) -> dict[str, Any]:
    import diffusers
    import transformers

    return {
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "threads": threads,
        "date": time.strftime("%Y-%m-%d"),
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--out", type=Path, default=None,
                   help="the report, written with the suffixes .json and .md (default benchmarks/results/real_width)")  # fmt: skip
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tiny", action="store_true", help="the test suite's tiny pipelines: a check of this script")
    p.add_argument("--one", choices=FAMILIES, help=argparse.SUPPRESS)  # the child process of one family
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(run_family(args.one, args.threads, args.tiny)))
        return []
    if args.tiny and args.out is None:
        p.error("--tiny checks this script, it measures no real width: give --out for its report (e.g. --out /tmp/rw)")
    out = args.out or Path(__file__).parent / "results" / "real_width"
    rows = []
    for family in args.families:
        child = [sys.executable, __file__, "--one", family, "--threads", str(args.threads)] + ["--tiny"] * args.tiny
        done = subprocess.run(child, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            rows.append({"family": family, "error": last[:200]})
        else:
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    report = {
        "environment": environment(args.threads),
        "tiny": args.tiny,
        "image_px": IMAGE,
        "video": [FRAMES, VIDEO, VIDEO],
        "rows": rows,
    }
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(
        f"# Real width, reduced depth: one training iteration per family (benchmarks/real_width.py"
        f"{' --tiny: the tiny pipelines' if args.tiny else ''})\n\n"
        f"{json.dumps(report['environment'])}\n\n{table(rows)}\n"
    )
    return rows


if __name__ == "__main__":
    main()
