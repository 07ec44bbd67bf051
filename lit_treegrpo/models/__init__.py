"""Model-family adapters over diffusers behind one interface, :class:`DiffusionAdapter`.

- :class:`SD15Adapter`: SD 1.x / 2.x UNet + DDIM (DDPO's policy).
- :class:`SD3Adapter`: SD3 / SD3.5 transformer + rectified-flow SDE (Flow-GRPO's policy).
- :class:`WanAdapter`: Wan2.1 text-to-video transformer + rectified-flow SDE on video latents.
- :class:`FluxAdapter`: FLUX.1-dev / -schnell transformer + rectified-flow SDE (BranchGRPO's, DanceGRPO's policy).
- :class:`QwenImageAdapter`: Qwen-Image MMDiT + rectified-flow SDE, true CFG with masked text of any length.
- :mod:`.tiny`: seeded tiny variants built from configs (no downloads) for tests and smoke runs.
- :mod:`.published`: the real targets' published architectures as config dicts (meta-device counts, real-width checks).
- :mod:`.lora`: peft LoRA attach / export in the diffusers format.
- :mod:`.shapes`: :class:`~lit_treegrpo.models.shapes.ShapesAdapter`, the shipped Shapes model.

May import: :mod:`lit_treegrpo.core`, :mod:`lit_treegrpo.common` (hub look-ups), the Shapes world,
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
