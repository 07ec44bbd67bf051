"""ImageReward (Xu et al., "ImageReward: Learning and Evaluating Human Preferences for
Text-to-Image Generation", NeurIPS 2023), through the authors' package ``image-reward``.

The model is BLIP: a ViT-L/16 image encoder, a BERT text encoder that cross-attends to the image
tokens, and an MLP on the text [CLS] feature; the score is ``(mlp(f) - 0.1672) / 1.0333``
(the package's ``ImageReward.score``). The package scores one PIL image per model call
(``score`` / ``inference_rank`` loop over images); here the whole batch goes through the ViT, the
BERT and the MLP in one call each, with the same preprocessing done in torch: shorter side to 224
(bicubic), centre crop 224, OpenAI CLIP mean/std; prompts tokenized with the package's BERT
tokenizer, padded to 35 tokens.

The package pins old libraries, so it is an extra: ``pip install 'lit-treegrpo[image-reward]'``
(docs/rewards.md says which torch/torchvision it needs).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from lit_treegrpo.rewards.base import BatchSize, RewardLoadError, RewardModel, clip_pixels, load_or_explain

EXTRA_HINT = "pip install 'lit-treegrpo[image-reward]'"
#: the torch the README installs stays; the extra needs the torchvision of that torch's release
TORCHVISION_HINT = (
    "torchvision: install the torchvision of your torch first (on a GPU box the CUDA torch and its "
    "torchvision, from PyTorch's index; the README's CPU torch==2.13.0 has no torchvision that imports "
    "beside it, so on a CPU: pip install torch==2.14.1 torchvision==0.29.1)"
)
TEXT_LENGTH = 35  # the package tokenizes prompts to max_length=35
IMAGE_SIZE = 224


def import_image_reward():
    """The ``ImageReward`` package, or an ``ImportError`` naming the extra that provides it."""
    try:
        import ImageReward as RM
    except ImportError as err:
        raise ImportError(
            f"the ImageReward reward needs the package 'image-reward' and its pinned dependencies, with "
            f"{TORCHVISION_HINT}, then {EXTRA_HINT} (docs/rewards.md); import failed with: {err}"
        ) from err
    return RM


class ImageReward(RewardModel):
    """Batched scoring with a model of the package ``image-reward``; see the module docstring.

    Args:
        model: an ``ImageReward.ImageReward`` instance (e.g. from ``ImageReward.load``).
        max_batch: images per model call (``None``: all at once).
    """

    name = "image_reward"

    def __init__(self, model, max_batch: BatchSize | None = None) -> None:
        super().__init__(max_batch=max_batch)
        self.model = model
        self.freeze()

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path = "ImageReward-v1.0",
        med_config: str | Path | None = None,
        download_root: str | Path | None = None,
        max_batch: BatchSize | None = None,
    ) -> ImageReward:
        """``ImageReward.load``: a name of ``ImageReward.available_models()`` (fetched from the hub
        into ``download_root``) or a local state-dict file; ``med_config`` is the BERT config
        json (default: fetched from the hub). The BERT tokenizer comes from 'bert-base-uncased'.
        Everything missing offline gives a one-line :class:`RewardLoadError`."""
        RM = import_image_reward()
        name = str(name_or_path)
        if name not in RM.available_models() and not Path(name).is_file():
            raise RewardLoadError(
                f"cannot load ImageReward: '{name}' is neither a file nor one of {RM.available_models()}"
            )
        if med_config is not None and not Path(med_config).is_file():
            raise RewardLoadError(f"cannot load ImageReward: med_config '{med_config}' is not a file")
        model = load_or_explain(
            "ImageReward (checkpoint, med_config.json or the 'bert-base-uncased' tokenizer)",
            name,
            lambda: RM.load(
                name,
                device="cpu",
                download_root=None if download_root is None else str(download_root),
                med_config=None if med_config is None else str(med_config),
            ),
        )
        tok = model.blip.tokenizer
        if len(tok) <= len(set(tok.all_special_ids)):
            raise RewardLoadError("cannot load ImageReward: the 'bert-base-uncased' tokenizer has no vocabulary")
        return cls(model, max_batch=max_batch)

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        blip, device = self.model.blip, images.device
        pixels = clip_pixels(images, IMAGE_SIZE).to(self.param_dtype())  # [B, 3, 224, 224]
        text = blip.tokenizer(
            prompts,
            padding="max_length",
            truncation=True,
            max_length=TEXT_LENGTH,
            return_tensors="pt",
        )
        image_tokens = blip.visual_encoder(pixels)  # [B, 1 + 196, 1024]
        image_mask = torch.ones(image_tokens.shape[:-1], dtype=torch.long, device=device)  # [B, N]
        out = blip.text_encoder(
            text.input_ids.to(device),  # [B, 35]
            attention_mask=text.attention_mask.to(device),  # [B, 35]
            encoder_hidden_states=image_tokens,
            encoder_attention_mask=image_mask,
            return_dict=True,
        )
        feature = out.last_hidden_state[:, 0, :].float()  # [B, 768] the [CLS] token
        raw = self.model.mlp(feature.to(self.param_dtype())).float().squeeze(-1)  # [B]
        return (raw - self.model.mean) / self.model.std  # [B] the package's standardisation
