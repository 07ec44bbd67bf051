"""Reward throughput: one batched call vs one call per image (how peers score), side by side.

Every reward is the tiny random model of the tests (``PickScore.tiny`` ...), so the numbers
measure the per-call overhead that batching removes (tokenizing, preprocessing, small kernels),
not a real model's compute; on a GPU with real models batching also fills the device. With the
image-reward extra installed (its own venv, see docs/rewards.md), ImageReward is measured too, on a
randomly initialised model of the real size (ViT-L/16; slow on a CPU, hence ``--image-reward``).

Ratios are what to read. Run:
    python benchmarks/reward_cost.py [--batch 16] [--size 64] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

import torch

from lit_treegrpo.rewards import (
    Aesthetic,
    CLIPScore,
    HPSv2,
    JpegCompressibility,
    JpegIncompressibility,
    PickScore,
    RewardModel,
)

PROMPTS = ["a photo of a cat", "a red dog on the grass", "sunset over the sea", "a bowl of fruit"]


def seconds(fn, repeats: int) -> float:
    """Median wall-clock of ``fn()`` over ``repeats`` runs, after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def throughput(reward: RewardModel, images: torch.Tensor, prompts: list[str], repeats: int) -> tuple[float, float]:
    """(images/s batched, images/s one by one)."""
    n = images.shape[0]
    batched = seconds(lambda: reward(images, prompts), repeats)
    single = seconds(lambda: [reward(images[i : i + 1], [prompts[i]]) for i in range(n)], repeats)
    return n / batched, n / single


def tiny_image_reward(folder: Path):
    """A randomly initialised ImageReward of the real architecture, with an offline tokenizer
    (needs the image-reward extra). See tests/rewards/test_extra_parity.py for the recipe."""
    import json
    import os

    import ImageReward as RM

    from lit_treegrpo.rewards import ImageReward

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [chr(c) for c in range(97, 123)]
    (folder / "bert-base-uncased").mkdir(parents=True, exist_ok=True)
    (folder / "bert-base-uncased" / "vocab.txt").write_text("\n".join(words) + "\n")
    med = {
        "model_type": "bert",
        "hidden_size": 768,
        "intermediate_size": 64,
        "num_attention_heads": 12,
        "num_hidden_layers": 1,
        "max_position_embeddings": 64,
        "vocab_size": len(words) + 2,
        "encoder_width": 1024,
        "add_cross_attention": True,
    }
    (folder / "med_config.json").write_text(json.dumps(med))
    cwd = os.getcwd()
    os.chdir(folder)  # the package loads 'bert-base-uncased' from here when offline
    try:
        model = RM.ImageReward(med_config=str(folder / "med_config.json"), device="cpu")
    finally:
        os.chdir(cwd)
    return ImageReward(model.eval())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16, help="images per batch")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--image-reward", action="store_true", help="also ImageReward (needs the extra)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(0)
    images = torch.rand(args.batch, 3, args.size, args.size, generator=g)  # [B, 3, S, S]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.batch)]

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rewards: dict[str, RewardModel] = {
            "pickscore (tiny)": PickScore.tiny(root / "pickscore"),
            "clip_score (tiny)": CLIPScore.tiny(root / "clip_score"),
            "hps (tiny)": HPSv2.tiny(root / "hps"),
            "aesthetic (tiny)": Aesthetic.tiny(root / "aesthetic"),
            "jpeg_compressibility": JpegCompressibility(),
            "jpeg_incompressibility": JpegIncompressibility(),
        }
        if args.image_reward:
            if importlib.util.find_spec("ImageReward") is None:
                print("ImageReward: the image-reward extra is not installed here; skipped")
            else:
                rewards["image_reward (random ViT-L)"] = tiny_image_reward(root / "image_reward")

        print(
            f"\n## Reward throughput: {args.batch} images of {args.size}x{args.size}, "
            f"{args.threads} thread(s), median of {args.repeats}\n"
        )
        print("| reward | images/s batched | images/s one by one | batched / one by one |")
        print("|---|---|---|---|")
        for name, reward in rewards.items():
            fast, slow = throughput(reward, images, prompts, args.repeats)
            print(f"| {name} | {fast:.1f} | {slow:.1f} | {fast / slow:.1f}x |")


if __name__ == "__main__":
    main()
