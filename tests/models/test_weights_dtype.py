"""The adapters' dtype is diffusers' ``ModelMixin.dtype``, read without its walk over every
submodule (a cost paid at every denoiser call): the same dtype for every family and weight dtype,
modules kept in float32 included."""

from __future__ import annotations

import pytest
import torch

from lit_treegrpo.models.precision import weights_dtype


@pytest.mark.parametrize("torch_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "build",
    [
        "lit_treegrpo.models.shapes:ShapesAdapter",
        "lit_treegrpo.models.tiny:TinySD3Adapter",
        "lit_treegrpo.models.tiny:TinySD15Adapter",
        "lit_treegrpo.models.tiny_wan:TinyWanAdapter",  # WanTransformer3DModel keeps modules in float32
    ],
)
def test_the_adapters_dtype_is_diffusers_dtype_of_the_denoiser(build: str, torch_dtype: str) -> None:
    import importlib

    module, _, name = build.partition(":")
    adapter = getattr(importlib.import_module(module), name)(num_steps=2, torch_dtype=torch_dtype)
    assert weights_dtype(adapter.denoiser) == adapter.denoiser.dtype == getattr(torch, torch_dtype)
    assert adapter.dtype == adapter.denoiser.dtype


def test_a_weight_kept_in_float32_is_passed_over_as_diffusers_does() -> None:
    from diffusers import WanTransformer3DModel

    keep = WanTransformer3DModel._keep_in_fp32_modules
    assert keep, "diffusers no longer keeps modules of this model in float32: pick another model"

    class Model(torch.nn.Module):
        _keep_in_fp32_modules = keep

        def __init__(self) -> None:
            super().__init__()
            setattr(self, keep[0], torch.nn.Linear(2, 2))  # first, in float32
            self.body = torch.nn.Linear(2, 2).to(torch.bfloat16)

    assert weights_dtype(Model()) == torch.bfloat16
