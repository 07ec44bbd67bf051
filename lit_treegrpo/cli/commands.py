"""What the commands add to Lightning's: ``export``'s options (:class:`ExportCommand`, whose signature the CLI builds
them from) and the command itself (:func:`export_checkpoint`; :mod:`lit_treegrpo.artifacts.export` writes the files), the
options of the others (:func:`add_command_options`: ``fit --overwrite``, ``--raw_weights``), and which weights
``validate`` / ``test`` / ``predict`` evaluate (:func:`choose_weights`: a checkpoint's EMA weights when its run had
an EMA, as fit validated)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from ..artifacts.export import ema_state, export, logged_rewards, pruning_options, restore
from ..callbacks import EMA
from .user_errors import UserError


class ExportCommand:
    """Holds the signature of the ``export`` subcommand, from which the CLI builds its options."""

    def export(
        self,
        model: Any,
        datamodule: Any = None,
        ckpt_path: str = "last",
        out: str | None = None,
        merged: bool = False,
        ema: bool = False,
        overwrite: bool = False,
    ) -> None:
        """Write a checkpoint's trained weights in the model family's diffusers format, with a card."""
        raise NotImplementedError("run through python -m lit_treegrpo export")  # the CLI runs it itself


def add_command_options(parser: Any, subcommand: str) -> None:
    """The options a subcommand has beside its Trainer method's: ``--raw_weights`` for validate /
    test / predict, ``--overwrite`` for fit."""
    if subcommand in ("validate", "test", "predict"):
        parser.add_argument(
            "--raw_weights",
            type=bool,
            default=False,
            help=(
                "Evaluate the checkpoint's training weights. By default a checkpoint of a run with an "
                "EMA callback is evaluated with its EMA weights, as fit validated it."
            ),
        )
    if subcommand == "fit":
        parser.add_argument(
            "--overwrite",
            type=bool,
            default=False,
            help=(
                "Start a new run in a --trainer.default_root_dir that already holds one "
                "(checkpoints/last.ckpt): the files a fit writes in its checkpoints/, tensorboard/ and "
                "samples/ are deleted once the new run's model has loaded (other files stay; a sub-folder "
                "that is a symbolic link is refused). Without it such a fit is refused; --ckpt_path last "
                "resumes the run instead."
            ),
        )


def export_checkpoint(
    model: Any,
    checkpoint: Mapping[str, Any],
    ckpt_path: str,
    options: Mapping[str, Any],
    root: Path,
    *,
    adapter_config: Any = None,
) -> None:
    """``export``: ``checkpoint``'s weights (read from ``ckpt_path``) into the configured ``model``, then written out
    with ``options`` (``out``, ``merged``, ``ema``, ``overwrite``); the card's rewards come from the run's
    TensorBoard events under ``root``, its base model from ``adapter_config`` (the configured adapter's namespace)."""
    restore(model, checkpoint)
    ema = ema_state(checkpoint) if options["ema"] else None
    if options["ema"] and ema is None:
        raise UserError(
            f"--ema true: {ckpt_path} holds no EMA weights (the run had no EMA callback, or it had "
            "not updated yet); drop --ema"
        )
    out = export(
        model,
        options["out"],
        merged=options["merged"],
        ema=ema,
        metrics=logged_rewards(root / "tensorboard", model.iteration),
        optimizer_steps=int(checkpoint.get("global_step", 0)),
        checkpoint=ckpt_path,
        adapter_config=adapter_config.as_dict() if hasattr(adapter_config, "as_dict") else None,
        pruning=pruning_options(checkpoint),
        overwrite=options.get("overwrite", False),
    )
    rank_zero_info(f"exported {ckpt_path} (iteration {model.iteration}) to {out}")


def choose_weights(trainer: Any, checkpoint: Mapping[str, Any] | None, *, raw: bool) -> None:
    """validate / test / predict from a checkpoint (``checkpoint``: what the CLI read from
    ``--ckpt_path``, once and safely; None: no checkpoint): evaluate its EMA weights when the run
    had an EMA (adding the callback, with the run's options, if the configuration lacks it), as fit
    validated; ``raw`` (``--raw_weights true``): the training weights."""
    emas = [cb for cb in trainer.callbacks if isinstance(cb, EMA)]
    if raw:
        for cb in emas:  # restored, but never swapped in
            cb.apply_on = tuple(a for a in cb.apply_on if a != "validation")
        return
    if checkpoint is None:
        return
    state = ema_state(checkpoint)
    if state is None:
        return
    if not emas:
        trainer.callbacks.append(EMA(**state.get("options", {}), apply_on=("validation",)))
    elif not any("validation" in cb.apply_on for cb in emas):
        return
    rank_zero_info(
        f"evaluating the checkpoint's EMA weights ({state['num_updates']} updates); --raw_weights true "
        "for its training weights"
    )


def say_which_weights(subcommand: str, root: Path) -> None:
    """validate / test / predict without ``--ckpt_path`` in a folder ``root`` that holds a run
    score the configured model's own weights, not the run's: say so, and how to score the run's."""
    last = root / "checkpoints" / "last.ckpt"
    if last.is_file():
        rank_zero_info(
            f"{subcommand}: no --ckpt_path, so this scores the configured model's own weights (the base "
            f"model), not the run in {root}; add --ckpt_path last to score its {last}"
        )
