"""Trained weights out of a run, in the model family's own format, with a small card.

``python -m lit_treegrpo export --config FILE --ckpt_path last|PATH --out DIR [--merged true] [--ema true]``
(or the :class:`~lit_treegrpo.callbacks.ExportOnTrainEnd` callback at the end of a fit) writes::

    DIR/pytorch_lora_weights.safetensors   the LoRA: pipe.load_lora_weights(DIR) reads it (Shapes:
                                           the base ShapesAdapter's denoiser.load_lora_adapter(DIR,
                                           prefix=None, weight_name=...), sampled by the project's
                                           own sampler)
    DIR/transformer/ or DIR/unet/          --merged (or a run without LoRA): the full denoiser,
                                           LoRA merged in (from_pretrained(DIR, subfolder=...));
                                           for the Shapes model a whole model folder that
                                           ShapesAdapter(pretrained=DIR) loads
    DIR/ema/                               --ema: the same, of the EMA weights
    export.json and README.md in DIR       the card (:mod:`.card`): base model, method, iterations,
                                           rewards, and a snippet that loads the export as written

Every file is written readable as a file the user writes (the mode of ``0o666`` less the umask):
safetensors writes its files ``0o600``.

A checkpoint holds the trainable weights only (:meth:`TreeGRPOModule.on_save_checkpoint`); the base
weights come from the configuration, which must be the run's (the fingerprint is checked as for a
resume). The card also records the sha256 of every file the export wrote (``sha256``: relative path
-> hash): that is how a later export knows what it may replace.

The export is built in ``DIR/.export-tmp/new`` (a short name, whatever the length of ``DIR``'s), under
a lock in that folder (``DIR/.export-tmp/lock``: a second export into ``DIR`` while one runs is
refused), and moved into ``DIR`` once complete, so an export that fails leaves no half-written
``DIR``. ``DIR`` must be new or empty; an earlier export there is replaced only with ``--overwrite
true``, and then only the files whose content is the one its card's ``sha256`` records (its card
``export.json`` with them): those are set aside in ``DIR/.export-tmp/old`` while the new export's
files are moved in, then deleted. A file the user added, or one whose hash does not match (an edited
card cannot name a file of the user's: its hash is not recorded), stays, and is named (rule 1 of
docs/failure_modes.md); a new file that would land on one is refused before anything moves. An
export killed while it moved its files in is completed by the next export into ``DIR`` (the moves
to make are written down first, in ``DIR/.export-tmp/swap.json``); one killed before that leaves its
unfinished files in ``DIR/.export-tmp/new``, which the next removes.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..common.files import file_sha256, files_under, remove_written_tree
from .card import base_model, card_text, how_to_load, method
from .export_folder import (
    _NEW,
    _SWAP,
    CARD_FILE,
    CARD_TEXT,
    HASHES,
    MAX_CARD_BYTES,
    STAGING,
    ExportError,
    ExportLock,
    _recover_locked,
    _swap_in,
    check_out,
    earlier_export,
    earlier_hashes,
    stat_is_file,
)
from .run_folder import event_folder

if TYPE_CHECKING:
    from ..models.base import DiffusionAdapter


# ------------------------------------------------------------------------ the checkpoint
def ema_state(checkpoint: Mapping[str, Any]) -> dict[str, Any] | None:
    """The EMA callback's state in a Lightning checkpoint (``None``: the run had no EMA, or it had
    not updated yet)."""
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if str(key).startswith("EMA") and isinstance(state, Mapping) and "shadows" in state:
            return dict(state) if int(state.get("num_updates", 0)) > 0 else None
    return None


def pruning_options(checkpoint: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``PruningSchedule`` callback's options in a Lightning checkpoint (``None``: the run had
    no pruning callback, so every edge trained)."""
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if str(key).startswith("PruningSchedule") and isinstance(state, Mapping) and "options" in state:
            return dict(state["options"])
    return None


def restore(module: Any, checkpoint: Mapping[str, Any]) -> None:
    """Load a TreeGRPOModule checkpoint's trainable weights and iteration into ``module`` (the
    checks of a resume: the same adapter, tree and trainable tensors)."""
    module.on_load_checkpoint(checkpoint)  # fingerprint check; sets the iteration
    state = checkpoint["state_dict"]
    module.load_state_dict(state, strict=False)


@contextlib.contextmanager
def swapped_in(params: list[torch.nn.Parameter], values: list[Tensor]) -> Iterator[None]:
    """The block runs with ``values`` in ``params``; the originals come back afterwards."""
    if len(values) != len(params) or any(v.shape != p.shape for v, p in zip(values, params)):
        raise ExportError(
            "the EMA weights do not match the model's trainable parameters; export with the run's --config"
        )
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, v in zip(params, values):
            p.copy_(v)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)


# ------------------------------------------------------------------------ writing
def _is_shapes(adapter: Any) -> bool:
    from ..models.shapes import ShapesAdapter

    return isinstance(adapter, ShapesAdapter)


def _merged(adapter: DiffusionAdapter, denoiser: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``denoiser`` with its LoRA merged in (the denoiser itself without LoRA)."""
    if adapter.lora is None:
        return denoiser
    denoiser = copy.deepcopy(denoiser)
    denoiser.fuse_lora()
    denoiser.unload_lora()
    return denoiser


class _NoEmptyFloat32Note(logging.Filter):
    """Drops diffusers' note that a model has modules to keep in float32 when it names none
    (``save_lora_adapter`` calls ``.to(dtype=None)``, which makes diffusers print it with ``[]``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "that should be kept in float32: []" not in record.getMessage()


@contextlib.contextmanager
def _no_empty_float32_note() -> Iterator[None]:
    logger = logging.getLogger("diffusers.models.modeling_utils")
    note = _NoEmptyFloat32Note()
    logger.addFilter(note)
    try:
        yield
    finally:
        logger.removeFilter(note)


def readable_like(reference: Path, folder: Path) -> None:
    """Give every file under ``folder`` the permission bits of ``reference`` (a file Python wrote
    with its default mode, so ``0o666`` less the umask): safetensors writes ``0o600``."""
    mode = reference.stat().st_mode & 0o777
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)


def write_weights(adapter: DiffusionAdapter, folder: Path, *, merged: bool) -> list[str]:
    """The adapter's current trainable weights into ``folder`` (see the module docstring); returns
    the files and folders written, relative to ``folder``."""
    with _no_empty_float32_note():
        return _write_weights(adapter, folder, merged=merged)


def _write_weights(adapter: DiffusionAdapter, folder: Path, *, merged: bool) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    if not merged and adapter.lora is not None:
        adapter.save_lora(folder)
        return sorted(p.name for p in folder.iterdir())
    if _is_shapes(adapter):
        adapter.save_pretrained(folder)
        return sorted(p.name for p in folder.iterdir())
    trained = adapter.trained_denoisers()  # {"transformer" / "unet" (diffusers' names): model}; Wan2.2 A14B: two
    for sub, denoiser in trained.items():
        _merged(adapter, denoiser).save_pretrained(str(folder / sub))
    return sorted(trained)


def export(
    module: Any,
    out: str | Path,
    *,
    merged: bool = False,
    ema: Mapping[str, Any] | None = None,
    metrics: Mapping[str, float | None] | None = None,
    optimizer_steps: int = 0,
    adapter_config: Mapping[str, Any] | None = None,
    checkpoint: str | None = None,
    pruning: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    option: str = "--out",
) -> Path:
    """Write ``module``'s trained weights (and ``ema``'s, an EMA state with ``shadows``) to
    ``out`` with the card; returns ``out``. ``metrics`` holds ``reward`` and ``held_out_reward``;
    ``pruning`` the run's ``PruningSchedule`` options (``None``: it pruned nothing); ``overwrite``
    replaces an earlier export there (only what it wrote); ``option`` names ``out`` in messages."""
    out = check_out(out, overwrite=overwrite, option=option)
    lock = ExportLock(out, option)
    try:
        lock.take()
    except OSError as err:
        from ..common.errors import explain_os_error

        raise ExportError(f"{option} {out}: cannot create it: {explain_os_error(err)}") from err
    new = out / STAGING / _NEW
    try:
        _recover_locked(out, option)  # one stopped between the check and the lock
        _write(
            module,
            new,
            out,
            merged=merged,
            ema=ema,
            metrics=metrics,
            optimizer_steps=optimizer_steps,
            adapter_config=adapter_config,
            checkpoint=checkpoint,
            pruning=pruning,
        )
        _swap_in(out, option)
        return out
    except OSError as err:
        from ..common.errors import explain_os_error

        raise ExportError(f"{option} {out}: cannot write the export: {explain_os_error(err)}") from err
    finally:
        if not (out / STAGING / _SWAP).exists():  # never swapped in: unfinished
            remove_written_tree(new, root=out)
        lock.release()


def _write(
    module: Any,
    staging: Path,
    out: Path,
    *,
    merged: bool,
    ema: Mapping[str, Any] | None,
    metrics: Mapping[str, float | None] | None,
    optimizer_steps: int,
    adapter_config: Mapping[str, Any] | None,
    checkpoint: str | None,
    pruning: Mapping[str, Any] | None,
) -> None:
    adapter = module.adapter
    lora = adapter.lora is not None and not merged
    files = write_weights(adapter, staging, merged=merged)
    if ema is not None:
        shadows = [s.detach().to("cpu") for s in ema["shadows"]]
        with swapped_in(adapter.trainable_parameters(), shadows):
            write_weights(adapter, staging / "ema", merged=merged)
        files.append("ema")
    base = base_model(adapter, adapter_config)
    card = {
        "base_model": base,
        "adapter": type(adapter).__name__,
        "method": method(module, pruning),
        "iterations": int(module.iteration),
        "optimizer_steps": int(optimizer_steps),
        "reward": (metrics or {}).get("reward"),
        "held_out_reward": (metrics or {}).get("held_out_reward"),
        "weights": "LoRA" if lora else "full denoiser (LoRA merged)" if adapter.lora is not None else "full denoiser",
        "files": files,
        "ema": {"num_updates": int(ema["num_updates"]), **ema.get("options", {})} if ema is not None else None,
        "checkpoint": checkpoint,
        "load": how_to_load(adapter, lora, base, folder=out),
    }
    (staging / CARD_TEXT).write_text(card_text(card))
    readable_like(staging / CARD_TEXT, staging)
    # what this export wrote, for a later one to know what it may replace (the card is written last)
    card[HASHES] = {rel: file_sha256(staging / rel) for rel, info in files_under(staging) if stat_is_file(info)}
    (staging / CARD_FILE).write_text(json.dumps(card, indent=2, default=str) + "\n")


def logged_rewards(tensorboard: Path, iteration: int) -> dict[str, float | None]:
    """The last training reward (``reward``) and held-out reward (``val/reward``) logged at or
    before ``iteration`` in a run's TensorBoard folder (its :func:`~.run_folder.event_folder`;
    ``None`` where there is none)."""
    found: dict[str, float | None] = {"reward": None, "held_out_reward": None}
    folder = event_folder(tensorboard)
    if not any(folder.glob("events.out.tfevents.*")):
        return found
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags().get("scalars", [])
    for tag, key in (("reward", "reward"), ("val/reward", "held_out_reward")):
        if tag in tags:
            values = [e for e in events.Scalars(tag) if e.step <= iteration]
            found[key] = float(values[-1].value) if values else None
    return found


__all__ = [
    "CARD_FILE",
    "CARD_TEXT",
    "MAX_CARD_BYTES",
    "STAGING",
    "ExportError",
    "ExportLock",
    "check_out",
    "earlier_export",
    "earlier_hashes",
    "ema_state",
    "export",
    "logged_rewards",
    "pruning_options",
    "restore",
    "swapped_in",
    "write_weights",
]
