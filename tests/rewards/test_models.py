"""Each reward's formula against an independent reference on the same tiny weights."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from torch import nn

from lit_treegrpo.rewards import (
    Aesthetic,
    CLIPScore,
    HPSv2,
    JpegCompressibility,
    JpegIncompressibility,
)
from lit_treegrpo.rewards.aesthetic import AestheticMLP, head_from_state_dict
from lit_treegrpo.rewards.base import (
    CLIP_MEAN,
    CLIP_STD,
    RewardLoadError,
    clip_pixels,
    normalize,
    resize_longer_side_and_pad,
)
from lit_treegrpo.rewards.clip_score import FeatureAdapter
from lit_treegrpo.rewards.hps import (
    TINY_ARCH,
    open_clip_to_transformers,
    random_open_clip_state_dict,
)
from tests.rewards.conftest import PROMPTS


def clip_forward_cosines(reward, pixels: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """cos(image_i, prompt_i) [B] from transformers' own ``CLIPModel.forward`` (its logits are
    logit_scale.exp() * cosines)."""
    enc = reward.tokenizer(prompts, padding=True, return_tensors="pt")
    out = reward.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], pixel_values=pixels)
    return out.logits_per_image.diagonal() / reward.model.logit_scale.exp()  # [B]


# ------------------------------------------------------------------------------ PickScore


def test_pickscore_is_scaled_cosine_of_clip_forward(tiny_rewards, images) -> None:
    reward = tiny_rewards["pickscore"]
    with torch.no_grad():
        cos = clip_forward_cosines(reward, clip_pixels(images, reward.image_size), PROMPTS)
        expected = reward.model.logit_scale.exp() * cos  # PickScore_v1 model card
    torch.testing.assert_close(reward(images, PROMPTS), expected, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------ CLIPScore


def test_clip_score_is_positive_here(tiny_rewards, images) -> None:
    # the premise of the other CLIPScore tests (see conftest.CLIP_SCORE_SEED)
    assert (tiny_rewards["clip_score"](images, PROMPTS) > 0).all()


def test_clip_score_is_clamped_100_cosine(tiny_rewards, images, tmp_path) -> None:
    for reward in (tiny_rewards["clip_score"], CLIPScore.tiny(tmp_path, seed=0)):  # seed 0: cos < 0
        with torch.no_grad():
            cos = clip_forward_cosines(reward, clip_pixels(images, reward.image_size), PROMPTS)
        expected = (100 * cos).clamp(min=0)  # Hessel et al.: max(100 cos, 0)
        torch.testing.assert_close(reward(images, PROMPTS), expected, rtol=0, atol=1e-4)


def test_clip_score_equals_the_torchmetrics_metric_per_image(tiny_rewards, images) -> None:
    from torchmetrics.multimodal import CLIPScore as MetricCLIPScore

    reward = tiny_rewards["clip_score"]
    metric = MetricCLIPScore(model_name_or_path=lambda: (reward.adapter, reward.processor))
    pixels = clip_pixels(images, reward.image_size)
    for i, prompt in enumerate(PROMPTS):
        metric.reset()
        metric.update(pixels[i : i + 1], [prompt])
        torch.testing.assert_close(reward(images[i : i + 1], [prompt])[0], metric.compute(), rtol=0, atol=1e-4)


def test_feature_adapter_returns_the_projected_embedding_tensor(tiny_rewards) -> None:
    model = tiny_rewards["clip_score"].model
    adapter = FeatureAdapter(model)
    pixels = torch.rand(2, 3, 32, 32)
    ids = torch.tensor([[512, 320, 513], [512, 66, 513]])
    with torch.no_grad():
        img, txt = adapter.get_image_features(pixels), adapter.get_text_features(ids)
        ref_img = model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output)
        ref_txt = model.text_projection(model.text_model(input_ids=ids).pooler_output)
    assert isinstance(img, torch.Tensor) and isinstance(txt, torch.Tensor)
    torch.testing.assert_close(img, ref_img)
    torch.testing.assert_close(txt, ref_txt)


# ------------------------------------------------------------------------------ HPSv2


def test_hps_is_cosine_of_clip_forward_on_padded_squares(tiny_rewards, images) -> None:
    reward = tiny_rewards["hps"]
    square = resize_longer_side_and_pad(images, reward.image_size)  # HPSv2's validation transform
    with torch.no_grad():
        expected = clip_forward_cosines(reward, normalize(square, CLIP_MEAN, CLIP_STD), PROMPTS)
    torch.testing.assert_close(reward(images, PROMPTS), expected, rtol=0, atol=1e-5)


def test_hps_mapping_refuses_unknown_and_missing_keys() -> None:
    sd = random_open_clip_state_dict(TINY_ARCH)
    with pytest.raises(ValueError, match=r"1 keys this mapping does not know \(e.g. \['visual.head.weight'\]\)"):
        open_clip_to_transformers({**sd, "visual.head.weight": torch.zeros(1)}, TINY_ARCH)
    del sd["visual.proj"]
    with pytest.raises(KeyError, match="visual.proj"):
        open_clip_to_transformers(sd, TINY_ARCH)


def test_hps_checkpoint_of_another_shape_is_refused(tmp_path) -> None:
    from dataclasses import replace

    wider = replace(TINY_ARCH, vision_width=48, vision_head_width=12)
    torch.save({"state_dict": random_open_clip_state_dict(wider)}, tmp_path / "hps.pt")
    from lit_treegrpo.rewards.clip_common import offline_clip_tokenizer

    offline_clip_tokenizer(tmp_path)
    with pytest.raises(
        ValueError,
        match=r"does not fit .*'vision_model.embeddings.class_embedding \[48\] vs \[32\]'",
    ):
        HPSv2.from_pretrained(tmp_path / "hps.pt", tmp_path, arch=TINY_ARCH)


def test_hps_accepts_module_prefixed_checkpoints(tmp_path) -> None:
    sd = random_open_clip_state_dict(TINY_ARCH, seed=1)
    plain = open_clip_to_transformers(sd, TINY_ARCH)
    prefixed = open_clip_to_transformers({f"module.{k}": v for k, v in sd.items()}, TINY_ARCH)
    assert plain.keys() == prefixed.keys()
    assert all(torch.equal(plain[k], prefixed[k]) for k in plain)


# ------------------------------------------------------------------------------ Aesthetic


def test_aesthetic_is_the_head_on_unit_clip_embeddings(tiny_rewards, images) -> None:
    reward = tiny_rewards["aesthetic"]
    with torch.no_grad():
        out = reward.model(
            pixel_values=clip_pixels(images, reward.image_size),
            input_ids=torch.tensor([[512, 513]] * 4),
        )
        expected = reward.head(out.image_embeds).squeeze(-1)  # CLIPModel.forward normalises them
    torch.testing.assert_close(reward(images, PROMPTS), expected, rtol=0, atol=1e-5)


def test_aesthetic_loads_a_linear_head(tiny_rewards, tmp_path, images) -> None:
    linear = nn.Linear(16, 1)
    torch.save(linear.state_dict(), tmp_path / "linear.pth")
    clip_dir = tmp_path / "clip"
    tiny_rewards["aesthetic"].model.save_pretrained(clip_dir)
    reward = Aesthetic.from_pretrained(tmp_path / "linear.pth", clip_dir)
    assert isinstance(reward.head, nn.Linear)
    with torch.no_grad():
        expected = linear(reward.embed_images(images)).squeeze(-1)
    torch.testing.assert_close(reward(images, PROMPTS), expected, rtol=0, atol=1e-6)


def test_aesthetic_refuses_unknown_heads_and_wrong_sizes(tiny_rewards) -> None:
    with pytest.raises(RewardLoadError, match=r"neither the LAION MLP.*keys: \['fc.weight'\]"):
        head_from_state_dict({"fc.weight": torch.zeros(1, 16)}, "odd.pth")
    with pytest.raises(ValueError, match="head takes 768 features, the CLIP gives 16"):
        Aesthetic(tiny_rewards["aesthetic"].model, AestheticMLP(768))


# ------------------------------------------------------------------------------ JPEG


def test_jpeg_size_is_ddpo_kilobytes_at_quality_95(images) -> None:
    from PIL import Image

    sizes = JpegIncompressibility()(images, PROMPTS)
    for i in range(images.shape[0]):
        # DDPO: (images * 255).round().clamp(0, 255) as uint8, HWC, JPEG quality 95, bytes / 1000
        arr = (images[i] * 255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(arr)).save(buf, format="JPEG", quality=95)
        assert sizes[i].item() == pytest.approx(len(buf.getvalue()) / 1000, abs=1e-6)
    torch.testing.assert_close(JpegCompressibility()(images, PROMPTS), -sizes)


def test_jpeg_prefers_smooth_images_and_follows_quality(images) -> None:
    compress = JpegCompressibility()
    scores = compress(images, PROMPTS)
    assert scores[2] > scores[0] and scores[2] > scores[1]  # the ramp compresses better than noise
    low = JpegCompressibility(quality=20)(images, PROMPTS)
    assert (low > scores).all()  # lower quality, smaller files
    with pytest.raises(ValueError, match=r"quality must be in \[1, 100\], got 0"):
        JpegCompressibility(quality=0)
