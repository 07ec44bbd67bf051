"""The Shapes model: a small text-to-image flow model of our own, trainable and RL-able on a CPU."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..core.steps import SDEDynamics
from ..models.base import Cond, cast_components, load_component, parse_dtype
from ..models.flow import FlowMatchingAdapter
from ..models.lora import SD3_LORA_TARGETS, LoraSettings
from ..models.sd3 import sd3_transformer_forward
from ..models.text import check_tokenizer
from . import world

BUILTIN = "builtin"  # ``pretrained`` value that names the shipped weights
SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")
METADATA_FILE = "shapes_world.json"


def vocabulary() -> list[str]:
    """Tokens of the Shapes-world tokenizer: the specials, then every word of the grammar."""
    words = ["a", "an", *world.SIZE_WORDS, *world.COLOURS, *world.SHAPES]
    for phrase in world.POSITIONS:
        words += [w for w in phrase.split() if w not in words]
    return [*SPECIAL_TOKENS, *words]


@dataclass(frozen=True)
class ShapesModelConfig:
    """Sizes of a freshly built Shapes model (pre-training); a loaded one keeps its saved sizes."""

    image_size: int = 16
    """Side of the RGB images in pixels."""
    patch_size: int = 2
    """Pixels per transformer patch side (16 / 2 -> 64 image tokens)."""
    num_layers: int = 4
    """Joint-attention transformer blocks."""
    num_attention_heads: int = 4
    """Attention heads of the denoiser."""
    attention_head_dim: int = 16
    """Width per head; the denoiser's width is heads x head_dim."""
    text_layers: int = 2
    """Transformer layers of the text encoder."""
    text_width: int = 64
    """Width of the text encoder (and of its pooled projection)."""
    max_tokens: int = 16
    """Text positions (the grammar's longest prompt is 9 tokens with <bos> and <eos>)."""
    shift: float = 1.0
    """Sigma shift of the flow-matching schedule (1: uniform sigmas)."""

    def __post_init__(self) -> None:
        for name in (
            "image_size",
            "patch_size",
            "num_layers",
            "num_attention_heads",
            "attention_head_dim",
            "text_layers",
            "text_width",
            "max_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.image_size % self.patch_size:
            raise ValueError(f"model.image_size={self.image_size} must be a multiple of patch_size={self.patch_size}")
        if self.shift <= 0:
            raise ValueError(f"model.shift must be > 0, got {self.shift}")


def shapes_tokenizer(max_tokens: int = 16):
    """A ``PreTrainedTokenizerFast`` over :func:`vocabulary`: lower-cased whitespace words,
    ``<bos> ... <eos>``, unknown words as ``<unk>``, padded to ``max_tokens``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(vocabulary())}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", vocab["<bos>"]), ("<eos>", vocab["<eos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=max_tokens,
    )


def build_components(config: ShapesModelConfig, seed: int = 0) -> dict[str, Any]:
    """Freshly initialised (seeded) transformer, text encoder, tokenizer and scheduler."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    tokenizer = shapes_tokenizer(config.max_tokens)
    width = config.num_attention_heads * config.attention_head_dim
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        sample_size=config.image_size,
        patch_size=config.patch_size,
        in_channels=3,
        out_channels=3,
        num_layers=config.num_layers,
        attention_head_dim=config.attention_head_dim,
        num_attention_heads=config.num_attention_heads,
        joint_attention_dim=config.text_width,
        caption_projection_dim=width,
        pooled_projection_dim=config.text_width,
        pos_embed_max_size=config.image_size // config.patch_size,
    )
    torch.manual_seed(seed + 1)
    text_encoder = CLIPTextModelWithProjection(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=config.text_width,
            intermediate_size=2 * config.text_width,
            num_hidden_layers=config.text_layers,
            num_attention_heads=4,
            max_position_embeddings=config.max_tokens,
            projection_dim=config.text_width,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,  # pooled at the <eos> position
            pad_token_id=tokenizer.pad_token_id,
            attention_dropout=0.0,
            dropout=0.0,
        )
    )
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=config.shift)
    return {"transformer": transformer, "text_encoder": text_encoder, "tokenizer": tokenizer, "scheduler": scheduler}


def save_components(folder: str | Path, components: dict[str, Any], metadata: dict[str, Any]) -> Path:
    """Write a Shapes model folder (safetensors weights, configs, tokenizer, ``shapes_world.json``)."""
    folder = Path(folder)
    for name in ("transformer", "text_encoder", "tokenizer", "scheduler"):
        components[name].save_pretrained(folder / name)
    (folder / METADATA_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True, default=str) + "\n")
    return folder


def builtin_folder() -> Path:
    """The shipped weights (``lit_treegrpo/shapes/weights``)."""
    return Path(str(resources.files("lit_treegrpo.shapes").joinpath("weights")))


def resolve(pretrained: str | Path) -> Path:
    """``"builtin"`` -> the shipped folder; otherwise the given local folder, which must exist."""
    folder = builtin_folder() if str(pretrained) == BUILTIN else Path(pretrained).expanduser()
    if not (folder / "transformer").is_dir():
        what = "the shipped Shapes weights" if str(pretrained) == BUILTIN else f"'{pretrained}'"
        raise FileNotFoundError(
            f"{what}: no Shapes model folder at {folder} (it needs transformer/, text_encoder/, "
            f"tokenizer/, scheduler/); regenerate it with python -m lit_treegrpo.shapes.pretrain fit "
            f"--config configs/shapes_pretrain.yaml"
        )
    return folder


def load_components(pretrained: str | Path, torch_dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """The four components of a Shapes model folder, through their ``from_pretrained``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection, PreTrainedTokenizerFast

    folder = resolve(pretrained)
    path = str(folder)
    for sub, files in (
        ("transformer", ("config.json",)),
        ("text_encoder", ("config.json",)),
        ("tokenizer", ("tokenizer.json",)),
        ("scheduler", ("scheduler_config.json",)),
    ):
        missing = [f for f in files if not (folder / sub / f).is_file()]
        if missing:
            raise FileNotFoundError(f"cannot load the Shapes model from {path}: {sub}/{missing[0]} is missing")
    tokenizer = load_component(PreTrainedTokenizerFast, path, "tokenizer")
    check_tokenizer(tokenizer, f"{path}/tokenizer")
    models = {}
    for name, cls in (("transformer", SD3Transformer2DModel), ("text_encoder", CLIPTextModelWithProjection)):
        with _no_loading_bar():  # a progress bar for 3 MB read in milliseconds is noise
            model, info = load_component(cls, path, name, torch_dtype=torch_dtype, output_loading_info=True)
        bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        if bad:
            kind, keys = next(iter(bad.items()))
            raise ValueError(
                f"cannot load the Shapes model from {path}: {name} has {len(keys)} {kind.replace('_', ' ')}, "
                f"e.g. {sorted(map(str, keys))[:2]}; the folder's weights do not match its config"
            )
        models[name] = model
    return {
        **models,
        "tokenizer": tokenizer,
        "scheduler": load_component(FlowMatchEulerDiscreteScheduler, path, "scheduler"),
    }


@contextlib.contextmanager
def _no_loading_bar() -> Iterator[None]:
    """transformers' weight-loading progress bar off for the block, as it was afterwards."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def encode_text(text_encoder: nn.Module, tokenizer: Any, prompts: list[str]) -> Cond:
    """``prompt_embeds`` [P, L, D] (last hidden states) and ``pooled_prompt_embeds`` [P, D]."""
    device = next(text_encoder.parameters()).device
    ids = tokenizer(
        prompts, padding="max_length", max_length=tokenizer.model_max_length, truncation=True, return_tensors="pt"
    ).input_ids.to(device)  # [P, L]
    out = text_encoder(ids, return_dict=True)
    return {"prompt_embeds": out.last_hidden_state, "pooled_prompt_embeds": out.text_embeds}


class ShapesAdapter(FlowMatchingAdapter):
    """The Shapes model as a tree-rollout policy (rectified flow on 16x16 RGB pixels).

    Args:
        pretrained: ``"builtin"`` (the shipped weights), a local Shapes model folder, or the
            components of :func:`build_components` / :func:`load_components` (used as they are).
        num_steps: denoising steps (10, as the papers' SD3.5 setting).
        guidance_scale: CFG weight; <= 1 disables CFG (one forward per step).
        noise_level: ``a`` of the Flow-GRPO SDE (0.7) or ``eta`` of the DanceGRPO SDE (0.3).
        dynamics: ``flow_sde``, ``dance_sde`` or ``cps`` for the stochastic steps.
        negative_prompt: unconditional prompt of CFG (pre-training drops captions to "").
        lora: LoRA settings on the attention projections (rank 16 by default); ``None`` fine-tunes the whole
            transformer.
        torch_dtype: weights dtype, ``float32``, ``bfloat16`` or ``float16``.
        gradient_checkpointing: trade compute for activation memory in the backward pass.
        decode_batch_size: unused (pixels need no decoder); kept for the adapter interface.
        compile: ``torch.compile`` the denoiser in place (names, LoRA and checkpoints unchanged); not with FSDP2.
    """

    lora_layers_arg = "transformer"

    def __init__(
        self,
        pretrained: str | Path | dict[str, Any] = BUILTIN,
        *,
        num_steps: int = 10,
        guidance_scale: float = 1.0,
        noise_level: float = 0.7,
        dynamics: SDEDynamics = "flow_sde",
        negative_prompt: str = "",
        lora: LoraSettings | None = LoraSettings(rank=16, alpha=16.0),
        torch_dtype: str = "float32",
        gradient_checkpointing: bool = False,
        decode_batch_size: int = 256,
        compile: bool = False,
    ) -> None:
        super().__init__(
            num_steps=num_steps,
            guidance_scale=guidance_scale,
            negative_prompt=negative_prompt,
            lora=lora,
            gradient_checkpointing=gradient_checkpointing,
            decode_batch_size=decode_batch_size,
            compile=compile,
        )
        self._init_flow(noise_level, dynamics)
        if isinstance(pretrained, dict):
            parts, self.source = pretrained, None
            cast_components(parts, torch_dtype)
        else:
            parts, self.source = load_components(pretrained, parse_dtype(torch_dtype)), str(resolve(pretrained))
        self.denoiser = parts["transformer"]
        self.text_encoder = parts["text_encoder"]
        self.tokenizer = parts["tokenizer"]
        self.scheduler = parts["scheduler"]
        self.pipeline = None  # no diffusers pipeline: save_lora writes the transformer's adapter itself
        self.image_size = self.denoiser.config.sample_size
        self._unknown_warned = False
        self._set_schedule(self.scheduler)
        self._setup_training(SD3_LORA_TARGETS)

    # ------------------------------------------------------------------------ contract
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        self._warn_unknown_words(prompts)
        self.truncation(self.tokenizer, prompts, self.tokenizer.model_max_length, "Shapes")
        cond = encode_text(self.text_encoder, self.tokenizer, prompts)
        if self.do_cfg:
            negative = encode_text(self.text_encoder, self.tokenizer, [self.negative_prompt])
            cond["negative_prompt_embeds"] = negative["prompt_embeds"].expand(len(prompts), -1, -1)
            cond["negative_pooled_prompt_embeds"] = negative["pooled_prompt_embeds"].expand(len(prompts), -1)
        return cond

    def _warn_unknown_words(self, prompts: list[str]) -> None:
        if self._unknown_warned:
            return
        from lightning.pytorch.utilities import rank_zero_warn

        known = self.tokenizer.get_vocab()
        split = self.tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str  # the tokenizer's own words
        unknown = sorted({w for p in prompts for w, _ in split(p.lower()) if w not in known})
        if unknown:
            self._unknown_warned = True
            rank_zero_warn(
                f"ShapesAdapter: words outside the Shapes-world vocabulary are encoded as <unk>: "
                f"{unknown[:8]}; the model only knows 'a [small|large] <colour> <shape> [<position>]'"
            )

    def _denoise(self, x: Tensor, t: Tensor, cond: Cond, *, negative: bool) -> Tensor:
        return sd3_transformer_forward(self.denoiser, x, t, cond, negative=negative, dtype=self.dtype)

    def initial_noise(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        return self._draw_noise((n, 3, self.image_size, self.image_size), generator)

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        return (latents.float() / 2 + 0.5).clamp(0, 1)  # the model works on pixels in [-1, 1]

    # ------------------------------------------------------------------------ export
    def save_lora(self, folder: str | Path) -> Path:
        """Write the trained LoRA of the transformer (diffusers' ``save_lora_adapter``: peft keys, rank / alpha
        metadata in ``pytorch_lora_weights.safetensors``), which ``SD3Transformer2DModel.load_lora_adapter(folder,
        prefix=None, weight_name=...)`` reads back."""
        if self.lora is None:
            raise ValueError(
                "save_lora needs LoRA training; this adapter fine-tunes the whole model: use save_pretrained"
            )
        self.denoiser.save_lora_adapter(str(folder))
        return Path(folder)

    def save_pretrained(self, folder: str | Path, **metadata: Any) -> Path:
        """Write the current weights as a Shapes model folder (LoRA merged in, if any), so that
        ``ShapesAdapter(pretrained=folder)`` starts from them."""
        import copy

        transformer = self.denoiser
        if self.lora is not None:
            transformer = copy.deepcopy(self.denoiser)
            transformer.fuse_lora()
            transformer.unload_lora()
        source = Path(self.source) / METADATA_FILE if self.source else None
        base = json.loads(source.read_text()) if source is not None and source.is_file() else {}
        parts = {
            "transformer": transformer,
            "text_encoder": self.text_encoder,
            "tokenizer": self.tokenizer,
            "scheduler": self.scheduler,
        }
        return save_components(folder, parts, {**base, "fine_tuned_from": self.source, **metadata})


def model_config_of(components: dict[str, Any]) -> dict[str, Any]:
    """The :class:`ShapesModelConfig` fields that describe ``components`` (for metadata)."""
    t, e = components["transformer"].config, components["text_encoder"].config
    return asdict(
        ShapesModelConfig(
            image_size=t.sample_size,
            patch_size=t.patch_size,
            num_layers=t.num_layers,
            num_attention_heads=t.num_attention_heads,
            attention_head_dim=t.attention_head_dim,
            text_layers=e.num_hidden_layers,
            text_width=e.hidden_size,
            max_tokens=e.max_position_embeddings,
            shift=components["scheduler"].config.shift,
        )
    )
