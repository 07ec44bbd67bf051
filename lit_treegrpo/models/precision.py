"""Float32 master weights for a denoiser fully fine-tuned in bfloat16 / float16: such a weight keeps 8 (bf16) or 11
(fp16) significant bits, so an AdamW step of lr 1e-5 rounds away on most weights."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

LOW = (torch.bfloat16, torch.float16)


def to_master_weights(model: nn.Module) -> None:
    """Every parameter of ``model`` in float32 (the optimizer steps these; the forward casts them)."""
    for p in model.parameters():
        p.data = p.data.float()


def warn_low_precision_weights(low: torch.dtype) -> None:
    """The one-line warning of a full fine-tuning that asked for low-precision weights themselves."""
    warnings.warn(
        f"master_weights false: the denoiser fine-tunes its {str(low).removeprefix('torch.')} weights themselves, "
        f"which round away any update below ~{torch.finfo(low).eps / 2:.2%} of a weight (AdamW at lr 1e-5 leaves "
        "most weights unchanged); set --model.adapter.init_args.master_weights true for float32 master weights",
        UserWarning,
        stacklevel=4,
    )


def fsdp_policy(compute: torch.dtype | None) -> dict[str, Any]:
    """``fully_shard``'s mixed-precision keyword for float32 masters computing in ``compute`` (none without masters)."""
    if compute is None:
        return {}
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return {
        "mp_policy": MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32, cast_forward_inputs=False)
    }


def weights_dtype(model: nn.Module) -> torch.dtype:
    """The dtype diffusers' ``ModelMixin.dtype`` gives (the first floating-point weight outside the modules kept in
    float32), read without its walk over every submodule for layerwise-casting hooks, which this package never
    attaches."""
    keep = getattr(model, "_keep_in_fp32_modules", None) or ()
    for name, param in model.named_parameters():
        if param.is_floating_point() and not any(m in name for m in keep):
            return param.dtype
    return model.dtype  # no such weight: diffusers' own rule (its buffers, its last dtype)
