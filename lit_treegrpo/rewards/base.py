"""The reward interface: :class:`RewardModel`, :class:`MultiReward`, and torch-only preprocessing."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_treegrpo.common.errors import first_line
from lit_treegrpo.common.hub import local_or_hub_id, require_hub, starts_like_path
from lit_treegrpo.common.reads import regular_file
from lit_treegrpo.common.values import Range
from lit_treegrpo.core.advantages import combine_rewards
from lit_treegrpo.core.choices import check_choice, choices
from lit_treegrpo.rewards.scores import (  # the checks of what a reward returns; re-exported here
    _SHOW,
    DEFAULT_NAME,
    RewardScores,
    check_finite,
    check_reward_scores,
    check_scores,
    checking_output,
    label,
)

# OpenAI CLIP's pixel statistics, used by CLIP, OpenCLIP ViT-H-14 (HPSv2, PickScore) and BLIP.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

Aggregate = Literal["normalize_then_weight", "weighted_sum"]
AGGREGATES: tuple[str, ...] = choices(Aggregate)

T = TypeVar("T")

#: images (videos) per scoring call, as every reward loader declares its ``max_batch`` (``None``:
#: the whole batch at once); the CLI checks ``--model.reward_kwargs`` against such declarations
BatchSize = Annotated[int, Range(low=1)]


#: why a mapping of reward weights that are all 0 is refused
ZERO_WEIGHTS = (
    "every reward weight is 0, so every advantage would be 0 and nothing would train; give one a non-zero weight"
)


class RewardLoadError(OSError):
    """Weights, a tokenizer or a checkpoint could not be found or loaded (one-line message)."""


# --------------------------------------------------------------------------------------------
# torch-only preprocessing (no PIL round trip)
# --------------------------------------------------------------------------------------------


def resize(images: Tensor, size: tuple[int, int]) -> Tensor:
    """Bicubic resize of ``images`` [B, C, H, W] to ``size`` (h, w), antialiased, clamped to [0, 1]."""
    if tuple(images.shape[-2:]) == tuple(size):
        return images
    out = F.interpolate(images.float(), size=size, mode="bicubic", antialias=True)  # [B,C,h,w]
    return out.clamp_(0.0, 1.0)  # bicubic overshoots; PIL saturates at the uint8 range


def resize_shorter_side(images: Tensor, size: int) -> Tensor:
    """Scale ``images`` [B, C, H, W] so that the shorter side is ``size``, as torchvision's
    ``Resize(int)``: the longer side becomes ``int(size * long / short)``."""
    h, w = images.shape[-2:]
    if h <= w:
        return resize(images, (size, int(size * w / h)))
    return resize(images, (int(size * h / w), size))


def center_crop(images: Tensor, size: int) -> Tensor:
    """Central ``size`` x ``size`` crop of ``images`` [B, C, H, W] (torchvision's offsets)."""
    h, w = images.shape[-2:]
    if h < size or w < size:
        raise ValueError(f"center_crop: image {h}x{w} is smaller than the crop {size}x{size}")
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return images[..., top : top + size, left : left + size]  # [B, C, size, size]


def resize_longer_side_and_pad(images: Tensor, size: int, fill: float = 0.0) -> Tensor:
    """Scale so that the longer side is ``size``, then pad to a centred square with ``fill``."""
    h, w = images.shape[-2:]
    scale = size / max(h, w)
    nh, nw = round(h * scale), round(w * scale)
    out = resize(images, (nh, nw))  # [B, C, nh, nw]
    ph, pw = size - nh, size - nw
    if ph or pw:
        out = F.pad(out, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2), value=fill)
    return out  # [B, C, size, size]


def normalize(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """``(images - mean) / std`` per channel; ``images`` [B, C, H, W]."""
    m = torch.tensor(mean, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    return (images - m) / s  # [B, C, H, W]


def clip_pixels(images: Tensor, size: int) -> Tensor:
    """CLIP's validation transform in torch: shorter side to ``size`` (bicubic), centre crop, OpenAI mean/std."""
    return normalize(center_crop(resize_shorter_side(images.float(), size), size), CLIP_MEAN, CLIP_STD)


# --------------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------------


def check_inputs(images: Tensor, prompts: Sequence[str], name: str) -> None:
    """Validate ``images`` [B, 3, H, W] float in [0, 1] and ``prompts`` (B strings)."""
    if not isinstance(images, Tensor):
        raise TypeError(f"reward '{name}': images must be a torch.Tensor [B, 3, H, W], got {type(images).__name__}")
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"reward '{name}': images must have shape [B, 3, H, W], got {list(images.shape)}")
    if images.shape[0] == 0:
        raise ValueError(f"reward '{name}': got an empty batch of images")
    if not images.is_floating_point():
        raise ValueError(
            f"reward '{name}': images must be floating point in [0, 1], got {images.dtype}; "
            "convert uint8 images with images.float() / 255"
        )
    if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
        raise TypeError(f"reward '{name}': prompts must be a list of strings, one per image")
    if len(prompts) != images.shape[0]:
        raise ValueError(
            f"reward '{name}': got {images.shape[0]} images but {len(prompts)} prompts; "
            "pass one prompt per image (repeat a prompt for each of its leaves)"
        )
    images = images.detach()
    finite = torch.isfinite(images).flatten(1).all(dim=1)  # [B]
    if not bool(finite.all()):
        bad = (~finite).nonzero().squeeze(1).tolist()
        raise ValueError(f"reward '{name}': images {bad[:_SHOW]} contain NaN or inf")
    lo, hi = float(images.min()), float(images.max())
    if lo < 0.0 or hi > 1.0:
        raise ValueError(
            f"reward '{name}': images must lie in [0, 1], got values in [{lo:.4g}, {hi:.4g}]; "
            "decode to [0, 1] first (e.g. (x / 2 + 0.5).clamp(0, 1))"
        )


def load_or_explain(what: str, name_or_path: str | Path, load: Callable[[], T], repo_id: str | None = None) -> T:
    """Run ``load()``; turn the loaders' ``OSError`` (not found locally nor in the Hugging Face cache, e.g. offline)
    into a one-line :class:`RewardLoadError` naming ``what`` and the path."""
    try:
        hub_id = repo_id or local_or_hub_id(name_or_path)  # the one path-or-hub rule (common.hub)
    except FileNotFoundError as err:
        raise RewardLoadError(f"cannot load {what}: {err}") from err
    try:
        if hub_id is not None:
            require_hub(hub_id)
        return load()
    except OSError as err:
        where = "the local path exists but" if hub_id is None else "not a local path, and the hub copy"
        raise RewardLoadError(
            f"cannot load {what} from '{name_or_path}': {where} could not be read ({first_line(err)}); "
            "fetch it once with network access (it is then cached) or pass a local path"
        ) from err


def resolve_file(spec: str | Path, what: str) -> Path:
    """A local file, or ``owner/repo/filename`` fetched through the Hugging Face cache; a FIFO, device, socket or
    folder at ``spec`` is refused by its status, never opened (:func:`~lit_treegrpo.common.reads.regular_file`)."""
    path = Path(spec)
    fix = "pass a local file or 'owner/repo/filename' on the Hugging Face hub"
    if regular_file(path, "a file", fix, option=f"cannot load {what}", error=RewardLoadError):
        return path
    parts = str(spec).split("/")
    if path.exists() or len(parts) < 3 or starts_like_path(spec):  # a hub file is org/name/file...
        raise RewardLoadError(
            f"cannot load {what}: '{spec}' is not a file; pass a local file or "
            "'owner/repo/filename' on the Hugging Face hub"
        )
    from huggingface_hub import hf_hub_download

    repo, filename = "/".join(parts[:2]), "/".join(parts[2:])
    return Path(load_or_explain(what, spec, lambda: hf_hub_download(repo, filename), repo_id=repo))


def load_tokenizer(name_or_path: str | Path, what: str):
    """``AutoTokenizer.from_pretrained`` that refuses a silently empty tokenizer: offline, or from a
    folder without vocabulary files, transformers can build one holding only special tokens."""
    from transformers import AutoTokenizer

    tok = load_or_explain(what, name_or_path, lambda: AutoTokenizer.from_pretrained(str(name_or_path)))
    if len(tok) <= len(set(tok.all_special_ids)):
        raise RewardLoadError(
            f"cannot load {what} from '{name_or_path}': the tokenizer has no vocabulary "
            f"({len(tok)} tokens, all special); its vocabulary files are missing"
        )
    return tok


# --------------------------------------------------------------------------------------------
# the interface
# --------------------------------------------------------------------------------------------


class RewardModel(nn.Module):
    """A frozen scorer of images against prompts, run in eval mode without gradients.

    Args:
        max_batch: images per :meth:`score_batch` call (``None``: the whole batch at once); bounds
            memory for large trees without changing the scores.
    """

    name: str = DEFAULT_NAME
    #: whether the score depends on the prompt (documentation and tests)
    uses_prompt: bool = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("score")
        if own is not None and not getattr(own, "checks_output", False):
            # a reward of its own making may return anything: checked at every call, the first included
            cls.score = checking_output(own)  # type: ignore[method-assign]

    def __init__(self, max_batch: BatchSize | None = None) -> None:
        super().__init__()
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"reward '{self.name}': max_batch must be >= 1 or None, got {max_batch}")
        self.max_batch = max_batch

    def freeze(self) -> None:
        """Eval mode and ``requires_grad=False`` on every parameter."""
        for p in self.parameters():
            p.requires_grad_(False)
        super().train(False)

    def train(self, mode: bool = True) -> RewardModel:
        """Rewards stay in eval mode (dropout off) whatever the parent module does."""
        return super().train(False)

    def check(self, images: Tensor, prompts: Sequence[str]) -> None:
        """Validate a batch before scoring (images [B, 3, H, W]; video rewards check videos)."""
        check_inputs(images, prompts, self.name)

    def score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        """Scores [B] of validated ``images`` [B, 3, H, W] in [0, 1]; called under ``no_grad``."""
        raise NotImplementedError(f"{type(self).__name__} must implement score_batch")

    def raw_scores(self, images: Tensor, prompts: Sequence[str]) -> Tensor:
        """``score_batch`` in chunks of ``max_batch``, each chunk's output checked (:func:`check_scores`),
        without the input and finiteness checks: float32 [B]."""
        prompts = list(prompts)
        step = self.max_batch or images.shape[0]
        with torch.no_grad():
            chunks = [
                check_scores(
                    self.score_batch(images[i : i + step], prompts[i : i + step]),
                    len(prompts[i : i + step]),
                    label(self),
                )
                for i in range(0, images.shape[0], step)
            ]
        return torch.cat(chunks)  # [B]

    def forward(self, images: Tensor, prompts: Sequence[str]) -> Tensor:
        """Scores [B] float32 of ``images`` [B, 3, H, W] in [0, 1] against ``prompts`` (B strings)."""
        self.check(images, prompts)
        scores = self.raw_scores(images, prompts)  # [B]
        check_finite(scores, self.name, prompts)
        return scores

    def score(self, images: Tensor, prompts: Sequence[str], *, check: bool = True) -> RewardScores:
        """The score [B] and its named components (none for a single reward; see MultiReward)."""
        if check:
            return check_reward_scores(RewardScores(self(images, prompts), {}), len(prompts), label(self))
        self.check(images, prompts)
        return RewardScores(self.raw_scores(images, prompts), {})

    def param_dtype(self) -> torch.dtype:
        """dtype of the first floating parameter (float32 for parameter-free rewards)."""
        for p in self.parameters():
            if p.is_floating_point():
                return p.dtype
        return torch.float32

    def extra_repr(self) -> str:
        return f"name={self.name!r}, max_batch={self.max_batch}"


def unique_prompts(prompts: Sequence[str]) -> tuple[list[str], Tensor]:
    """Distinct prompts (in order of first appearance) and the [B] long index of each prompt among them."""
    ids: dict[str, int] = {}
    index = [ids.setdefault(p, len(ids)) for p in prompts]
    return list(ids), torch.tensor(index, dtype=torch.long)


class MultiReward(RewardModel):
    """Several rewards combined into one score per image.

    Args:
        rewards: name -> reward model; the names label the components in logs and errors.
        weights: name -> weight, one for every reward (``None``: all 1).
        aggregate: ``"normalize_then_weight"`` or ``"weighted_sum"``.
        eps: added to the per-group std.
    """

    name = "multi"

    def __init__(
        self,
        rewards: Mapping[str, RewardModel],
        weights: Mapping[str, float] | None = None,
        aggregate: Aggregate = "normalize_then_weight",
        eps: float = 1e-8,
    ) -> None:
        super().__init__()
        if not rewards:
            raise ValueError("MultiReward: rewards is empty; give at least one name -> reward")
        check_choice("MultiReward: aggregate", aggregate, Aggregate)
        for key, reward in rewards.items():
            if not isinstance(reward, RewardModel):
                raise TypeError(f"MultiReward: reward '{key}' must be a RewardModel, got {type(reward).__name__}")
        weights = {k: 1.0 for k in rewards} if weights is None else dict(weights)
        missing, unknown = set(rewards) - set(weights), set(weights) - set(rewards)
        if missing or unknown:
            raise ValueError(
                f"MultiReward: weights must name exactly the rewards {sorted(rewards)}; "
                f"missing {sorted(missing)}, unknown {sorted(unknown)}"
            )
        bad = [k for k, w in weights.items() if not math.isfinite(float(w))]
        if bad:
            raise ValueError(f"MultiReward: weights of {bad} are not finite")
        if all(float(w) == 0 for w in weights.values()):
            raise ValueError(f"MultiReward: {ZERO_WEIGHTS}")
        self.rewards = nn.ModuleDict(dict(rewards))
        self.weights = {k: float(weights[k]) for k in rewards}
        self.aggregate = aggregate
        self.eps = eps
        self.uses_prompt = any(r.uses_prompt for r in rewards.values())
        self.freeze()

    def score(self, images: Tensor, prompts: Sequence[str], *, check: bool = True) -> RewardScores:
        """Aggregate [B] and the raw component scores [B] of every reward."""
        self.check(images, prompts)
        components: dict[str, Tensor] = {}
        for key, reward in self.rewards.items():
            s = reward.raw_scores(images, prompts)  # [B]; the inputs were validated once, above
            if check:
                check_finite(s, f"{self.name}/{key}", prompts)
            components[key] = s
        cols = torch.stack(list(components.values()), dim=1)  # [B, K]
        w = torch.tensor(list(self.weights.values()), dtype=cols.dtype, device=cols.device)  # [K]
        if self.aggregate == "normalize_then_weight":
            total = combine_rewards(cols, unique_prompts(prompts)[1].to(cols.device), w, self.eps)  # [B]
        else:
            total = cols @ w  # [B]
        if check:
            check_finite(total, self.name, prompts)
        return RewardScores(total, components)

    def raw_scores(self, images: Tensor, prompts: Sequence[str]) -> Tensor:
        """The aggregate [B] without the finiteness checks, like ``RewardModel.raw_scores``."""
        return self.score(images, prompts, check=False).total

    def forward(self, images: Tensor, prompts: Sequence[str]) -> Tensor:
        """The aggregate [B]; use :meth:`score` for the components too."""
        return self.score(images, prompts).total

    def extra_repr(self) -> str:
        return f"aggregate={self.aggregate!r}, weights={self.weights}"
