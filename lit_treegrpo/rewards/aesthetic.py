"""LAION aesthetic score: a linear or MLP head on the L2-normalised CLIP ViT-L/14 image embedding."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from lit_treegrpo.rewards.base import BatchSize, RewardLoadError, resolve_file
from lit_treegrpo.rewards.clip_common import ClipReward, load_clip, write_tiny_clip

AESTHETIC_CLIP = "openai/clip-vit-large-patch14"


class AestheticMLP(nn.Module):
    """The improved aesthetic predictor's head (no activations; dropout is off in eval)."""

    def __init__(self, dim: int = 768) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(dim, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)  # [B, 1]


def head_from_state_dict(sd: dict[str, Tensor], source: str) -> nn.Module:
    """The head whose layout ``sd`` has: the MLP (``layers.*``) or a single linear layer."""
    if "layers.0.weight" in sd:
        head: nn.Module = AestheticMLP(sd["layers.0.weight"].shape[1])
    elif set(sd) == {"weight", "bias"} and sd["weight"].shape[0] == 1:
        head = nn.Linear(sd["weight"].shape[1], 1)
    else:
        raise RewardLoadError(
            f"aesthetic head '{source}' is neither the LAION MLP (layers.*) nor a linear head "
            f"(weight, bias); keys: {sorted(sd)[:6]}"
        )
    head.load_state_dict(sd)
    return head


class Aesthetic(ClipReward):
    """LAION aesthetic predictor on CLIP image embeddings; see the module docstring.

    Args:
        model: a ``CLIPModel`` (its text tower is unused).
        head: the aesthetic head; its input size must be the CLIP projection size.
    """

    name = "aesthetic"
    uses_prompt = False

    def __init__(self, model, head: nn.Module, max_batch: BatchSize | None = None) -> None:
        super().__init__(model, tokenizer=None, max_batch=max_batch)
        dim = int(model.config.projection_dim)
        first = next(m for m in head.modules() if isinstance(m, nn.Linear))
        if first.in_features != dim:
            raise ValueError(f"aesthetic head takes {first.in_features} features, the CLIP gives {dim}")
        self.head = head.float()
        self.freeze()

    @classmethod
    def from_pretrained(
        cls,
        head: str | Path,
        clip: str | Path = AESTHETIC_CLIP,
        dtype: torch.dtype = torch.float32,
        max_batch: BatchSize | None = None,
    ) -> Aesthetic:
        """``head``: a local ``.pth`` (or ``owner/repo/filename`` on the hub); ``clip``: the CLIP
        ViT-L/14 folder or hub id. One-line error when either is missing."""
        path = resolve_file(head, "aesthetic head")
        sd = torch.load(path, map_location="cpu", weights_only=True)
        return cls(
            load_clip(clip, "aesthetic CLIP", dtype),
            head_from_state_dict(sd, str(head)),
            max_batch=max_batch,
        )

    @classmethod
    def tiny(cls, folder: str | Path, seed: int = 0, max_batch: BatchSize | None = None) -> Aesthetic:
        """A random tiny CLIP and a random MLP head saved in ``folder``, through :meth:`from_pretrained`."""
        folder = Path(folder)
        clip = write_tiny_clip(folder / "clip", seed=seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            head = AestheticMLP(16)  # tiny CLIP projection_dim
        torch.save(head.state_dict(), folder / "aesthetic_head.pth")
        return cls.from_pretrained(folder / "aesthetic_head.pth", clip, max_batch=max_batch)

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        emb = self.embed_images(images)  # [B, D] unit norm, as DDPO and LAION normalise
        return self.head(emb).squeeze(-1)  # [B]
