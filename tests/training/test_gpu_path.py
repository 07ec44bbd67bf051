"""What the module does differently when its parameters are on CUDA, checked on the CPU where the
kernels exist there too."""

from __future__ import annotations

import math

import pytest
import torch

from lit_treegrpo.training.accelerator import fused_on_cuda

CUDA = torch.device("cuda")  # only a label here: fused_on_cuda reads the device type


def _params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]


@pytest.mark.parametrize("cls", [torch.optim.AdamW, torch.optim.Adam])
def test_adam_left_at_its_default_becomes_fused_on_cuda(cls) -> None:
    plain, fusable = _params(), _params()
    reference = cls(plain, lr=0.1, betas=(0.8, 0.9), weight_decay=0.05)
    fused = fused_on_cuda(cls(fusable, lr=0.1, betas=(0.8, 0.9), weight_decay=0.05), CUDA)
    assert type(fused) is cls and fused.defaults["fused"] is True
    assert [g["fused"] for g in fused.param_groups] == [True]
    assert fused.param_groups[0]["params"] == fusable
    for key in ("lr", "betas", "weight_decay", "eps", "amsgrad"):
        assert fused.defaults[key] == reference.defaults[key], key
    for _ in range(3):  # the same updates, to float rounding
        for opt, params in ((reference, plain), (fused, fusable)):
            opt.zero_grad()
            sum((p**2).sum() for p in params).backward()
            opt.step()
    for a, b in zip(plain, fusable):
        torch.testing.assert_close(a, b)


def test_other_choices_are_left_alone() -> None:
    cpu = torch.optim.AdamW(_params())
    assert fused_on_cuda(cpu, torch.device("cpu")) is cpu  # the CPU keeps the default (bitwise runs)
    chosen = torch.optim.AdamW(_params(), foreach=False)  # a choice made in the config
    assert fused_on_cuda(chosen, CUDA) is chosen
    sgd = torch.optim.SGD(_params(), lr=0.1)
    assert fused_on_cuda(sgd, CUDA) is sgd


@pytest.mark.parametrize("family", ["sd3", "sd15"])
def test_bf16_mixed_precision_trains_on_policy(tmp_path, family: str) -> None:
    """``--trainer.precision bf16-mixed``: the denoiser runs under bfloat16 autocast, in sampling
    and in training alike, so the first micro-batch's ratios are 1 within bfloat16's tolerance
    (1e-3; measured 0 here), the losses are finite, and the on-policy check does not warn."""
    import warnings

    from lit_treegrpo.core import TreeSpec
    from lit_treegrpo.models.tiny import TinySD3Adapter, TinySD15Adapter
    from lit_treegrpo.rewards import Brightness
    from lit_treegrpo.training.module import TreeGRPOModule
    from tests.probes import logged_metrics
    from tests.training.test_module import fit

    adapter = (TinySD3Adapter if family == "sd3" else TinySD15Adapter)(num_steps=3, guidance_scale=1.0)
    model = TreeGRPOModule(adapter, reward=Brightness(), tree=TreeSpec(branch_steps=(0, 1), branching=2))
    logged = logged_metrics(model)
    outputs: set[torch.dtype] = set()
    denoise = adapter._denoise

    def recorded(*args, **kwargs):
        out = denoise(*args, **kwargs)
        outputs.add(out.dtype)
        return out

    adapter._denoise = recorded
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*importance ratios.*")
        fit(model, 2, tmp_path, precision="bf16-mixed")
    assert outputs == {torch.bfloat16}  # autocast reached the denoiser
    deviations = [m["health/ratio_dev_at_start"] for m in logged if "health/ratio_dev_at_start" in m]
    losses = [m["loss"] for m in logged if "loss" in m]
    assert len(deviations) == 2 and max(deviations) <= 1e-3, deviations
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), losses
