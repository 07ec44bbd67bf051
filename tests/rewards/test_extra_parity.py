"""Parity with the reference packages, in the image-reward extra venv (``.ci/run``'s last step).

- our batched ImageReward == the package's own ``ImageReward.score`` (one PIL image per call) on a
  randomly initialised ImageReward model loaded through ``ImageReward.load``;
- our HPS model (an OpenCLIP state dict mapped onto transformers' ``CLIPModel``) == ``open_clip``
  itself on the same random weights, and our torch preprocessing == the PIL transforms.

Outside that venv these tests skip, saying why. With ``LIT_TREEGRPO_EXTRA=1`` (set by ``.ci/run``)
a missing package is an error instead, so the CI step cannot pass by skipping everything.
"""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from lit_treegrpo.common.env import env_flag
from lit_treegrpo.rewards.base import (
    CLIP_MEAN,
    CLIP_STD,
    clip_pixels,
    normalize,
    resize_longer_side_and_pad,
)

pytestmark = pytest.mark.extra

REQUIRED = env_flag("LIT_TREEGRPO_EXTRA")  # the one rule for flags (docs/failure_modes.md, rule 4)
PROMPTS = ["a photo of a cat", "a red dog", "a photo of a cat"]


def need(module: str):
    """Import ``module``; skip (with the reason) unless ``LIT_TREEGRPO_EXTRA=1`` demands it."""
    if REQUIRED:
        return importlib.import_module(module)
    return pytest.importorskip(
        module, reason=f"'{module}' is not importable: run in the image-reward extra venv (.ci/run)"
    )


def test_the_extra_imports_where_it_is_required() -> None:
    if not REQUIRED:
        pytest.skip("LIT_TREEGRPO_EXTRA is not 1: not the extra venv")
    for module in ("ImageReward", "open_clip", "torchvision", "timm", "fairscale", "clip"):
        importlib.import_module(module)


def smooth_images(n: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    """[n, 3, h, w] smooth random images with uint8-exact values (PIL sees the same pixels)."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(n, 3, 6, 6, generator=g)
    x = torch.nn.functional.interpolate(low, size=(h, w), mode="bilinear")  # [n, 3, h, w]
    return (x * 255).round() / 255


def to_pil(image: torch.Tensor):
    from PIL import Image

    return Image.fromarray((image.permute(1, 2, 0) * 255).round().byte().numpy())


# ------------------------------------------------------------------------------ ImageReward

BERT_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "photo", "of", "cat", "red", "dog"]


@pytest.fixture(scope="module")
def image_reward_dir(tmp_path_factory):
    """A random ImageReward checkpoint, its med_config.json and a local 'bert-base-uncased'.

    The package builds its tokenizer with ``BertTokenizer.from_pretrained('bert-base-uncased')``;
    a folder of that name in the working directory is what it loads offline."""
    RM = need("ImageReward")
    root = tmp_path_factory.mktemp("image_reward")
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = BERT_WORDS + letters + ["##" + c for c in letters]
    (root / "bert-base-uncased").mkdir()
    (root / "bert-base-uncased" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (root / "bert-base-uncased" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    # a 1-layer BERT; hidden size 768 because the package's MLP is MLP(768)
    med = {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_act": "gelu",
        "hidden_size": 768,
        "intermediate_size": 64,
        "num_attention_heads": 12,
        "num_hidden_layers": 1,
        "max_position_embeddings": 64,
        "type_vocab_size": 2,
        "vocab_size": len(vocab) + 2,
        "pad_token_id": 0,
        "layer_norm_eps": 1e-12,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "initializer_range": 0.02,
        "encoder_width": 1024,
        "add_cross_attention": True,
    }
    (root / "med_config.json").write_text(json.dumps(med))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        torch.manual_seed(0)
        model = RM.ImageReward(med_config=str(root / "med_config.json"), device="cpu")
    for layer in model.mlp.layers:  # the package's init (std 1/769) makes all scores nearly equal
        if isinstance(layer, torch.nn.Linear):
            torch.nn.init.normal_(layer.weight, std=0.1)
            torch.nn.init.normal_(layer.bias, std=0.1)
    torch.save(model.state_dict(), root / "image_reward.pt")
    return root


@pytest.fixture(scope="module")
def image_reward(image_reward_dir):
    from lit_treegrpo.rewards import ImageReward

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(image_reward_dir)
        return ImageReward.from_pretrained(
            image_reward_dir / "image_reward.pt", med_config=image_reward_dir / "med_config.json"
        )


def test_image_reward_batch_equals_the_package_score(image_reward) -> None:
    images = smooth_images(3, 224, 224)  # 224: the package's Resize/CenterCrop leave it as is
    ours = image_reward(images, PROMPTS)
    with torch.no_grad():
        theirs = torch.tensor([image_reward.model.score(p, to_pil(im)) for p, im in zip(PROMPTS, images, strict=True)])
    assert ours.dtype == torch.float32 and ours.shape == (3,)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    assert (ours[1:] - ours[:-1]).abs().min() > 1e-3  # the images (and prompts) matter


def test_image_reward_depends_on_the_prompt_and_batches_exactly(image_reward) -> None:
    images = smooth_images(3, 224, 224, seed=1)
    a = image_reward(images, PROMPTS)
    b = image_reward(images, ["a red dog"] * 3)
    assert ((a - b).abs() > 1e-4).any()
    single = torch.cat([image_reward(images[i : i + 1], [p]) for i, p in enumerate(PROMPTS)])
    torch.testing.assert_close(a, single, rtol=0, atol=1e-5)


def test_image_reward_preprocessing_matches_the_package_on_other_sizes(image_reward) -> None:
    for h, w in ((256, 256), (300, 240), (160, 200)):
        images = smooth_images(2, h, w, seed=h)
        ours = clip_pixels(images, 224)  # [2, 3, 224, 224]
        theirs = torch.stack([image_reward.model.preprocess(to_pil(im)) for im in images])
        # PIL resamples in uint8: one grey level, over CLIP's std ~0.27, bounds the difference
        assert (ours - theirs).abs().max() < 1.1 / 255 / min(CLIP_STD), (h, w)


def test_image_reward_missing_files_give_one_line_errors(tmp_path, monkeypatch) -> None:
    need("ImageReward")
    from lit_treegrpo.rewards import ImageReward, RewardLoadError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # no local 'bert-base-uncased' here
    cases = [
        (lambda: ImageReward.from_pretrained(tmp_path / "none.pt"), str(tmp_path / "none.pt")),
        (lambda: ImageReward.from_pretrained("ImageReward-v1.0"), "'ImageReward-v1.0'"),
    ]
    for load, named in cases:
        with pytest.raises(RewardLoadError) as err:
            load()
        assert "\n" not in str(err.value) and named in str(err.value)


# ------------------------------------------------------------------------------ HPS vs open_clip


@pytest.fixture(scope="module")
def open_clip_tiny(tmp_path_factory):
    """A random OpenCLIP ``CLIP`` of ``TINY_ARCH`` (every parameter perturbed, biases included),
    saved as an HPS checkpoint, and our HPSv2 loaded from it."""
    need("open_clip")
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    from lit_treegrpo.rewards import HPSv2
    from lit_treegrpo.rewards.clip_common import offline_clip_tokenizer
    from lit_treegrpo.rewards.hps import TINY_ARCH as A

    torch.manual_seed(0)
    vision = CLIPVisionCfg(
        layers=A.vision_layers,
        width=A.vision_width,
        head_width=A.vision_head_width,
        patch_size=A.patch_size,
        image_size=A.image_size,
        mlp_ratio=A.mlp_ratio,
    )
    text = CLIPTextCfg(
        context_length=A.context_length,
        vocab_size=A.vocab_size,
        width=A.text_width,
        heads=A.text_heads,
        layers=A.text_layers,
        mlp_ratio=A.mlp_ratio,
    )
    model = CLIP(embed_dim=A.embed_dim, vision_cfg=vision, text_cfg=text, output_dict=True).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    root = tmp_path_factory.mktemp("hps")
    torch.save({"state_dict": model.state_dict()}, root / "hps.pt")
    offline_clip_tokenizer(root)
    return model, HPSv2.from_pretrained(root / "hps.pt", root, arch=A)


def test_hps_mapping_equals_open_clip_on_the_same_weights(open_clip_tiny) -> None:
    model, hps = open_clip_tiny
    images = smooth_images(3, 40, 56)
    pixels = hps.pixels(images)  # [3, 3, 32, 32], the same input on both sides
    ids = hps.tokenizer(PROMPTS)["input_ids"]
    text = torch.zeros(len(PROMPTS), 77, dtype=torch.long)  # open_clip pads with 0 after the EOT
    for i, row in enumerate(ids):
        text[i, : len(row)] = torch.tensor(row)
    with torch.no_grad():
        out = model(pixels, text)
    reference = (out["image_features"] * out["text_features"]).sum(-1)  # HPSv2: diag(I @ T.T)
    torch.testing.assert_close(hps(images, PROMPTS), reference, rtol=0, atol=1e-5)
    with torch.no_grad():
        ours_img = torch.nn.functional.normalize(hps.model.get_image_features(pixel_values=pixels), dim=-1)
    torch.testing.assert_close(ours_img, out["image_features"], rtol=0, atol=1e-5)


def test_hps_preprocessing_matches_open_clip_longest_resize_and_pad(open_clip_tiny) -> None:
    from open_clip.transform import image_transform

    _, hps = open_clip_tiny
    transform = image_transform(hps.image_size, is_train=False, resize_mode="longest")
    for h, w in ((40, 56), (56, 40), (21, 40), (64, 64)):
        images = smooth_images(2, h, w, seed=h + w)
        ours = normalize(resize_longer_side_and_pad(images, hps.image_size), CLIP_MEAN, CLIP_STD)
        theirs = torch.stack([transform(to_pil(im)) for im in images])
        assert ours.shape == theirs.shape
        assert (ours - theirs).abs().max() < 1.1 / 255 / min(CLIP_STD), (h, w)
