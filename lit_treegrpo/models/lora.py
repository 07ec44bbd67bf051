"""LoRA through peft on a diffusers denoiser: attach, export in the diffusers format, load back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ..core.choices import check_choice

# Attention projections, as DDPO (SD 1.x UNet) and Flow-GRPO (SD3 joint attention) train them.
LoRAInit = Literal["gaussian", "default"]
SD15_LORA_TARGETS: tuple[str, ...] = ("to_q", "to_k", "to_v", "to_out.0")
SD3_LORA_TARGETS: tuple[str, ...] = (
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
)

# FLUX: the same suffixes reach the attention of both block kinds. The double-stream blocks' joint
# attention has all eight; the single-stream blocks' attention has only to_q / to_k / to_v (its
# output projection is the block's proj_out, shared with the MLP). diffusers' FLUX LoRA scripts
# train these attention projections too.
FLUX_LORA_TARGETS: tuple[str, ...] = SD3_LORA_TARGETS


@dataclass(frozen=True)
class LoraSettings:
    """Low-rank adapters on the denoiser (the only trainable weights when set)."""

    rank: int = 32
    """LoRA rank r (Flow-GRPO: 32 for SD3.5)."""
    alpha: float = 64.0
    """Scaling numerator: the update is ``alpha / rank * B @ A``."""
    init: LoRAInit = "gaussian"
    """Initialisation of A (B starts at zero either way, so training starts at the base model)."""
    target_modules: tuple[str, ...] | None = None
    """Module name suffixes to adapt; ``None`` uses the family's attention projections."""
    dropout: float = 0.0
    """LoRA dropout (0 keeps the policy deterministic given its input, needed for ratio = 1)."""

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"lora.rank must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha must be > 0, got {self.alpha}")
        check_choice("lora.init", self.init, LoRAInit)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")


def attach_lora(
    model: nn.Module, settings: LoraSettings, default_targets: tuple[str, ...], exclude: tuple[str, ...] = ()
) -> None:
    """Add a peft LoRA adapter to a diffusers model; only its weights require grad, in float32."""
    from peft import LoraConfig

    targets = list(settings.target_modules or default_targets)
    names = [name for name, _ in model.named_modules()]
    unmatched = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if unmatched:
        raise ValueError(
            f"lora.target_modules {unmatched} match no module of {type(model).__name__}; "
            f"use suffixes of its module names (defaults: {list(default_targets)})"
        )
    config = LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        init_lora_weights="gaussian" if settings.init == "gaussian" else True,
        target_modules=targets,
        lora_dropout=settings.dropout,
        exclude_modules=list(exclude) or None,
    )
    model.add_adapter(config)  # diffusers' PeftAdapterMixin; freezes the base weights
    for p in model.parameters():
        if p.requires_grad:  # the LoRA weights: float32 masters, bf16 updates of lr*grad vanish
            p.data = p.data.float()


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's weights in peft's key format, which every diffusers LoRA loader reads."""
    from peft.utils import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def lora_metadata(model: nn.Module) -> dict:
    """Rank / alpha / targets of the adapter, stored beside the weights so loading keeps alpha."""
    config = model.peft_config["default"].to_dict()
    config["target_modules"] = sorted(config["target_modules"])
    if config.pop("exclude_modules", None):
        # a loader builds its adapter from these targets: name exactly the adapted layers, so that it
        # adds none where the file has no weights (the excluded ones; peft warns of either mismatch)
        config["target_modules"] = sorted(name for name, m in model.named_modules() if hasattr(m, "lora_A"))
    return config


def unused_submodules(model: nn.Module, prefixes: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The names of ``model``'s modules that are, or sit inside, one of ``prefixes`` (what an
    adapter's ``unused_modules`` names): the LoRA targets to exclude."""
    if not prefixes:
        return ()
    return tuple(n for n, _ in model.named_modules() if any(n == p or n.startswith(p + ".") for p in prefixes))
