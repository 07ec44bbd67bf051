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
resume). The folder is written beside ``DIR`` and moved into place, so an export that fails leaves
no half-written ``DIR``. ``DIR`` must be new or empty; an earlier export there is replaced only with
``--overwrite true``, and then only the files its card lists (``files``, ``export.json``,
``README.md``): a file the user added stays, and is named (rule 1 of docs/failure_modes.md).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..common.files import (
    MiB,
    NotWrittenHere,
    move_written,
    read_text_limited,
    remove_empty_folder,
    remove_written,
    remove_written_tree,
    replace_with_written,
)
from .card import base_model, card_text, how_to_load, method
from .run_folder import event_folder

if TYPE_CHECKING:
    from ..models.base import DiffusionAdapter

CARD_FILE = "export.json"
CARD_TEXT = "README.md"
#: the largest card read back (an earlier export's, to know what it wrote); a card is a few KiB
MAX_CARD_BYTES = 1 * MiB


class ExportError(ValueError):
    """The export cannot be made as asked (one line: the option and the fix)."""


# ------------------------------------------------------------------------ the folder
def check_out(out: str | Path | None, *, overwrite: bool = False, option: str = "--out") -> Path:
    """``out`` as a path an export may write: new, empty, or (``overwrite``) an earlier export, whose
    card must say what it wrote (:func:`earlier_export`)."""
    if out is None or not str(out).strip():
        raise ExportError(f"{option}: give the folder to write the export to, e.g. {option} exports/my_run")
    path = Path(out).expanduser()
    if path.is_symlink():
        raise ExportError(
            f"{option} {path}: is a symbolic link (to {os.readlink(path)}); give the folder itself, so that "
            "nothing is written or replaced through the link"
        )
    if path.exists() and not path.is_dir():
        raise ExportError(f"{option} {path}: is a file; give a folder (it is created if missing)")
    if path.is_dir() and any(path.iterdir()):
        if not (path / CARD_FILE).is_file():
            raise ExportError(
                f"{option} {path}: the folder holds files and no earlier export ({CARD_FILE}); give a new or empty folder"
            )
        if not overwrite:
            raise ExportError(
                f"{option} {path}: holds an earlier export ({CARD_FILE}); give a new or empty folder, or pass "
                "--overwrite true to replace the files that export wrote (other files stay)"
            )
        earlier_export(path, option)
    ancestor = path.parent if path.parent != Path("") else Path(".")
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ExportError(f"{option} {path}: cannot create it, {ancestor} is a file; give another folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ExportError(f"{option} {path}: cannot create it, {ancestor} is not writable; give a folder you can write")
    return path


def earlier_export(out: Path, option: str = "--out") -> list[str]:
    """The names of what the earlier export in ``out`` wrote, from its card (its ``files``, the card
    and its text); a card that cannot be read, or names a path rather than an entry of ``out``, is
    refused in one line."""
    card_path = out / CARD_FILE
    fix = f"move the folder's files away yourself, or give another {option}"
    try:
        card = json.loads(read_text_limited(card_path, MAX_CARD_BYTES, f"{option} {out}"))
    except json.JSONDecodeError as err:
        raise ExportError(f"{option} {out}: {card_path} is not an export card ({err.msg}); {fix}") from None
    files = card.get("files") if isinstance(card, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise ExportError(f"{option} {out}: {card_path} lists no files it wrote; {fix}")
    names = [*files, CARD_FILE, CARD_TEXT]
    odd = [n for n in names if n in ("", ".", "..") or "/" in n or os.sep in n or (os.altsep and os.altsep in n)]
    if odd:
        raise ExportError(f"{option} {out}: {card_path} lists {odd[0]!r}, which no export writes; {fix}")
    return list(dict.fromkeys(names))


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
    staging = out.parent / f".{out.name}.export-tmp"
    remove_written_tree(staging, root=out.parent)  # an export killed before it moved its folder
    try:
        _write(
            module,
            staging,
            out,
            merged=merged,
            ema=ema,
            metrics=metrics,
            optimizer_steps=optimizer_steps,
            adapter_config=adapter_config,
            checkpoint=checkpoint,
            pruning=pruning,
        )
        _move_into_place(staging, out, option)
        return out
    except OSError as err:
        from ..common.errors import explain_os_error

        raise ExportError(f"{option} {out}: cannot write the export: {explain_os_error(err)}") from err
    finally:
        remove_written_tree(staging, root=out.parent)


def _move_into_place(staging: Path, out: Path, option: str) -> None:
    """``staging`` (the new export) becomes ``out``: in one rename when ``out`` is new or empty;
    else the earlier export's own files are removed and the new ones moved in beside what else is
    there (said in one line)."""
    if not out.is_dir() or not any(out.iterdir()):
        replace_with_written(staging, out)
        return
    earlier = earlier_export(out, option)
    new = sorted(p.name for p in staging.iterdir())
    kept = sorted(p.name for p in out.iterdir() if p.name not in earlier)
    clash = [name for name in new if name in kept]
    if clash:
        raise ExportError(
            f"{option} {out}: holds {clash[0]!r}, which the earlier export did not write and this one would; "
            "move it away, or give another folder"
        )
    try:
        for name in earlier:
            entry = out / name
            if entry.is_dir() and not entry.is_symlink():
                remove_written_tree(entry, root=out)
            else:
                remove_written(entry, root=out, names=(name,))
    except NotWrittenHere as err:
        raise ExportError(f"{option} {out}: {err}") from None
    for name in new:
        move_written(staging / name, out / name)
    remove_empty_folder(staging)
    if kept:
        from lightning.pytorch.utilities import rank_zero_info

        rank_zero_info(f"{option} {out}: replaced the earlier export; kept {', '.join(kept)}, which no export wrote")


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
    (staging / CARD_FILE).write_text(json.dumps(card, indent=2, default=str) + "\n")
    (staging / CARD_TEXT).write_text(card_text(card))
    readable_like(staging / CARD_FILE, staging)


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
