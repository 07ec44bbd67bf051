"""The rules of the pre-training's command line (:mod:`.pretrain`), the main command line's own
(:mod:`lit_treegrpo.cli`), imported from it:

- :func:`run_cli`: a user error (a parse error, a bad value, a file or folder it cannot use, any ``OSError``) ends in
  one ``error:`` line and exit status 2, a numerical fault in one line and status 1; ``LIT_TREEGRPO_DEBUG=1`` keeps
  the traceback (:mod:`lit_treegrpo.cli.user_errors`).
- :func:`check_options`: every number of the pre-training against its type and range (:data:`RULES`, finite where
  it is a float), the sizes against each other, and the Trainer's options as the main command line checks them;
  run right after parsing, before anything is built.
- :func:`check_export_dir`: ``--model.export_dir`` is new or empty, a folder (not a file, FIFO, link ...) that can be
  written; :func:`take_export_dir` then locks it for the fit (:class:`PretrainLock`, the project's folder lock of
  :mod:`lit_treegrpo.artifacts.locks`, in ``<export_dir>/.pretrain-tmp/lock``), so a second fit into the same
  folder is refused while the first runs, and a killed fit's lock is taken over.
- :func:`write_model_folder`: the model is built in ``<export_dir>/.pretrain-tmp/new`` (:func:`staging_folder`: a
  short name, whatever the length of ``export_dir``'s) and moved in only once complete; a file in ``export_dir``
  that the fit did not write (one added while it ran) is kept and named, and one that the model would replace is
  refused, naming it (the model stays in the staging folder). An unfinished model left by a killed fit is never
  deleted: the next fit into the folder names it.

May import what :mod:`.pretrain` does, and the command line's error rule, the run lock and the work estimate's
bounds (its ``cli``, ``artifacts`` and ``training`` layers: the pre-training's command line is a top like the main
one).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from ..artifacts.locks import FolderLock, RunFolderError
from ..cli.checks import _nan_options, check_paths
from ..cli.first_checks import DEBUG_ENV
from ..cli.trainer_checks import check_trainer
from ..cli.user_errors import RUN_FAULTS, USER_ERRORS, UserError, exit_status, one_line
from ..common.env import env_flag
from ..common.errors import explain_os_error
from ..common.files import move_written, remove_empty_folder
from ..common.values import Range, check_value
from ..training.work import WorkLimit
from . import world
from .model import METADATA_FILE, save_components

OPTION = "--model.export_dir"
STAGING = ".pretrain-tmp"  # in export_dir: the fit's lock, and the model while it is built (a short name)
MODEL_ENTRIES = ("transformer", "text_encoder", "tokenizer", "scheduler", METADATA_FILE)  # what save_components writes
_SIZE, _POSITIVE, _SHARE = Annotated[int, Range(1)], Annotated[float, Range(0, low_open=True)], Range(0, 1)
_SIZES = ("image_size", "patch_size", "num_layers", "num_attention_heads", "attention_head_dim", "text_layers")
#: every number of the pre-training, by option: its declared type and range (a float: finite too)
RULES: dict[str, Any] = {
    "model.seed": int,
    "model.lr": _POSITIVE,
    "model.weight_decay": Annotated[float, Range(0)],
    "model.warmup_steps": Annotated[int, Range(0)],
    "model.final_lr_ratio": Annotated[float, _SHARE],
    "model.ema_decay": Annotated[float, Range(0, 1, high_open=True)],
    "model.grad_clip": _POSITIVE,
    "model.eval_samples": _SIZE,
    "model.eval_steps": _SIZE,
    "model.eval_guidance": float,
    **{f"model.model.{name}": _SIZE for name in (*_SIZES, "text_width", "max_tokens")},
    "model.model.shift": _POSITIVE,
    "data.batch_size": _SIZE,
    "data.seed": int,
    **{
        f"data.{name}": Annotated[float, _SHARE] for name in ("caption_dropout", "size_word_prob", "position_word_prob")
    },
    "data.image_size": _SIZE,
}
TEXT_HEADS = 4  # attention heads of the text encoder (shapes.model.build_components)


def run_cli(make: Callable[[], Any]) -> None:
    """``make()`` (the pre-training's CLI, which runs its command) under the main command line's error rule."""
    debug = False  # a value env_flag refuses is itself a user error, reported without a traceback
    try:
        debug = env_flag(DEBUG_ENV)
        make()
    except (*RUN_FAULTS, *USER_ERRORS) as err:
        if debug:
            raise
        print(f"error: {one_line(err)}  (set {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        sys.exit(exit_status(err))


def check_options(config: Any, subcommand: str | None) -> None:
    """Refuse a bad value of any option in one line naming it (see the module docstring)."""
    bad = [
        found for section in ("model", "data", "trainer") for found in _nan_options(config.get(section), f"--{section}")
    ]
    if bad:
        raise UserError(f"{bad[0]}: not a finite number; no option of the pre-training takes nan or inf")
    for key, rule in RULES.items():
        try:
            check_value(config.get(key), rule, f"--{key}")
        except ValueError as err:
            raise UserError(str(err)) from err
    seed, most = config.get("seed_everything"), 2**32 - 1
    if not isinstance(seed, bool) and seed is not None and not 0 <= seed <= most:
        raise UserError(f"--seed_everything must be true, false or a whole number in [0, {most}], got {seed}")
    if not -(2**63) <= config.get("model.seed") <= 2**64 - 2:  # it seeds torch.manual_seed(seed) and (seed + 1)
        raise UserError(f"--model.seed must be in [-2**63, 2**64 - 2] (torch's seeds), got {config.get('model.seed')}")
    _check_sizes(config)
    _check_work(config)
    for lightning in ("optimizer", "lr_scheduler"):
        if config.get(lightning) is not None:
            raise UserError(
                f"--{lightning}: the pre-training builds AdamW with warm-up and cosine decay from --model.lr, "
                "--model.weight_decay, --model.warmup_steps and --model.final_lr_ratio; drop it"
            )
    check_paths(config)
    trainer = {k: v for k, v in config["trainer"].as_dict().items() if not k.startswith("__")}
    for name in ("gradient_clip_val", "gradient_clip_algorithm"):  # the main module's message names its own option
        if trainer.pop(name, None) is not None:
            raise UserError(
                f"--trainer.{name}: the pre-training clips its gradients to --model.grad_clip; leave it null"
            )
    steps = trainer.get("max_steps")
    if subcommand == "fit" and (steps is None or steps < 1):  # before the main rule, which takes -1 (no limit)
        raise UserError(
            f"--trainer.max_steps must be >= 1 (the scene stream is infinite: the fit ends there), got {steps}"
        )
    accumulate = trainer.pop("accumulate_grad_batches", 1)  # the main module's rule (refused there) is not this one's
    check_value(accumulate, Annotated[int, Range(1)], "--trainer.accumulate_grad_batches")
    check_trainer(trainer, subcommand)


def _check_work(config: Any) -> None:
    """The pre-training's evaluation and batches against the bounds of the main command line's work estimate
    (:class:`~lit_treegrpo.training.work.WorkLimit`'s defaults), before anything is built: nothing the Shapes
    model needs comes near them (96 samples x 10 steps; 128 images of 16 x 16 pixels)."""
    limit = WorkLimit()
    samples, steps = config.get("model.eval_samples"), config.get("model.eval_steps")
    if samples * steps > limit.max_evaluations:
        raise UserError(
            f"--model.eval_samples {samples:,} x --model.eval_steps {steps:,}: each evaluation would cost "
            f"{samples * steps:,} denoiser evaluations, more than {limit.max_evaluations:,}; lower either"
        )
    batch, side = config.get("data.batch_size"), config.get("data.image_size")
    if batch * side * side > limit.max_sample_pixels:
        raise UserError(
            f"--data.batch_size {batch:,} x --data.image_size {side:,} squared: one batch would be "
            f"{batch * side * side:,} pixels, more than {limit.max_sample_pixels:,}; lower either"
        )


def _check_sizes(config: Any) -> None:
    """The model's sizes against each other and against the data."""
    model = {name: config.get(f"model.model.{name}") for name in (*_SIZES, "text_width", "max_tokens")}
    if model["image_size"] % model["patch_size"]:
        raise UserError(
            f"--model.model.image_size={model['image_size']} must be a multiple of "
            f"--model.model.patch_size={model['patch_size']}"
        )
    if model["text_width"] % TEXT_HEADS:
        raise UserError(
            f"--model.model.text_width must be a multiple of {TEXT_HEADS} (the text encoder's attention heads), "
            f"got {model['text_width']}"
        )
    longest = max(len(p.split()) for p in world.all_prompts()) + 2  # words, <bos> and <eos>
    if model["max_tokens"] < longest:
        raise UserError(
            f"--model.model.max_tokens must be >= {longest} (the grammar's longest prompt with <bos> and <eos>), "
            f"got {model['max_tokens']}"
        )
    if config.get("data.image_size") != model["image_size"]:
        raise UserError(
            f"--data.image_size={config.get('data.image_size')} but --model.model.image_size={model['image_size']}; "
            "set both to the same value"
        )


class PretrainLock(FolderLock):
    """``<export_dir>/.pretrain-tmp/lock`` while a fit owns ``export_dir`` (the project's folder lock, its refusals
    worded for ``--model.export_dir``); its release removes ``.pretrain-tmp`` once nothing else is in it."""

    name = "lock"

    def __init__(self, export_dir: str | Path) -> None:
        super().__init__(Path(export_dir) / STAGING)
        self.export_dir = export_dir

    def _in_use(self, pid: int | None) -> str:
        return (
            f"{OPTION} {self.export_dir}: in use by another pre-training (pid {pid}, lock {self.path}); wait for it "
            f"to end or stop it, or give another {OPTION} (if none runs there, delete {self.path})"
        )

    def _not_a_lock(self, what: str) -> str:
        return (
            f"{OPTION} {self.export_dir}: the pre-training's lock {self.path} is {what}, and a pre-training writes its "
            f"PID into its lock; {self._fix_for(what)} and run again"
        )

    def release(self) -> None:
        super().release()
        remove_empty_folder(self.root)


def staging_folder(export_dir: str | Path) -> Path:
    """Where the model is built before it moves into ``export_dir``: in it, under a short name (whatever the length
    of ``export_dir``'s), beside the pre-training's lock."""
    return Path(export_dir) / STAGING / "new"


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a file"


def _a_fits_lock_only(entry: Path) -> bool:
    """Whether ``entry`` of ``export_dir`` is the folder of a running or killed fit's lock, and holds nothing else."""
    if entry.name != STAGING or entry.is_symlink() or not entry.is_dir():
        return False
    return all(inside.name == PretrainLock.name for inside in entry.iterdir())  # the lock checks what it is


def check_export_dir(given: Any) -> None:
    """Refuse an ``--model.export_dir`` the fit could not own, in one line (see the module docstring)."""
    if not str(given).strip():
        raise UserError(f"{OPTION}: empty; give a folder, or null to write no model")
    path, where = Path(given), f"{OPTION} {given}"
    if path.is_symlink():
        raise UserError(
            f"{where}: is a symbolic link (to {os.readlink(path)}); give the folder itself, so that nothing is written "
            "through the link"
        )
    if path.exists() and not path.is_dir():
        raise UserError(
            f"{where}: is {_kind(path.stat().st_mode)}, not a folder; give a folder (it is created if missing)"
        )
    staging = staging_folder(path)
    if os.path.lexists(staging):
        raise UserError(
            f"{where}: {staging} holds an earlier pre-training's unfinished or unplaced model (it is built there, then "
            "moved in); move what you need out of it, delete it, and run again"
        )
    if path.is_dir() and not all(_a_fits_lock_only(entry) for entry in path.iterdir()):
        raise UserError(
            f"{where}: holds files (an earlier pre-training's model?); give a new or empty folder, or null to write no model"
        )
    full = Path(os.path.abspath(path))
    ancestor = full if full.is_dir() else next(p for p in full.parents if p.exists())  # / at the latest
    if not ancestor.is_dir():
        raise UserError(f"{where}: cannot create it, {ancestor} is a file; give another folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        what = "is not writable" if ancestor == full else f"cannot be created, {ancestor} is not writable"
        raise UserError(f"{where}: {what}; give a folder you can write, or null to write no model")


def take_export_dir(given: Any) -> PretrainLock:
    """Lock ``--model.export_dir`` for this fit (created if missing): refused while another fit holds it."""
    lock = PretrainLock(given)
    try:
        lock.acquire()
    except RunFolderError as err:
        raise UserError(str(err)) from None
    except OSError as err:
        raise UserError(f"{OPTION} {given}: cannot create or lock it: {explain_os_error(err)}") from err
    return lock


def write_model_folder(export_dir: str | Path, parts: dict[str, Any], metadata: dict[str, Any]) -> list[str]:
    """Build the model folder in :func:`staging_folder` and move it into ``export_dir``, never over an entry there;
    returns the names of what ``export_dir`` held besides (files added while the fit ran), which stay."""
    out, new = Path(export_dir), staging_folder(export_dir)
    new.mkdir(parents=True)  # exclusively: never into another's
    save_components(new, parts, metadata)
    clash = [entry.name for entry in sorted(new.iterdir()) if os.path.lexists(out / entry.name)]
    if clash:
        raise UserError(
            f"{OPTION} {export_dir}: holds {clash[0]!r}, which this pre-training did not write and its model would "
            f"replace; the model is kept in {new}: move {clash[0]} away and the model's files in"
        )
    for entry in sorted(new.iterdir()):
        move_written(entry, out / entry.name)
    remove_empty_folder(new)
    remove_empty_folder(new.parent)  # unless the lock is in it (its release removes it)
    return sorted(entry.name for entry in out.iterdir() if entry.name not in (STAGING, *MODEL_ENTRIES))
