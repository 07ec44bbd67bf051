"""``torch_dtype`` means the same for every way an adapter gets its model: loaded from a folder, or
handed a pipeline (or, for the Shapes model, its components) already built. Before, a built
pipeline kept its own dtype whatever the option said."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_treegrpo.core import TreeSpec, rollout
from lit_treegrpo.models import FluxAdapter, QwenImageAdapter, SD3Adapter, SD15Adapter, WanAdapter
from lit_treegrpo.models.shapes import ShapesAdapter, builtin_folder, load_components
from lit_treegrpo.models.tiny import TinyFluxAdapter, TinySD3Adapter, TinySD15Adapter, tiny_sd3_pipeline
from lit_treegrpo.models.tiny_wan import TinyWanAdapter

BUILT = {
    "sd15": lambda **kw: TinySD15Adapter(num_steps=2, **kw),
    "sd3": lambda **kw: TinySD3Adapter(num_steps=2, **kw),
    "flux": lambda **kw: TinyFluxAdapter(num_steps=2, **kw),
    "wan": lambda **kw: TinyWanAdapter(num_steps=2, num_frames=5, **kw),
    "shapes": lambda **kw: ShapesAdapter(load_components(builtin_folder()), num_steps=2, **kw),
}


def _denoises_in(adapter, dtype: torch.dtype) -> None:
    assert adapter.dtype == dtype and adapter.denoiser.dtype == dtype
    frozen = [p for n, p in adapter.denoiser.named_parameters() if "lora_" not in n]
    assert frozen and all(p.dtype == dtype for p in frozen)
    cond = adapter.encode_prompts(["a red circle"])
    leaves = rollout(adapter.predict, adapter.step, TreeSpec(2), cond, adapter.initial_noise(1)).leaf_latents
    assert torch.isfinite(leaves.float()).all()


@pytest.mark.parametrize("family", sorted(BUILT))
def test_a_built_pipeline_is_cast_to_torch_dtype(family: str) -> None:
    adapter = BUILT[family](torch_dtype="bfloat16")
    _denoises_in(adapter, torch.bfloat16)
    if family == "wan":  # Wan's VAE stays float32, as loading a Wan folder keeps it
        assert next(adapter.vae.parameters()).dtype == torch.float32
    assert BUILT[family]().dtype == torch.float32  # the default


def test_a_folder_and_a_built_pipeline_load_alike(tmp_path: Path) -> None:
    tiny_sd3_pipeline(seed=0).save_pretrained(tmp_path / "sd3")
    from_folder = SD3Adapter(str(tmp_path / "sd3"), num_steps=2, torch_dtype="bfloat16")
    built = TinySD3Adapter(seed=0, num_steps=2, torch_dtype="bfloat16")
    _denoises_in(from_folder, torch.bfloat16)
    for (name, a), (_, b) in zip(from_folder.denoiser.state_dict().items(), built.denoiser.state_dict().items()):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    shapes = ShapesAdapter("builtin", num_steps=2, torch_dtype="bfloat16")
    _denoises_in(shapes, torch.bfloat16)


@pytest.mark.parametrize("family", ["sd15", "sd3", "flux", "wan", "qwen_image"])
def test_pretrained_of_another_kind_is_refused_naming_the_pipeline_expected(family: str) -> None:
    """Neither a path nor the family's pipeline (here: a dict of components) fails before any load,
    in one line naming the pipeline class it wanted."""
    adapter, wanted = {
        "sd15": (SD15Adapter, "StableDiffusionPipeline"),
        "sd3": (SD3Adapter, "StableDiffusion3Pipeline"),
        "flux": (FluxAdapter, "FluxPipeline"),
        "wan": (WanAdapter, "WanPipeline"),
        "qwen_image": (QwenImageAdapter, "QwenImagePipeline"),
    }[family]
    with pytest.raises(TypeError, match=f"pretrained must be a path, hub id or {wanted}, got <class 'dict'>"):
        adapter({"transformer": None})
