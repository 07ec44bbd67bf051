"""The command line: ``python -m lit_treegrpo {fit,validate,test,predict} --config FILE``.

LightningCLI over :class:`TreeGRPOModule` and :class:`PromptDataModule`, with three project rules:

- Everything a run writes lives under ``--trainer.default_root_dir``: TensorBoard events in
  ``tensorboard/`` (one fixed folder, so a resumed run appends to the same curves) and checkpoints
  in ``checkpoints/`` with ``last.ckpt`` always kept. Lightning's default puts "last" under a new
  logger version, so ``--ckpt_path last`` silently starts over; here the folder is fixed.
- ``--ckpt_path last`` resumes from ``<root>/checkpoints/last.ckpt`` and says so, or fails with a
  clear message when there is none.
- A user error (a bad option value, a missing file, an impossible tree) prints one line naming it
  and exits with status 2; set ``LIT_TREEGRPO_DEBUG=1`` for the traceback.
- SIGTERM or a first Ctrl-C stops after the training step in flight and writes ``last.ckpt``
  (:class:`~lit_treegrpo.callbacks.CheckpointOnInterrupt`); the process then exits with status 0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from jsonargparse import set_parsing_settings
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info

from .callbacks import CheckpointOnInterrupt
from .data import PromptDataModule
from .module import TreeGRPOModule
from .rewards import REWARDS

DEFAULT_ROOT = "runs/lit_treegrpo"
DEBUG_ENV = "LIT_TREEGRPO_DEBUG"


class UserError(Exception):
    """A mistake in the command line or config: reported in one line, without a traceback."""


class TreeGRPOCLI(LightningCLI):
    """LightningCLI with fixed run folders and honest resume (see the module docstring)."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        set_parsing_settings(docstring_parse_attribute_docstrings=True)
        super().__init__(
            TreeGRPOModule,
            PromptDataModule,
            args=args,
            run=run,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={
                "prog": "python -m lit_treegrpo",
                "description": "Tree-structured GRPO for diffusion and flow models (TreeGRPO, BranchGRPO).",
                "default_env": False,
            },
        )

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.set_defaults({"trainer.default_root_dir": DEFAULT_ROOT})

    def before_instantiate_classes(self) -> None:
        """Checks that need no model, made before any weights load (minutes for SD3.5)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        reward = config.get("model.reward")
        names = [reward] if isinstance(reward, str) else list(reward) if isinstance(reward, dict) else []
        unknown = [n for n in names if n not in REWARDS]
        if unknown:
            raise UserError(
                f"--model.reward: unknown reward {unknown[0]!r}; known rewards: {', '.join(sorted(REWARDS))}"
            )

    def _root(self) -> Path:
        trainer = self.config_init[self.subcommand]["trainer"] if self.subcommand else self.config_init["trainer"]
        return Path(trainer.get("default_root_dir") or DEFAULT_ROOT)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
        """Fixed run folders: checkpoints in <root>/checkpoints (last.ckpt kept), TensorBoard in
        <root>/tensorboard, whatever logger version Lightning would otherwise open."""
        root = Path(config.get("default_root_dir") or DEFAULT_ROOT)
        everything = list(config.get("callbacks") or []) + list(callbacks)
        checkpoints = [c for c in everything if isinstance(c, ModelCheckpoint)]
        for callback in checkpoints:
            if callback.dirpath is None:
                callback.dirpath = str(root / "checkpoints")
            elif Path(callback.dirpath).resolve() != (root / "checkpoints").resolve():
                raise UserError(
                    f"a ModelCheckpoint writes to {callback.dirpath}; checkpoints must live in "
                    f"{root / 'checkpoints'} (--trainer.default_root_dir) so that --ckpt_path last finds them"
                )
            callback.save_last = True
        if not checkpoints and config.get("enable_checkpointing", True) is not False:
            callbacks = [*callbacks, ModelCheckpoint(dirpath=str(root / "checkpoints"), save_last=True)]
        if not any(isinstance(c, CheckpointOnInterrupt) for c in everything):
            callbacks = [*callbacks, CheckpointOnInterrupt()]
        if config.get("logger") in (None, True):
            config["logger"] = TensorBoardLogger(save_dir=str(root), name="tensorboard", version="")
        return super()._instantiate_trainer(config, callbacks)

    def before_fit(self) -> None:
        self._resolve_last()

    def before_validate(self) -> None:
        self._resolve_last()

    def before_test(self) -> None:
        self._resolve_last()

    def before_predict(self) -> None:
        self._resolve_last()

    def _resolve_last(self) -> None:
        """Turn ``--ckpt_path last`` into the run folder's last.ckpt, or fail loudly."""
        key = f"{self.subcommand}.ckpt_path"
        if self.config.get(key) != "last":
            return
        last = self._root() / "checkpoints" / "last.ckpt"
        if not last.exists():  # a file, or a folder for distributed (FSDP2) checkpoints
            raise UserError(
                f"--ckpt_path last: no checkpoint at {last}; check --trainer.default_root_dir, or "
                f"drop --ckpt_path to start a new run"
            )
        rank_zero_info(f"Resuming from {last}")
        self.config_init[self.subcommand]["ckpt_path"] = str(last)  # what the Trainer receives


def main(args: list[str] | None = None) -> None:
    """Console entry: run the CLI; user errors become one line on stderr and exit status 2."""
    try:
        TreeGRPOCLI(args=args)
    except (UserError, ValueError, FileNotFoundError, ImportError) as err:
        if os.environ.get(DEBUG_ENV):
            raise
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"error: {message}  (set {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        sys.exit(2)
