"""The card an export writes beside the weights (``export.json`` and ``README.md``): what the weights
apply to (:func:`base_model`), how they were trained (:func:`method`, the loss's options under their
option names), and a Python snippet that loads them (:func:`how_to_load`), complete as written: it
names its folder, then loads the export into the family's plain diffusers pipeline, or, for the
Shapes model (pixels, no VAE, no diffusers pipeline), into the project's ``ShapesAdapter``, whose
deterministic sampler draws the images. ``tests/artifacts/test_export_cards.py`` runs every family's
snippet in a fresh process."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..models.base import DiffusionAdapter


#: the module of the project's deterministic Shapes sampler (named, not imported: the run folders'
#: code may not import the Shapes pre-training; the card's test runs the snippet that names it)
SHAPES_SAMPLER = "lit_treegrpo.shapes.pretrain"


def _is_shapes(adapter: Any) -> bool:
    from ..models.shapes import ShapesAdapter

    return isinstance(adapter, ShapesAdapter)


def base_model(adapter: DiffusionAdapter, adapter_config: Mapping[str, Any] | None = None) -> str:
    """What the weights apply to: the adapter's ``pretrained`` setting, its source folder, the
    pipeline's hub id, or the adapter class with its options (a tiny model built from a seed)."""
    args = dict((adapter_config or {}).get("init_args") or {})
    pretrained = args.get("pretrained") or adapter.source
    if pretrained is None and adapter.pipeline is not None:
        pretrained = getattr(adapter.pipeline, "name_or_path", None) or adapter.pipeline.config.get("_name_or_path")
    if pretrained:
        return str(pretrained)
    # a model built from a seed (the tiny test models): the class and its seed say which
    seed = f"seed={args['seed']}" if "seed" in args else ""
    return f"{type(adapter).__name__}({seed})"


def loss_options(loss: Any) -> dict[str, Any]:
    """The clipped policy loss's options under their option names (``clip_range``,
    ``clip_range_high``, ``adv_clip``, ``kl_beta``, ``kl_form``, ``aggregation``); the loss keeps
    the clip range as ``clip_low`` / ``clip_high``."""
    names = {"clip_range": "clip_low", "clip_range_high": "clip_high"}
    options = ("clip_range", "clip_range_high", "adv_clip", "kl_beta", "kl_form", "aggregation")
    found = {k: getattr(loss, names.get(k, k)) for k in options if hasattr(loss, names.get(k, k))}
    if not found and loss is not None:  # a loss of another class: its own name at least
        found["class"] = type(loss).__name__
    return found


def method(module: Any, pruning: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run's algorithm: the module's tree, advantage estimator and loss, and ``pruning`` (its
    ``PruningSchedule`` options; ``None``: every edge trained)."""
    loss = module.loss_fn
    return {
        "tree": {k: v for k, v in asdict(module.tree).items() if v is not None},
        "advantage": asdict(module.advantage),
        "pruning": dict(pruning) if pruning is not None else None,
        "loss": loss_options(loss),
        "reward": type(module.reward).__name__,
    }


def how_to_load(adapter: DiffusionAdapter, lora: bool, base: str, folder: str | Path | None = None) -> str:
    """A Python snippet that loads the export; with ``folder`` (the card's), complete as written: it
    starts by naming ``DIR``. Into the family's plain diffusers pipeline, or, for the Shapes model
    (no diffusers pipeline: pixels, no VAE), into the project's :class:`ShapesAdapter`, whose
    deterministic sampler draws the images."""
    head = f"DIR = {python_str(Path(folder).resolve())}  # this export's folder\n" if folder is not None else ""
    if _is_shapes(adapter):
        return head + _shapes_loading(adapter, lora, base)
    pipeline = type(adapter.pipeline).__name__
    if adapter.base_pipeline_code is not None:
        # a model built in code (a tiny one from a seed): a plain pipeline of it, without the
        # adapter's own LoRA, so that the export loads as the only LoRA
        imports, call = adapter.base_pipeline_code
        load_base = f"{imports}\npipe = {call}"
    else:
        load_base = f"from diffusers import {pipeline}\npipe = {pipeline}.from_pretrained({python_str(base)})"
    if lora:
        return f"{head}{load_base}\n{adapter.lora_load_code()}"
    trained = adapter.trained_denoisers()
    models = sorted({type(m).__name__ for m in trained.values()})
    lines = [f"{head}{load_base}\nfrom diffusers import {', '.join(models)}"]
    for sub, denoiser in trained.items():
        lines.append(f"pipe.{sub} = {type(denoiser).__name__}.from_pretrained(DIR, subfolder={python_str(sub)})")
    return "\n".join(lines)


def _shapes_loading(adapter: Any, lora: bool, base: str) -> str:
    """The Shapes model's snippet: the base :class:`ShapesAdapter` with the run's sampling options
    and the exported LoRA loaded into its transformer (or the merged model folder itself), then
    deterministic samples from the project's sampler."""
    from ..models.shapes import ShapesAdapter

    options = f"num_steps={adapter.num_steps}, guidance_scale={adapter.guidance_scale}, lora=None"
    lines = [
        f"from {ShapesAdapter.__module__} import ShapesAdapter",
        f"from {SHAPES_SAMPLER} import sample",
        "",
    ]
    if lora:
        lines += [
            "# the base model the LoRA was trained on",
            f"adapter = ShapesAdapter(pretrained={python_str(base)}, {options})",
            'adapter.denoiser.load_lora_adapter(DIR, prefix=None, weight_name="pytorch_lora_weights.safetensors")',
        ]
    else:
        lines += ["# a whole Shapes model folder", f"adapter = ShapesAdapter(pretrained=DIR, {options})"]
    side = adapter.image_size
    lines.append(
        f'images = sample(adapter, ["a red circle", "a blue square"], seed=0)  # [2, 3, {side}, {side}] in [0, 1]'
    )
    return "\n".join(lines)


def python_str(value: object) -> str:
    """``value`` as a double-quoted Python string literal (the snippet reads as formatted code)."""
    return json.dumps(str(value))


def card_text(card: Mapping[str, Any]) -> str:
    def reward(value: Any) -> str:
        return "not logged" if value is None else f"{value:.4f}"

    lines = [
        "# lit_treegrpo export",
        "",
        f"- base model: `{card['base_model']}` ({card['adapter']})",
        f"- method: tree `{card['method']['tree']}`, advantage `{card['method']['advantage']['method']}`, "
        f"reward `{card['method']['reward']}`",
        f"- trained: {card['iterations']} training iterations ({card['optimizer_steps']} optimizer steps)",
        f"- reward (training, last logged): {reward(card['reward'])}",
        f"- held-out reward (last validation): {reward(card['held_out_reward'])}",
        f"- weights: {card['weights']}: {', '.join(card['files'])}",
    ]
    if card.get("ema"):
        lines.append(f"- EMA weights in `ema/` ({card['ema']['num_updates']} updates, decay {card['ema']['decay']})")
    lines += [
        "",
        "Load it (the snippet runs as written; change DIR if the folder moves):",
        "",
        "```python",
        card["load"],
        "```",
        "",
    ]
    return "\n".join(lines)
