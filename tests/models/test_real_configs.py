"""The real targets, built from their published configs on the meta device (no weights, no memory):
their parameter counts are the ones the configs' headers and docs/models.md state, the LoRA each
config trains attaches (its targets exist) with the stated number of parameters, and the memory
arithmetic in the headers follows from those counts. The tiny test models keep the real models'
options (SD3.5's dual attention and QK-norm, FLUX's and Qwen-Image's RoPE proportions, Qwen2.5-VL's
grouped-query heads and multimodal RoPE, the Wan2.2 VAE's shape)."""

from __future__ import annotations

import inspect
from functools import cache
from pathlib import Path

import pytest
import yaml

from lit_treegrpo.models import WanAdapter
from lit_treegrpo.models.lora import LoraSettings
from lit_treegrpo.models.published import COMPONENTS, TARGETS, buffers, parameters

ROOT = Path(__file__).resolve().parents[2]
MODELS_DOC = ROOT / "docs" / "models.md"
#: fully fine-tuned configs and their target: float32 weights, gradients and AdamW state, 16 bytes a parameter
FULL = {
    "configs/sd35_fsdp.yaml": "sd35_medium",
    "configs/flux.yaml": "flux_dev",
    "configs/sd35_large.yaml": "sd35_large",
}
#: each target's denoiser, counted once by hand from its config and pinned here (a diffusers release
#: that builds it otherwise shows up as a failure, not as a silently changed header)
EXPECTED = {
    "sd15": 859_520_964,
    "sd35_medium": 2_243_171_520,
    "sd35_large": 8_056_627_520,
    "flux_dev": 11_901_408_320,
    "qwen_image": 20_430_401_088,
    "wan21_1_3b": 1_418_996_800,
    "wan22_ti2v_5b": 4_999_787_712,
    "wan22_a14b": 14_288_491_584,  # each of the two experts
}


@cache
def counts(name: str) -> tuple[int, int, int]:
    """(parameters, buffer values, LoRA parameters of all experts) of a target, on the meta device."""
    model = TARGETS[name].denoiser_on_meta()
    return parameters(model), buffers(model), TARGETS[name].lora_parameters(model)


def header(path: str) -> str:
    """The leading comment of a config file."""
    lines = (ROOT / path).read_text().splitlines()
    return "\n".join(line for line in lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))])


def gb(n: int, bytes_per: int = 16, digits: int = 2) -> str:
    return f"{n * bytes_per / 1e9:.{digits}f} GB"


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_the_published_denoiser_has_the_stated_size_and_its_lora_attaches(name: str) -> None:
    target = TARGETS[name]
    n, buffered, lora = counts(name)
    assert n == EXPECTED[name]
    stated = [f"{n:,}", f"{lora:,}"] + [f"{parameters(COMPONENTS[c].on_meta()):,}" for c in target.components]
    if buffered > 1_000_000:  # SD3's position embedding: a buffer, not a parameter, but memory all the same
        stated.append(f"{buffered:,}")
    doc = MODELS_DOC.read_text()
    assert [s for s in stated if s not in doc] == [], "docs/models.md's table of real sizes"
    if target.config_file is None:
        return
    text = header(target.config_file)
    assert [s for s in stated if s not in text] == [], target.config_file
    assert gb(lora) in text, f"{target.config_file}: the LoRA's float32 weights, gradients and AdamW state"


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_the_lora_counted_is_the_one_the_config_trains(name: str) -> None:
    target = TARGETS[name]
    if target.config_file is None:  # no shipped config: the adapter's default LoRA
        assert target.lora == inspect.signature(WanAdapter).parameters["lora"].default
        return
    lora = yaml.safe_load((ROOT / target.config_file).read_text())["model"]["adapter"]["init_args"]["lora"]
    if lora is None:  # fully fine-tuned: the header's LoRA alternative, rank 32 and alpha 64
        assert target.config_file == "configs/flux.yaml" and target.lora == LoraSettings(rank=32, alpha=64.0)
        assert "{rank: 32, alpha: 64.0}" in header(target.config_file)
        return
    targets = lora.pop("target_modules", None)
    assert target.lora == LoraSettings(**lora, target_modules=tuple(targets) if targets else None)


@pytest.mark.parametrize("config", sorted(FULL))
def test_full_fine_tuning_memory_in_the_header_follows_from_the_count(config: str) -> None:
    n = counts(FULL[config])[0]
    # float32 master weights 4 + gradients 4 + AdamW's two moments 8 bytes per parameter
    assert gb(n, digits=1) in header(config)


def test_qwen_image_lora_layers_and_the_unused_ones() -> None:
    # verl's twelve targets on 60 blocks, less the last block's text query, text output and text MLP
    # (4 layers whose output the model never uses): 716 layers
    from lit_treegrpo.models.lora import attach_lora, unused_submodules

    target = TARGETS["qwen_image"]
    model = target.denoiser_on_meta()
    unused = target.unused(model)
    assert unused == tuple(f"transformer_blocks.59.{m}" for m in ("attn.add_q_proj", "attn.norm_added_q", "attn.to_add_out", "txt_mlp"))  # fmt: skip
    import torch

    with torch.device("meta"):
        attach_lora(model, target.lora, target.default_targets, unused_submodules(model, unused))
    layers = sum(1 for _, m in model.named_modules() if hasattr(m, "lora_A"))
    assert layers == 60 * 12 - 4 == 716
    assert "716 layers" in header("configs/qwen_image.yaml")


def test_sd3_lora_leaves_out_the_last_blocks_text_query_only() -> None:
    # SD3.5-Medium: 8 projections on 24 blocks, but the last block has no text output projection
    # (context_pre_only) and its text query is unused: 24 * 8 - 2 = 190 layers
    import torch

    from lit_treegrpo.models.lora import attach_lora, unused_submodules

    target = TARGETS["sd35_medium"]
    model = target.denoiser_on_meta()
    assert target.unused(model) == ("transformer_blocks.23.attn.add_q_proj", "transformer_blocks.23.attn.norm_added_q")
    with torch.device("meta"):
        attach_lora(model, target.lora, target.default_targets, unused_submodules(model, target.unused(model)))
    assert sum(1 for _, m in model.named_modules() if hasattr(m, "lora_A")) == 24 * 8 - 2


def test_the_tiny_models_have_the_real_architectures_options() -> None:
    from lit_treegrpo.models.published import FLUX_DEV, QWEN25_VL_7B_TEXT, QWEN_IMAGE, SD35_MEDIUM, WAN22_VAE
    from lit_treegrpo.models.tiny import tiny_flux_pipeline, tiny_sd3_pipeline
    from lit_treegrpo.models.tiny_qwen import tiny_qwen_image_pipeline
    from lit_treegrpo.models.tiny_wan import tiny_wan22_pipeline

    def proportions(axes, head_dim):
        return [a / head_dim for a in axes]

    sd3 = tiny_sd3_pipeline(0).transformer.config
    assert sd3.qk_norm == SD35_MEDIUM["qk_norm"] and list(sd3.dual_attention_layers) == [0]  # the first of 2 blocks
    flux = tiny_flux_pipeline(0).transformer.config
    real = proportions(FLUX_DEV["axes_dims_rope"], FLUX_DEV["attention_head_dim"])
    assert proportions(flux.axes_dims_rope, flux.attention_head_dim) == real == [0.125, 0.4375, 0.4375]
    pipe = tiny_qwen_image_pipeline(0)
    qwen = pipe.transformer.config
    assert proportions(qwen.axes_dims_rope, qwen.attention_head_dim) == real
    assert proportions(QWEN_IMAGE["axes_dims_rope"], QWEN_IMAGE["attention_head_dim"]) == real
    text = pipe.text_encoder.config.text_config
    head = text.hidden_size // text.num_attention_heads
    sections = text.rope_parameters["mrope_section"] if hasattr(text, "rope_parameters") else text.rope_scaling["mrope_section"]  # fmt: skip
    real_sections = QWEN25_VL_7B_TEXT["rope_scaling"]["mrope_section"]
    assert [2 * s / head for s in sections] == [2 * s / 128 for s in real_sections] == [0.25, 0.375, 0.375]
    assert text.num_key_value_heads < text.num_attention_heads  # grouped-query attention, as the 7B's 4 of 28
    vae = tiny_wan22_pipeline(0, "ti2v").vae.config
    assert vae.decoder_base_dim / vae.base_dim == WAN22_VAE["decoder_base_dim"] / WAN22_VAE["base_dim"] == 1.6
    for key in ("dim_mult", "num_res_blocks", "is_residual", "patch_size", "z_dim", "scale_factor_spatial"):
        assert vae[key] == WAN22_VAE[key], key


#: the fully fine-tuned FSDP2 configs at 8 ranks: the largest rank's elements, as docs/models.md's table states them
SHARDED = {"configs/flux.yaml": "flux_dev", "configs/sd35_fsdp.yaml": "sd35_medium"}


@pytest.mark.parametrize("config", sorted(SHARDED))
def test_the_memory_guard_counts_a_ranks_shard_of_the_fsdp2_configs(config: str) -> None:
    from lit_treegrpo.training.memory_guard import training_state_bytes

    assert yaml.safe_load((ROOT / config).read_text())["trainer"]["devices"] == 8
    params = list(TARGETS[SHARDED[config]].denoiser_on_meta().parameters())
    gradients, adamw = training_state_bytes(params, None, shards=8)  # float32 masters, AdamW's two moments
    n = parameters(TARGETS[SHARDED[config]].denoiser_on_meta())
    elements = gradients // 4
    assert adamw == 2 * gradients and elements >= n / 8
    row = f"| `{config}` | {n:,} | {elements:,} | {gradients:,} B | {adamw:,} B | {(gradients + adamw) / 1e9:.2f} GB |"
    assert row in MODELS_DOC.read_text(), row
    # an 80 GB GPU after the weights a rank holds (its float32 master shard, the bf16 text encoders and VAE)
    # leaves the guard about 0.9 x 64 = 57 GB: the per-rank state fits, where FLUX's global count did not
    assert gradients + adamw < 57e9
    assert (12 * n > 57e9) == (config == "configs/flux.yaml")
