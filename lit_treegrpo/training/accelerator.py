"""What the module does differently on an accelerator, kept apart so that it can be checked on the CPU: AdamW's fused
kernel when the parameters are on CUDA (:func:`fused_on_cuda`) and the dtype the denoiser computes in under mixed
precision (:func:`compute_dtype`, which the on-policy check's tolerance follows)."""

from __future__ import annotations

import inspect
from typing import Any

import torch


def fused_on_cuda(optimizer: torch.optim.Optimizer, device: torch.device) -> torch.optim.Optimizer:
    """``optimizer`` rebuilt with ``fused=True`` when it is an Adam or AdamW left at the default implementation
    (neither ``fused`` nor ``foreach`` chosen) and the parameters live on CUDA: one kernel for all parameters
    instead of a loop over them, and step counters kept on the device, so the step reads nothing back from it."""
    if device.type != "cuda" or type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return optimizer
    chosen = optimizer.defaults
    if chosen.get("fused") is not None or chosen.get("foreach") is not None or chosen.get("differentiable"):
        return optimizer
    accepted = inspect.signature(type(optimizer).__init__).parameters  # AdamW's defaults hold more
    options = {k: v for k, v in chosen.items() if k in accepted and k != "params"}
    groups = [{k: v for k, v in group.items() if k != "fused"} for group in optimizer.param_groups]
    return type(optimizer)(groups, **{**options, "fused": True})


def compute_dtype(trainer: Any, weights: torch.dtype) -> torch.dtype:
    """The dtype the denoiser computes in: the autocast's under ``--trainer.precision``
    ``bf16-mixed`` / ``16-mixed`` (or ``-true``), else its weights' (``weights``)."""
    precision = str(getattr(trainer, "precision", "") or "")
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    return weights


__all__ = ["compute_dtype", "fused_on_cuda"]
