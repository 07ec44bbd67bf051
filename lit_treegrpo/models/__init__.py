"""Model-family adapters over diffusers behind one interface, :class:`DiffusionAdapter`.

May import: :mod:`lit_treegrpo.core`, :mod:`lit_treegrpo.common` (hub look-ups),
torch, diffusers, transformers and peft; never the rewards or the Lightning layer.
"""

from .base import DiffusionAdapter
from .flux import FluxAdapter
from .lora import LoraSettings
from .qwen_image import QwenImageAdapter
from .sd3 import SD3Adapter
from .sd15 import SD15Adapter
from .wan import WanAdapter

__all__ = [
    "DiffusionAdapter",
    "FluxAdapter",
    "LoraSettings",
    "QwenImageAdapter",
    "SD15Adapter",
    "SD3Adapter",
    "WanAdapter",
]
