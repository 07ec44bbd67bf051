"""The one interface every model family offers the engine: :class:`DiffusionAdapter`.

An adapter wraps a diffusers pipeline's components as an ``nn.Module`` (so Lightning moves, shards
and checkpoints it) and exposes exactly what :func:`lit_treegrpo.core.rollout.rollout` and the
training loop need: encode prompts once, draw root noise, predict with classifier-free guidance in
one batched forward, take a (stochastic or deterministic) step with its log-prob, decode.

The denoiser is the only module that trains (through LoRA or fully); text encoders and the VAE
are frozen and run under ``no_grad``.
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from ..common.hub import local_or_hub_id, require_hub
from ..core.loss import check_kl_reference
from ..core.steps import StepOutput
from .lora import LoraSettings, attach_lora, lora_metadata, lora_state_dict, unused_submodules
from .precision import LOW, fsdp_policy, to_master_weights, warn_low_precision_weights, weights_dtype
from .text import TruncationWarner

Cond = dict[str, Tensor]  # tensors with the prompt dimension first
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; the option is a string so YAML can set it."""
    if name not in DTYPES:
        raise ValueError(f"torch_dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def load_component(cls: Any, path_or_id: str, subfolder: str | None, **kwargs: Any) -> Any:
    """``cls.from_pretrained`` with a one-line error that names what is missing, offline included.

    A hub id is looked up in the local cache first; only if it is not there is the hub asked, and
    only once a probe has found the hub reachable, so that no network fails in seconds, not minutes."""
    where = path_or_id + (f" (subfolder {subfolder!r})" if subfolder else "")
    try:
        hub_id = local_or_hub_id(path_or_id)  # the one path-or-hub rule (common.hub)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"cannot load {cls.__name__} from {where}: no such file or folder") from err
    try:
        if hub_id is not None:
            require_hub(hub_id)  # not cached and no network: fail now, not after minutes of retries
        return cls.from_pretrained(path_or_id, subfolder=subfolder, **kwargs)
    except (OSError, ValueError) as err:  # diffusers / transformers raise these for missing files
        if hub_id is None:
            hint = "the local path lacks this component (was it saved with save_pretrained?)"
        else:
            hint = (
                "not in the local hub cache and the hub cannot be reached (HF_HUB_OFFLINE=1 or "
                "no network); download it once with network access, or pass a local folder"
            )
        raise FileNotFoundError(f"cannot load {cls.__name__} from {where}: {hint}") from err


class PipelineIndex:
    """A pipeline folder's ``model_index.json`` (which pipeline, which components and switches),
    read through :func:`load_component` for its one-line errors, local folder or hub cache alike."""

    @staticmethod
    def from_pretrained(path: str, subfolder: str | None = None, **kwargs: Any) -> dict[str, Any]:
        from diffusers import DiffusionPipeline

        return DiffusionPipeline.load_config(path, **kwargs)


def load_pipeline_index(path: str, expected: str, hint: str, **kwargs: Any) -> dict[str, Any]:
    """``path``'s ``model_index.json``; a folder of another pipeline than ``expected`` is refused in
    one line naming it, followed by ``hint`` (what to pass instead)."""
    index = load_component(PipelineIndex, path, None, **kwargs)
    kind = index.get("_class_name")
    if kind != expected:
        raise ValueError(f"pretrained: {path} holds a {kind}, not a {expected}; {hint}")
    return index


def cast_components(components: dict[str, Any], torch_dtype: str, keep_float32: Sequence[str] = ()) -> None:
    """Cast the modules of a pipeline handed in built (its ``components``) to ``torch_dtype``, as
    loading them from a folder with that dtype would (those named in ``keep_float32``: float32), so
    that the option means the same for every way an adapter gets its model."""
    dtype = parse_dtype(torch_dtype)
    for name, component in components.items():
        target = torch.float32 if name in keep_float32 else dtype
        if isinstance(component, nn.Module) and any(p.dtype != target for p in component.parameters()):
            component.to(target)  # only then: diffusers' models warn about any dtype cast


Pipeline = TypeVar("Pipeline")


def pipeline_from(
    pretrained: str | Path | object,
    pipeline_class: type[Pipeline],
    torch_dtype: str,
    load: Callable[[str], Pipeline],
    keep_float32: Sequence[str] = (),
) -> Pipeline:
    """An adapter's pipeline, whichever way it is given: ``load(path)`` for a local folder or hub id,
    or ``pretrained`` itself when it is a built ``pipeline_class``, cast as :func:`cast_components`
    says (so ``torch_dtype`` means the same both ways)."""
    if isinstance(pretrained, (str, Path)):
        return load(str(pretrained))
    if isinstance(pretrained, pipeline_class):
        cast_components(pretrained.components, torch_dtype, keep_float32)  # type: ignore[attr-defined]
        return pretrained
    raise TypeError(f"pretrained must be a path, hub id or {pipeline_class.__name__}, got {type(pretrained)}")


class ScheduleTables:
    """A schedule's per-step tables (float32 or long, on the host as the scheduler made them),
    copied to a device on first use there and kept: the denoising loop indexes them on the device
    of its latents, so no step copies a table from the host (a pageable host-to-device copy waits
    for the device's queue)."""

    def __init__(self, **tables: Tensor) -> None:
        self.host = tables
        self._on: dict[torch.device, dict[str, Tensor]] = {}

    def on(self, device: torch.device | str) -> dict[str, Tensor]:
        """The tables on ``device``."""
        key = torch.device(device)
        if key not in self._on:
            self._on[key] = {name: table.to(key) for name, table in self.host.items()}
        return self._on[key]


class DiffusionAdapter(nn.Module, ABC):
    """A text-to-image denoiser seen as a policy over latents.

    Subclasses register the trainable denoiser as ``self.denoiser`` and implement the family's
    text encoding, model call and step. Shared here: guidance, dtype and LoRA handling.

    Args:
        num_steps: denoising steps T of a trajectory.
        guidance_scale: classifier-free guidance weight; <= 1 disables CFG (one forward).
        negative_prompt: unconditional prompt of CFG.
        lora: LoRA settings, or ``None`` to fine-tune the whole denoiser.
        gradient_checkpointing: recompute activations in the backward pass to save memory.
        decode_batch_size: images per VAE decode call.
        compile: ``torch.compile`` the denoiser in place (``nn.Module.compile``: parameter names,
            LoRA saving and checkpoints are unchanged), once its LoRA is attached.
        master_weights: full fine-tuning (``lora`` None) of a bfloat16 / float16 denoiser keeps its
            weights in float32 and computes in the low dtype under autocast (FSDP2: a mixed-precision
            policy over float32 shards); False trains the low-precision weights themselves, where an
            AdamW step of lr 1e-5 rounds away most updates (warned).
    """

    #: the one module that trains (LoRA or fully); the memory probe and the export read it too
    denoiser: nn.Module
    #: the diffusers pipeline the components came from (not a module: it keeps ``encode_prompt`` and
    #: ``save_lora_weights`` at hand; the export reads its hub id); None: a family without one (Shapes)
    pipeline: Any = None
    #: the denoiser's keyword of ``save_lora_weights`` and its subfolder in a merged export: diffusers'
    #: ``"unet"`` / ``"transformer"``
    lora_layers_arg: str = "transformer"
    #: the local folder the weights were loaded from, which an export names as its base model; None:
    #: a hub id (the pipeline names it) or a model built in memory
    source: str | None = None
    #: for a model built in code (the tiny ones): the import and the call that build a plain pipeline
    #: of the base model, without this adapter's LoRA (what an export's card loads into); None: the
    #: base is loaded by ``from_pretrained`` of :attr:`source` or the hub id
    base_pipeline_code: tuple[str, str] | None = None
    #: :meth:`decode` gives videos [B, F, 3, H, W], not images: the module then needs a video reward
    makes_video: bool = False
    #: the denoiser's block lists that :meth:`shard` shards one block at a time (diffusers' names:
    #: SD3Transformer2DModel's ``transformer_blocks``, UNet2DConditionModel's down / up blocks)
    shard_blocks: tuple[str, ...] = ("transformer_blocks", "down_blocks", "up_blocks")

    def __init__(
        self,
        *,
        num_steps: int,
        guidance_scale: float,
        negative_prompt: str,
        lora: LoraSettings | None,
        gradient_checkpointing: bool,
        decode_batch_size: int,
        compile: bool = False,
        master_weights: bool = True,
    ) -> None:
        super().__init__()
        if decode_batch_size < 1:
            raise ValueError(f"decode_batch_size must be >= 1, got {decode_batch_size}")
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        if guidance_scale < 0:
            raise ValueError(f"guidance_scale must be >= 0, got {guidance_scale}")
        self.num_steps = num_steps
        self.guidance_scale = guidance_scale
        self.negative_prompt = negative_prompt
        self.lora: LoraSettings | None = lora
        """LoRA settings; None: the whole denoiser trains (no KL reference, a larger optimizer state)."""
        self.gradient_checkpointing = gradient_checkpointing
        """Activations are recomputed in the backward pass (the memory guard counts them so)."""
        self.decode_batch_size = decode_batch_size
        self.compile_denoiser = compile
        """The denoiser runs compiled (``torch.compile``; the sharding refuses it with FSDP2)."""
        self.truncation = TruncationWarner()  # prompts over a text encoder's limit: warned once
        self.master_weights = master_weights
        self._compute_dtype: torch.dtype | None = None  # set when float32 master weights compute in a lower dtype

    # ------------------------------------------------------------------------ set-up helpers
    def denoisers(self) -> dict[str, nn.Module]:
        """Every denoising model by its pipeline component name: ``{lora_layers_arg: denoiser}``, or
        Wan2.2 A14B's two experts (``transformer``, ``transformer_2``)."""
        return {self.lora_layers_arg: self.denoiser}

    def trained_denoisers(self) -> dict[str, nn.Module]:
        """The denoisers that train (through LoRA or fully): all of them unless the family lets
        some stay frozen (Wan2.2 A14B's ``train_experts``)."""
        return self.denoisers()

    def unused_modules(self, model: nn.Module) -> tuple[str, ...]:
        """Modules of a denoiser whose output never reaches its prediction (SD3's and Qwen-Image's last
        block drops the text stream): they get no LoRA and, fully fine-tuned, stay frozen, since
        their gradient is zero forever. None by default."""
        return ()

    def _setup_training(self, default_lora_targets: tuple[str, ...]) -> None:
        """Freeze everything, then make the trained denoisers (or their LoRA) trainable, except the
        :meth:`unused_modules`; full fine-tuning in bf16 / fp16 gets float32 master weights."""
        self.requires_grad_(False)
        low = self.denoiser.dtype if self.denoiser.dtype in LOW else None
        for model in self.trained_denoisers().values():
            unused = unused_submodules(model, self.unused_modules(model))
            if self.lora is not None:
                attach_lora(model, self.lora, default_lora_targets, unused)
                continue
            for name, p in model.named_parameters():
                p.requires_grad_(name.rpartition(".")[0] not in unused)
            if low is not None and self.master_weights:
                to_master_weights(model)
                self._compute_dtype = low
        if low is not None and self.lora is None and not self.master_weights:
            warn_low_precision_weights(low)
        for model in self.denoisers().values():
            if self.gradient_checkpointing:
                model.enable_gradient_checkpointing()
            if self.compile_denoiser:
                model.compile()
        self.train(False)

    def compute_context(self) -> contextlib.AbstractContextManager:
        """Where the denoiser runs: autocast to the compute dtype over float32 master weights, else
        nothing (the weights' own dtype)."""
        if self._compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self._compute_dtype)

    def train(self, mode: bool = True) -> DiffusionAdapter:
        """Always evaluation mode: dropout in the policy would make the log-prob recomputed for
        training differ from the one recorded at sampling (ratio != 1 before any update), and
        frozen encoders must never drop out. Gradient checkpointing does not depend on the mode."""
        return super().train(False)

    @property
    def cfg_scale(self) -> float:
        """The weight of classifier-free guidance (``guidance_scale`` here). A family whose
        ``guidance_scale`` is something else (FLUX.1-dev: an input of the distilled model) overrides
        this, so that it does not run a second, unconditional forward it does not need."""
        return self.guidance_scale

    @property
    def do_cfg(self) -> bool:
        """Whether :meth:`predict` batches [uncond; cond] (two forwards' worth) for CFG."""
        return self.cfg_scale > 1.0

    @property
    def device(self) -> torch.device:
        return next(self.denoiser.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the latents and of the denoiser's computation: its weights' (LoRA weights may be
        float32), or the compute dtype over float32 master weights."""
        return self._compute_dtype or weights_dtype(self.denoiser)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters the optimizer should see (LoRA only, or the whole denoiser)."""
        return [p for p in self.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """Run the frozen base model (LoRA disabled): the KL reference of Flow-GRPO."""
        check_kl_reference(kl_beta=math.inf, has_lora=self.lora is not None)  # a reference is asked for: kl_beta > 0
        models = list(self.trained_denoisers().values())
        for model in models:
            model.disable_adapters()
        try:
            yield
        finally:
            for model in models:
                model.enable_adapters()

    def shard(self, mesh: Any) -> None:
        """FSDP2 over the data-parallel ``mesh``: shard each block of :attr:`shard_blocks`, then
        the denoiser (each of :meth:`denoisers`). Frozen encoders and the VAE stay replicated."""
        from torch.distributed.fsdp import fully_shard

        if self.compile_denoiser:
            raise ValueError(
                "--model.adapter.init_args.compile true does not go with FSDP2 here (its hooks run around "
                "the compiled module); use compile false with ModelParallelStrategy"
            )

        policy = fsdp_policy(self._compute_dtype)  # float32 masters: gathered in the compute dtype
        for model in self.denoisers().values():
            for blocks in self.shard_blocks:
                for block in getattr(model, blocks, []):
                    fully_shard(block, mesh=mesh, **policy)
            fully_shard(model, mesh=mesh, **policy)

    def _guided(self, x: Tensor, t: Tensor, cond: Cond, *, scale: float | None = None, **denoise: Any) -> Tensor:
        """One batched forward of [uncond; cond] (CFG) or cond alone, combined as the pipelines do.
        ``scale``: the CFG weight (``None``: :attr:`cfg_scale`); ``denoise``: passed on to
        :meth:`_denoise` (Wan2.2 A14B's ``expert``)."""
        if not self.do_cfg:
            with self.compute_context():
                return self._denoise(x, t, cond, negative=False, **denoise)
        with self.compute_context():
            both = self._denoise(torch.cat([x, x]), torch.cat([t, t]), cond, negative=True, **denoise)  # [2B, *S]
        uncond, text = both.chunk(2)  # [B, *S] each
        return self._combine_guidance(uncond, text, self.cfg_scale if scale is None else scale)

    def _combine_guidance(self, uncond: Tensor, text: Tensor, scale: float) -> Tensor:
        """Classifier-free guidance's ``uncond + scale (text - uncond)``; a family whose pipeline
        does more (Qwen-Image's norm rescale) overrides this."""
        return uncond + scale * (text - uncond)

    def _step_indices(self, step_index: int | Tensor, batch: int, device: torch.device | str) -> Tensor:
        """A [B] long tensor of step indices on ``device``.

        The rollout passes a Python int (every node is at the same step): checked on the host. A
        [B] tensor (training micro-batches) is checked on the device (``torch._assert_async``):
        an index out of range still fails, and no step waits for the device to answer.
        """
        if isinstance(step_index, int):
            if not 0 <= step_index < self.num_steps:
                raise ValueError(f"step_index must be in 0..{self.num_steps - 1}, got {step_index}")
            return torch.full((batch,), step_index, dtype=torch.long, device=device)
        idx = torch.as_tensor(step_index).to(device=device, dtype=torch.long)
        if idx.ndim == 0:
            idx = idx.expand(batch)
        if idx.shape != (batch,):
            raise ValueError(f"step_index must have shape ({batch},), got {tuple(idx.shape)}")
        torch._assert_async(
            ((idx >= 0) & (idx < self.num_steps)).all(), f"step_index must be in 0..{self.num_steps - 1}"
        )
        return idx

    def encoding_key(self) -> tuple[Any, ...]:
        """What besides a prompt decides its conditioning (the prompt cache's key: a change of any
        empties it): the class, the text encoders, the negative prompt and whether CFG uses it,
        and the token limit where the family has one."""
        encoders = tuple((name, id(m)) for name, m in self.named_children() if name.startswith("text_encoder"))
        return (type(self).__name__, encoders, self.negative_prompt, self.do_cfg, vars(self).get("max_sequence_length"))

    def join_conds(self, parts: Sequence[Cond]) -> Cond:
        """The rows of several :meth:`encode_prompts` results as one conditioning (the prompt cache
        joins cached rows so). Families that encode to a fixed length concatenate; one whose length
        follows the prompts (Qwen-Image) pads to the longest first."""
        return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}

    # ------------------------------------------------------------------------ the contract
    @abstractmethod
    def encode_prompts(self, prompts: list[str]) -> Cond:
        """Frozen text encoding of P prompts -> tensors with P rows (negative prompt included)."""

    @abstractmethod
    def _denoise(self, x: Tensor, t: Tensor, cond: Cond, *, negative: bool) -> Tensor:
        """Raw model output for latents ``x`` at model timesteps ``t``; with ``negative`` the batch
        is [uncond; cond] and ``cond`` rows are used twice."""

    @abstractmethod
    def timesteps(self, step_index: Tensor) -> Tensor:
        """Model timestep values of [B] step indices."""

    @abstractmethod
    def initial_noise(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """Root latents [n, C, h, w] in the latent dtype, on the model's device."""

    @abstractmethod
    def step(
        self,
        model_output: Tensor,
        x: Tensor,
        step_index: int | Tensor,
        *,
        stochastic: bool,
        noise: Tensor | None = None,
        prev_sample: Tensor | None = None,
    ) -> StepOutput:
        """One transition from step ``step_index`` (SDE if ``stochastic``, else deterministic)."""

    @abstractmethod
    def decode(self, latents: Tensor) -> Tensor:
        """Latents -> images [B, 3, H, W] in [0, 1], float32, no grad."""

    def _draw_noise(self, shape: tuple[int, ...], generator: torch.Generator | None) -> Tensor:
        """Standard normal latents drawn on the generator's device (reproducible across devices)."""
        device = generator.device if generator is not None else self.device
        noise = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
        return noise.to(self.device, self.dtype)

    @torch.no_grad()
    def _decode_with(self, vae: nn.Module, latents: Tensor) -> Tensor:
        """VAE decode of scaled latents in chunks (decoder activations dominate memory)."""
        images = []
        for chunk in latents.split(self.decode_batch_size):
            out = vae.decode(chunk.to(vae.dtype), return_dict=False)[0]  # [b, 3, H, W] in [-1, 1]
            images.append((out.float() / 2 + 0.5).clamp(0, 1))
        return torch.cat(images)

    def predict(self, x: Tensor, step_index: int | Tensor, cond: Cond) -> Tensor:
        """Guided model output for latents ``x`` [B, *S] at ``step_index`` (int or [B])."""
        idx = self._step_indices(step_index, x.shape[0], self.device)  # [B]
        return self._guided(x, self.timesteps(idx), cond)

    def lora_load_code(self) -> str:
        """The line that loads :meth:`save_lora`'s folder ``DIR`` into a plain pipeline ``pipe``."""
        return "pipe.load_lora_weights(DIR)"

    def save_lora(self, folder: str | Path) -> Path:
        """Write the trained LoRA so that the family's diffusers pipeline's ``load_lora_weights``
        reads it (weights plus rank / alpha metadata)."""
        if self.lora is None:
            raise ValueError("save_lora needs LoRA training; save the full denoiser with save_pretrained")
        self.pipeline.save_lora_weights(
            str(folder),
            **{
                f"{self.lora_layers_arg}_lora_layers": lora_state_dict(self.denoiser),
                f"{self.lora_layers_arg}_lora_adapter_metadata": lora_metadata(self.denoiser),
            },
        )
        return Path(folder)
