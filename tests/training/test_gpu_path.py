"""What the module does differently when its parameters are on CUDA, checked on the CPU where the
kernels exist there too."""

from __future__ import annotations

import pytest
import torch

from lit_treegrpo.training.module import fused_on_cuda

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
