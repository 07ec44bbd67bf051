"""HPSv2 / HPSv2.1 (Wu et al., "Human Preference Score v2: A Solid Benchmark for Evaluating Human
Preferences of Text-to-Image Synthesis", 2023): OpenCLIP ViT-H-14 fine-tuned on HPDv2."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_treegrpo.rewards.base import (
    CLIP_MEAN,
    CLIP_STD,
    BatchSize,
    RewardLoadError,
    load_tokenizer,
    normalize,
    resize_longer_side_and_pad,
    resolve_file,
)
from lit_treegrpo.rewards.clip_common import ClipReward, offline_clip_tokenizer

HPS_CHECKPOINTS = {
    "v2.0": "xswu/HPSv2/HPS_v2_compressed.pt",
    "v2.1": "xswu/HPSv2/HPS_v2.1_compressed.pt",
}
HPS_TOKENIZER = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"  # the same BPE as open_clip's tokenizer


@dataclass(frozen=True)
class OpenClipArch:
    """Shape of an OpenCLIP ViT ``CLIP`` (non-custom text tower, GELU, learnable positions,
    class-token pooling, argmax/EOT text pooling). Defaults: ViT-H-14."""

    embed_dim: int = 1024
    image_size: int = 224
    patch_size: int = 14
    vision_width: int = 1280
    vision_layers: int = 32
    vision_head_width: int = 80
    text_width: int = 1024
    text_heads: int = 16
    text_layers: int = 24
    context_length: int = 77
    vocab_size: int = 49408
    mlp_ratio: float = 4.0
    bos_token_id: int = 49406
    eos_token_id: int = 49407  # the highest id: open_clip pools at argmax(ids) == first EOT

    def clip_config(self):
        """The transformers ``CLIPConfig`` of the same network."""
        from transformers import CLIPConfig

        text = dict(
            vocab_size=self.vocab_size,
            hidden_size=self.text_width,
            intermediate_size=int(self.text_width * self.mlp_ratio),
            num_hidden_layers=self.text_layers,
            num_attention_heads=self.text_heads,
            max_position_embeddings=self.context_length,
            hidden_act="gelu",  # ViT-H-14 uses exact GELU (no QuickGELU)
            layer_norm_eps=1e-5,
            projection_dim=self.embed_dim,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.eos_token_id,
        )
        vision = dict(
            hidden_size=self.vision_width,
            intermediate_size=int(self.vision_width * self.mlp_ratio),
            num_hidden_layers=self.vision_layers,
            num_attention_heads=self.vision_width // self.vision_head_width,
            image_size=self.image_size,
            patch_size=self.patch_size,
            hidden_act="gelu",
            layer_norm_eps=1e-5,
            projection_dim=self.embed_dim,
        )
        return CLIPConfig(text_config=text, vision_config=vision, projection_dim=self.embed_dim)


VIT_H_14 = OpenClipArch()
#: the tiny shape of :meth:`HPSv2.tiny` and the parity test (the offline 514-token tokenizer)
TINY_ARCH = OpenClipArch(
    embed_dim=16,
    image_size=32,
    patch_size=8,
    vision_width=32,
    vision_layers=2,
    vision_head_width=8,
    text_width=32,
    text_heads=4,
    text_layers=2,
    vocab_size=514,
    bos_token_id=512,
    eos_token_id=513,
)


def _blocks(sd: dict[str, Tensor], src: str, dst: str, layers: int) -> dict[str, Tensor]:
    """Map OpenCLIP residual blocks ``{src}.{i}`` onto transformers encoder layers ``{dst}.{i}``:
    ``nn.MultiheadAttention``'s packed ``in_proj`` [3W, W] splits into q, k, v (in that order)."""
    out: dict[str, Tensor] = {}
    for i in range(layers):
        s, d = f"{src}.{i}", f"{dst}.{i}"
        q, k, v = sd[f"{s}.attn.in_proj_weight"].chunk(3, dim=0)  # 3 x [W, W]
        qb, kb, vb = sd[f"{s}.attn.in_proj_bias"].chunk(3, dim=0)  # 3 x [W]
        out.update(
            {
                f"{d}.self_attn.q_proj.weight": q,
                f"{d}.self_attn.q_proj.bias": qb,
                f"{d}.self_attn.k_proj.weight": k,
                f"{d}.self_attn.k_proj.bias": kb,
                f"{d}.self_attn.v_proj.weight": v,
                f"{d}.self_attn.v_proj.bias": vb,
                f"{d}.self_attn.out_proj.weight": sd[f"{s}.attn.out_proj.weight"],
                f"{d}.self_attn.out_proj.bias": sd[f"{s}.attn.out_proj.bias"],
                f"{d}.layer_norm1.weight": sd[f"{s}.ln_1.weight"],
                f"{d}.layer_norm1.bias": sd[f"{s}.ln_1.bias"],
                f"{d}.mlp.fc1.weight": sd[f"{s}.mlp.c_fc.weight"],
                f"{d}.mlp.fc1.bias": sd[f"{s}.mlp.c_fc.bias"],
                f"{d}.mlp.fc2.weight": sd[f"{s}.mlp.c_proj.weight"],
                f"{d}.mlp.fc2.bias": sd[f"{s}.mlp.c_proj.bias"],
                f"{d}.layer_norm2.weight": sd[f"{s}.ln_2.weight"],
                f"{d}.layer_norm2.bias": sd[f"{s}.ln_2.bias"],
            }
        )
    return out


def open_clip_to_transformers(state_dict: dict[str, Tensor], arch: OpenClipArch) -> dict[str, Tensor]:
    """An OpenCLIP ``CLIP`` state dict as the state dict of transformers' ``CLIPModel``."""
    sd = {k.removeprefix("module."): v for k, v in state_dict.items()}
    sd.pop("attn_mask", None)  # a non-persistent causal mask in newer open_clip, saved by old ones
    known = {
        "visual.class_embedding",
        "visual.positional_embedding",
        "visual.conv1.weight",
        "visual.ln_pre.weight",
        "visual.ln_pre.bias",
        "visual.ln_post.weight",
        "visual.ln_post.bias",
        "visual.proj",
        "token_embedding.weight",
        "positional_embedding",
        "ln_final.weight",
        "ln_final.bias",
        "text_projection",
        "logit_scale",
    }
    block = (f"visual.transformer.resblocks.{i}." for i in range(arch.vision_layers))
    text_block = (f"transformer.resblocks.{i}." for i in range(arch.text_layers))
    prefixes = tuple(block) + tuple(text_block)
    unknown = sorted(k for k in sd if k not in known and not k.startswith(prefixes))
    if unknown:
        raise ValueError(
            f"OpenCLIP checkpoint has {len(unknown)} keys this mapping does not know "
            f"(e.g. {unknown[:4]}); it expects a ViT CLIP of shape {arch}"
        )
    out = {
        "vision_model.embeddings.class_embedding": sd["visual.class_embedding"],
        "vision_model.embeddings.patch_embedding.weight": sd["visual.conv1.weight"],
        "vision_model.embeddings.position_embedding.weight": sd["visual.positional_embedding"],
        "vision_model.pre_layrnorm.weight": sd["visual.ln_pre.weight"],  # (sic) transformers' name
        "vision_model.pre_layrnorm.bias": sd["visual.ln_pre.bias"],
        "vision_model.post_layernorm.weight": sd["visual.ln_post.weight"],
        "vision_model.post_layernorm.bias": sd["visual.ln_post.bias"],
        "visual_projection.weight": sd["visual.proj"].t(),  # [D, Wv]
        "text_model.embeddings.token_embedding.weight": sd["token_embedding.weight"],
        "text_model.embeddings.position_embedding.weight": sd["positional_embedding"],
        "text_model.final_layer_norm.weight": sd["ln_final.weight"],
        "text_model.final_layer_norm.bias": sd["ln_final.bias"],
        "text_projection.weight": sd["text_projection"].t(),  # [D, Wt]
        "logit_scale": sd["logit_scale"],
    }
    out.update(_blocks(sd, "visual.transformer.resblocks", "vision_model.encoder.layers", arch.vision_layers))
    out.update(_blocks(sd, "transformer.resblocks", "text_model.encoder.layers", arch.text_layers))
    return {k: v.contiguous() for k, v in out.items()}


def build_clip_from_open_clip(state_dict: dict[str, Tensor], arch: OpenClipArch):
    """A transformers ``CLIPModel`` holding the weights of an OpenCLIP state dict."""
    from transformers import CLIPModel

    mapped = open_clip_to_transformers(state_dict, arch)
    with torch.device("meta"):
        model = CLIPModel(arch.clip_config())
    expected = model.state_dict()
    missing = sorted(set(expected) - set(mapped))
    wrong = [
        f"{k} {list(v.shape)} vs {list(expected[k].shape)}"
        for k, v in mapped.items()
        if k in expected and v.shape != expected[k].shape
    ]
    if missing or wrong:
        raise ValueError(
            f"OpenCLIP checkpoint does not fit {arch}: missing {missing[:4]}, checkpoint vs model shapes {wrong[:3]}"
        )
    model.load_state_dict(mapped, strict=True, assign=True)
    for module in model.modules():
        buf = module._buffers.get("position_ids")
        if buf is not None and buf.is_meta:
            module.register_buffer("position_ids", torch.arange(buf.shape[-1]).expand(1, -1), persistent=False)
    still_meta = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if still_meta:
        raise RuntimeError(f"tensors left uninitialised after loading the OpenCLIP weights: {still_meta[:4]}")
    return model.eval()


def load_open_clip_checkpoint(path: str | Path) -> dict[str, Tensor]:
    """The state dict of an OpenCLIP / HPS checkpoint file (``{"state_dict": ...}`` or bare)."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict):
        raise RewardLoadError(f"HPS checkpoint '{path}' holds a {type(ckpt).__name__}, not a state dict")
    return ckpt.get("state_dict", ckpt)


def random_open_clip_state_dict(arch: OpenClipArch, seed: int = 0) -> dict[str, Tensor]:
    """Seeded random weights in OpenCLIP's layout and shapes, for tests of the loading path
    (LayerNorms near 1, the rest N(0, 0.02), logit_scale log(1/0.07))."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> Tensor:
        return 0.02 * torch.randn(*shape, generator=g)

    def ln(prefix: str, width: int) -> dict[str, Tensor]:
        return {f"{prefix}.weight": 1 + rnd(width), f"{prefix}.bias": rnd(width)}

    def blocks(prefix: str, width: int, layers: int) -> dict[str, Tensor]:
        hidden, out = int(width * arch.mlp_ratio), {}
        for i in range(layers):
            p = f"{prefix}.{i}"
            out.update(
                {
                    f"{p}.attn.in_proj_weight": rnd(3 * width, width),
                    f"{p}.attn.in_proj_bias": rnd(3 * width),
                    f"{p}.attn.out_proj.weight": rnd(width, width),
                    f"{p}.attn.out_proj.bias": rnd(width),
                    f"{p}.mlp.c_fc.weight": rnd(hidden, width),
                    f"{p}.mlp.c_fc.bias": rnd(hidden),
                    f"{p}.mlp.c_proj.weight": rnd(width, hidden),
                    f"{p}.mlp.c_proj.bias": rnd(width),
                    **ln(f"{p}.ln_1", width),
                    **ln(f"{p}.ln_2", width),
                }
            )
        return out

    wv, wt, grid = arch.vision_width, arch.text_width, arch.image_size // arch.patch_size
    return {
        "visual.class_embedding": rnd(wv),
        "visual.positional_embedding": rnd(grid * grid + 1, wv),
        "visual.conv1.weight": rnd(wv, 3, arch.patch_size, arch.patch_size),
        **ln("visual.ln_pre", wv),
        **ln("visual.ln_post", wv),
        "visual.proj": rnd(wv, arch.embed_dim),
        **blocks("visual.transformer.resblocks", wv, arch.vision_layers),
        "token_embedding.weight": rnd(arch.vocab_size, wt),
        "positional_embedding": rnd(arch.context_length, wt),
        **blocks("transformer.resblocks", wt, arch.text_layers),
        **ln("ln_final", wt),
        "text_projection": rnd(wt, arch.embed_dim),
        "logit_scale": torch.tensor(1 / 0.07).log(),
    }


class HPSv2(ClipReward):
    """HPSv2 / HPSv2.1 on a transformers ``CLIPModel``; see the module docstring."""

    name = "hps"

    def __init__(self, model, tokenizer, max_batch: BatchSize | None = None) -> None:
        super().__init__(model, tokenizer, max_batch=max_batch)
        self.freeze()

    @classmethod
    def from_pretrained(
        cls,
        checkpoint: str | Path = "v2.1",
        tokenizer: str | Path = HPS_TOKENIZER,
        arch: OpenClipArch = VIT_H_14,
        dtype: torch.dtype = torch.float32,
        max_batch: BatchSize | None = None,
    ) -> HPSv2:
        """``checkpoint``: ``"v2.0"``, ``"v2.1"`` (fetched from the hub repo xswu/HPSv2), a local
        file, or ``owner/repo/filename``; ``tokenizer``: a CLIP tokenizer folder or hub id."""
        spec = HPS_CHECKPOINTS.get(str(checkpoint), str(checkpoint))
        path = resolve_file(spec, f"HPS checkpoint ({checkpoint})")
        model = build_clip_from_open_clip(load_open_clip_checkpoint(path), arch).to(dtype)
        return cls(model, load_tokenizer(tokenizer, "HPS tokenizer"), max_batch=max_batch)

    @classmethod
    def tiny(cls, folder: str | Path, seed: int = 0, max_batch: BatchSize | None = None) -> HPSv2:
        """Random OpenCLIP weights of :data:`TINY_ARCH` saved as an HPS-style checkpoint in
        ``folder`` with the offline tokenizer, loaded through :meth:`from_pretrained`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        torch.save({"state_dict": random_open_clip_state_dict(TINY_ARCH, seed)}, folder / "hps_tiny.pt")
        offline_clip_tokenizer(folder)
        return cls.from_pretrained(folder / "hps_tiny.pt", folder, arch=TINY_ARCH, max_batch=max_batch)

    def pixels(self, images: Tensor) -> Tensor:
        """HPSv2's validation transform in torch: [B, 3, H, W] in [0, 1] -> [B, 3, S, S]."""
        square = resize_longer_side_and_pad(images.float(), self.image_size)  # [B, 3, S, S]
        return normalize(square, CLIP_MEAN, CLIP_STD)

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        from lit_treegrpo.rewards.clip_common import image_embeds

        pixels = self.pixels(images).to(self.param_dtype())  # [B, 3, S, S]
        img = F.normalize(image_embeds(self.model, pixels).float(), dim=-1)  # [B, D]
        txt = self.embed_prompts(prompts, images.device)  # [B, D] unit norm
        return (img * txt).sum(dim=-1)  # [B] cosine similarity
