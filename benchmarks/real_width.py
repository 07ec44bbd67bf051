"""One tree iteration per model family at the real models' widths and reduced depth, on CPU, with
random weights: the check that the adapters work at real size where neither a GPU nor the weights
are available.

Each family's pipeline is built from :mod:`lit_treegrpo.models.published`: the denoiser with its
published widths, heads, norms, RoPE axes and block kinds but 1-2 blocks (SD 1.5: one layer per
UNet block instead of two); the text encoders at their real widths and heads with one layer and
their vocabularies cut to the offline test tokenizers' (which spell words out, so the text itself is
not the real one); the VAE whole; the checkpoint's scheduler. Then, through the project's adapter
and engine, two iterations of: a tree rollout (3 steps, 2 x 2 leaves per prompt; Wan2.2 A14B 4
steps, branching on each expert's side of the boundary), decoding, a brightness reward, advantages,
the recomputed log-prob of every trained edge, the clipped loss, backward and an AdamW step at the
config's learning rate.

Recorded per iteration: the largest ``|recomputed - sampled|`` log-prob before the update (0 up to
float rounding when training recomputes what sampling computed), whether the loss and every
gradient are finite, and which trainable tensors got an exactly zero gradient (counted from the
second iteration: a LoRA's A gets none while its B is still zero). The ``*_full`` rows fine-tune
the whole denoiser in bfloat16 over float32 master weights (configs/sd35_fsdp.yaml's and
configs/flux.yaml's setting) and record the fraction of its weights that the first AdamW step at lr
1e-5 changed, the fraction that would have changed in bfloat16 weights, and the updates lost: weights
whose step (AdamW's first, ``lr |g| / (|g| + eps)``) float32 can hold that did not change (0: the
masters keep every update; the weights left unchanged had a gradient near or at zero, whose step is
below float32's resolution, as it would be in a float32 model).

Each family runs in a fresh process (one thread by default); the rows go to ``--out`` with the
suffixes ``.json`` and ``.md``.

    python benchmarks/real_width.py [--families sd35_medium flux_dev ...] [--out benchmarks/results/real_width] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

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


def adapter(family: str):
    """The family's adapter over its real-width pipeline, with the config's LoRA (or none: ``*_full``)."""
    from lit_treegrpo.models import FluxAdapter, QwenImageAdapter, SD3Adapter, SD15Adapter, WanAdapter
    from lit_treegrpo.models.published import SD35_LARGE, SD35_MEDIUM, TARGETS

    full = family.endswith("_full")
    name = family.removesuffix("_full")
    lora = None if full else TARGETS[name].lora
    common = dict(num_steps=3, lora=lora, torch_dtype="bfloat16" if full else "float32")
    if name == "sd15":
        return SD15Adapter(sd15(), guidance_scale=5.0, resolution=IMAGE, **common)
    if name.startswith("sd35"):
        config = SD35_MEDIUM if name == "sd35_medium" else SD35_LARGE
        return SD3Adapter(sd3(config), guidance_scale=4.5, resolution=IMAGE, max_sequence_length=TEXT_TOKENS, **common)
    if name == "flux_dev":
        return FluxAdapter(
            flux(), guidance_scale=3.5, shift=3.0, dynamics="dance_sde", noise_level=0.3, resolution=IMAGE,
            max_sequence_length=TEXT_TOKENS, **common,
        )  # fmt: skip
    if name == "qwen_image":
        return QwenImageAdapter(
            qwen_image(), true_cfg_scale=4.0, height=IMAGE, width=IMAGE, max_sequence_length=TEXT_TOKENS, **common
        )
    video = dict(height=VIDEO, width=VIDEO, num_frames=FRAMES, max_sequence_length=TEXT_TOKENS, guidance_scale=5.0)
    if name == "wan22_a14b":
        common["num_steps"] = 4
    return WanAdapter(wan(name), **video, **common)


# ---------------------------------------------------------------------------------- one family
def run_family(family: str, threads: int) -> dict[str, Any]:
    from lit_treegrpo.core import ClippedPolicyLoss, TreeSpec, recompute_log_probs, rollout, tree_advantages

    torch.set_num_threads(threads)
    start = time.perf_counter()
    a = adapter(family)
    built = time.perf_counter() - start
    spec = (
        TreeSpec(4, branch_steps=(1, 2), branching=2)  # one split on each expert's side of the boundary
        if family == "wan22_a14b"
        else TreeSpec(3, branch_steps=(0, 1), branching=2)
    )
    params = [(n, p) for n, p in a.named_parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([p for _, p in params], lr=LR.get(family, 3e-4), weight_decay=0.0)
    loss_fn = ClippedPolicyLoss(clip_range=1e-4, adv_clip=5.0)
    denoisers = a.denoisers().values()
    row: dict[str, Any] = {
        "family": family,
        "denoiser_parameters": sum(p.numel() for m in denoisers for n, p in m.named_parameters() if "lora_" not in n),
        "trainable_parameters": sum(p.numel() for _, p in params),
        "trainable_tensors": len(params),
        "weights": "float32 masters, bf16 compute"
        if a.dtype != params[0][1].dtype
        else str(a.dtype).removeprefix("torch."),
        "build_s": round(built, 1),
        "iterations": [],
    }
    prompts = ["a photo of an astronaut riding a horse"]
    for it in range(2):
        t0 = time.perf_counter()
        cond = a.encode_prompts(prompts)
        gen = torch.Generator().manual_seed(it)
        noise = a.initial_noise(len(prompts), gen)
        tree = rollout(a.predict, a.step, spec, cond, noise, generator=[gen])
        images = a.decode(tree.leaf_latents)
        rewards = images.float().mean(dim=tuple(range(1, images.ndim)))  # [L] brightness
        rewards = rewards + 1e-3 * torch.arange(len(rewards))  # random weights may give equal images
        adv = tree_advantages(rewards, tree.edge_parent, tree.leaf_edge, tree.leaf_prompt)
        edges = torch.arange(tree.num_edges)
        optimizer.zero_grad(set_to_none=True)
        new = recompute_log_probs(a.predict, a.step, tree, edges, cond)
        deviation = float((new.step.log_prob.detach().float() - tree.edge_old_log_prob[edges].float()).abs().max())
        out = loss_fn(new.step.log_prob, tree.edge_old_log_prob[edges], adv[edges], group=new.group)
        out.loss.backward()
        grads = [p.grad for _, p in params]
        finite = all(g is None or bool(torch.isfinite(g).all()) for g in grads) and bool(torch.isfinite(out.loss))
        zero = [n for n, p in params if p.grad is None or not bool(p.grad.ne(0).any())]
        before = [p.detach().clone() for _, p in params] if family.endswith("_full") and it == 0 else None
        optimizer.step()
        record = {
            "nfe": tree.nfe,
            "trained_edges": int(tree.num_edges),
            "logprob_deviation": deviation,
            "loss": float(out.loss),
            "finite": finite,
            "zero_grad_tensors": len(zero),
            "zero_grad_examples": zero[:4],
            "seconds": round(time.perf_counter() - t0, 1),
        }
        if before is not None:  # the first AdamW step on float32 masters, and what bf16 weights would keep
            moved = [p.detach() != b for (_, p), b in zip(params, before)]
            # AdamW's first step is lr |g| / (|g| + eps); one above |w| 2^-23 (at least a float32
            # spacing of w) survives float32 rounding, so a weight with such a step that did not move lost it
            lr, eps = optimizer.defaults["lr"], optimizer.defaults["eps"]
            kept = [lr * g.abs() / (g.abs() + eps) > b.abs() * 2.0**-23 for g, b in zip(grads, before)]
            record["weights"] = sum(b.numel() for b in before)
            record["steps_below_float32_resolution"] = sum(int((~k).sum()) for k in kept)
            record["lost_updates"] = sum(int((k & ~m).sum()) for k, m in zip(kept, moved))
            record["changed_fraction"] = sum(int(m.sum()) for m in moved) / record["weights"]
            record["changed_fraction_if_bf16_weights"] = (
                sum(int((p.detach().bfloat16() != b.bfloat16()).sum()) for (_, p), b in zip(params, before))
                / record["weights"]
            )
        row["iterations"].append(record)
    return row


# ---------------------------------------------------------------------------------- report
def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| family | denoiser parameters (reduced depth) | trained | weights | NFE | trained edges "
        "| max abs log-prob deviation, iterations 1 / 2 | finite | zero-gradient tensors in iteration 2 "
        "| first step: weights changed (would in bf16), updates lost | s / iteration |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['family']} | failed: {r['error']} |" + " |" * 9)
            continue
        i1, i2 = r["iterations"]
        changed = (
            f"{i1['changed_fraction']:.4%} ({i1['changed_fraction_if_bf16_weights']:.1%}), {i1['lost_updates']}"
            if "changed_fraction" in i1
            else "—"
        )
        lines.append(
            f"| {r['family']} | {r['denoiser_parameters']:,} | {r['trainable_parameters']:,} | {r['weights']} "
            f"| {i1['nfe']} | {i1['trained_edges']} | {i1['logprob_deviation']:.1e} / {i2['logprob_deviation']:.1e} "
            f"| {'yes' if i1['finite'] and i2['finite'] else 'NO'} | {i2['zero_grad_tensors']} | {changed} "
            f"| {i1['seconds']:.0f} / {i2['seconds']:.0f} |"
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
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "real_width",
                   help="the report, written with the suffixes .json and .md")  # fmt: skip
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--one", choices=FAMILIES, help=argparse.SUPPRESS)  # the child process of one family
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(run_family(args.one, args.threads)))
        return []
    rows = []
    for family in args.families:
        done = subprocess.run(
            [sys.executable, __file__, "--one", family, "--threads", str(args.threads)], capture_output=True, text=True
        )
        if done.returncode != 0:
            rows.append({"family": family, "error": done.stderr.strip().splitlines()[-1][:200]})
        else:
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    report = {
        "environment": environment(args.threads),
        "image_px": IMAGE,
        "video": [FRAMES, VIDEO, VIDEO],
        "rows": rows,
    }
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(
        f"# Real width, reduced depth: one tree iteration per family (benchmarks/real_width.py)\n\n"
        f"{json.dumps(report['environment'])}\n\n{table(rows)}\n"
    )
    return rows


if __name__ == "__main__":
    main()
