"""What the commands beyond Lightning's ``fit`` add: ``export``'s options (:class:`ExportCommand`,
whose signature the CLI builds them from) and the command itself (:func:`export_checkpoint`;
:mod:`lit_treegrpo.runs.export` writes the files), and which weights ``validate`` / ``test`` /
``predict`` evaluate (:func:`choose_weights`: a checkpoint's EMA weights when its run had an EMA, as
fit validated)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from ..callbacks import EMA
from ..runs.export import ema_state, export, logged_rewards, pruning_options, restore
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
        """Write a checkpoint's trained weights in the model family's diffusers format, with a card.

        Args:
            model: the run's model, from --config (the checkpoint holds the trainable weights only).
            datamodule: unused.
            ckpt_path: the checkpoint: ``last`` (``<default_root_dir>/checkpoints/last.ckpt``) or a file.
            out: the folder to write: new or empty (an earlier export there needs --overwrite true).
            merged: write the full denoiser with the LoRA merged in, instead of the LoRA alone.
            ema: also write the run's EMA weights (``<out>/ema``); the run must have had an EMA callback.
            overwrite: replace an earlier export in --out: only the files it wrote (listed in its
                export.json); other files there stay.
        """
        raise NotImplementedError("run through python -m lit_treegrpo export")  # the CLI runs it itself


def export_checkpoint(
    model: Any,
    checkpoint: Mapping[str, Any],
    ckpt_path: str,
    options: Mapping[str, Any],
    root: Path,
    *,
    adapter_config: Any = None,
) -> None:
    """``export``: ``checkpoint``'s weights (read from ``ckpt_path``) into the configured ``model``,
    then written out with ``options`` (``out``, ``merged``, ``ema``, ``overwrite``); the card's rewards come from
    the run's TensorBoard events under ``root``, its base model from ``adapter_config`` (the
    configured adapter's namespace)."""
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
