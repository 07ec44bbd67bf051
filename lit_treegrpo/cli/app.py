"""The command line: ``python -m lit_treegrpo {fit,validate,test,predict,export} --config FILE``.

LightningCLI over :class:`TreeGRPOModule` and :class:`PromptDataModule`, with three project rules:

- Everything a run writes lives under ``--trainer.default_root_dir``: TensorBoard events in
  ``tensorboard/`` (one fixed folder, so a resumed run appends to the same curves) and checkpoints
  in ``checkpoints/`` with ``last.ckpt`` always kept. Lightning's default puts "last" under a new
  logger version, so ``--ckpt_path last`` silently starts over; here the folder is fixed.
  ``last.ckpt`` holds every fit's final state, and a moved or copied run folder resumes into its
  own ``last.ckpt`` (:class:`~lit_treegrpo.callbacks.KeepLastCheckpoint`).
- ``--ckpt_path last`` resumes from ``<root>/checkpoints/last.ckpt`` and says so, or fails with a
  clear message when there is none. A resume follows the resume rules (:mod:`lit_treegrpo.training.resume`,
  docs/configs.md): an option that shaped the checkpoint's weights may not change (refused before
  the model loads), the others apply over the restored state, and the changes are said.
- A user error (an unknown option, a value of the wrong type, a missing file, an impossible tree)
  prints one line naming the option and the fix, and exits with status 2; set
  ``LIT_TREEGRPO_DEBUG=1`` for the traceback. Everything that needs no weights is checked before
  any model loads (:func:`lit_treegrpo.cli.checks.check_config`). A run stopped by a numerical
  fault (a NaN reward, loss or gradient; too many consecutive skips) also ends in one line, with
  status 1.
- Checkpoints are written atomically (:class:`~lit_treegrpo.artifacts.checkpoint.AtomicCheckpointIO`), and a
  truncated or corrupt ``--ckpt_path`` is reported before any model loads.
- ``--ckpt_path`` is read once, with torch's safe unpickler, before any model loads
  (:func:`~lit_treegrpo.artifacts.checkpoint.read_checkpoint`); what was read is handed to Lightning's restore,
  the EMA choice and export, so a file swapped on disk afterwards is never read. Every other
  checkpoint load is ``weights_only=True`` too (``--weights_only false`` is refused).
- SIGTERM or a first Ctrl-C stops a fit after the training step in flight and writes
  ``last.ckpt`` (:class:`~lit_treegrpo.callbacks.CheckpointOnInterrupt`); the process then exits
  with status 0. ``validate`` / ``test`` / ``predict`` never write a checkpoint: interrupted, they
  stop after the batch in flight and exit with status 143 (SIGTERM) or 1 (Ctrl-C).
- A fit never destroys an earlier one (:mod:`lit_treegrpo.artifacts.run_folder`): a folder that holds a run
  is resumed (``--ckpt_path last``) or explicitly started over (``--overwrite true``), a second live
  fit in the same folder is refused, and each fit's config is saved beside, never over, the
  earlier ones, and handed to every logger (:mod:`lit_treegrpo.cli.config_record`); other commands
  save no config.
- Before any of this is imported, ``cli.main`` checks a real model's weights, then the rewards'
  extras (:mod:`lit_treegrpo.cli.first_checks`), which also resolves ``--config shapes`` to a
  shipped config. Lightning's own ``--optimizer`` / ``--lr_scheduler`` are left out (the module's
  are ``--model.optimizer`` / ``--model.lr_scheduler``), and refused by name.
- One rule for errors: whatever comes from the configuration, the files or the environment (a
  parse or YAML error, a bad value, any ``OSError``: a missing or unreadable file, a full disk, a
  folder that cannot be created; a checkpoint of any kind that cannot be loaded; Lightning's
  ``MisconfigurationException``; a model not in the hub cache while offline) ends in one line and
  status 2 (:mod:`lit_treegrpo.cli.user_errors`). Anything else is a bug and keeps its traceback.
- ``export`` writes a checkpoint's trained weights in the family's diffusers format with a card
  (:mod:`lit_treegrpo.artifacts.export`); ``validate`` / ``test`` / ``predict`` evaluate a checkpoint's EMA
  weights when its run had an EMA (``--raw_weights true``: the training weights).
- Output and length (:mod:`lit_treegrpo.cli.run_output`): progress lines for a stdout that is no terminal, a quiet
  start-up, ``--max_iterations`` in training iterations."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

from jsonargparse import set_parsing_settings
from lightning.fabric.plugins.io import CheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ..artifacts.checkpoint import AtomicCheckpointIO, guard_strategy_load, intact_checkpoints, read_checkpoint
from ..artifacts.export import check_out
from ..artifacts.run_folder import (
    RunFolderError,
    RunLock,
    RunTensorBoardLogger,
    check_new_run,
    clear_run,
    launch_rank,
    run_name,
)
from ..callbacks import CheckpointOnInterrupt, KeepLastCheckpoint
from ..common.config_yaml import use_checked_yaml
from ..common.env import env_flag
from ..common.errors import explain_os_error
from ..data.datamodule import PromptDataModule
from ..training.module import TreeGRPOModule
from .checks import adapter_config, check_config, check_resume_options
from .commands import ExportCommand, add_command_options, choose_weights, export_checkpoint, say_which_weights
from .config_record import LoggedConfigRecord
from .first_checks import DEBUG_ENV, asks_for_help, check_path_lengths, negative_values_joined, resolve_config_names
from .run_output import (
    MAX_ITERATIONS_HELP,
    MAX_STEPS_HELP,
    compact_summary,
    iteration_limit,
    loggers_in_run_folder,
    output_callbacks,
    quiet_known_warnings,
    quiet_startup,
    report_interrupts,
)
from .special_files import check_values
from .user_errors import (
    RUN_FAULTS,
    USER_ERRORS,
    CommandInterrupted,
    OneLineParser,
    UserError,
    check_yaml_file,
    config_files,
    exit_status,
    one_line,
    write_failures_said,
)

DEFAULT_ROOT = "runs/lit_treegrpo"


class TreeGRPOCLI(LightningCLI):
    """LightningCLI with fixed run folders and honest resume (see the module docstring)."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        # the options' descriptions come from the attributes' docstrings, which jsonargparse reads
        # from the sources (seconds at every start): only --help shows them
        set_parsing_settings(docstring_parse_attribute_docstrings=asks_for_help(args))
        quiet_startup()  # log filters only (a notebook builds the CLI without main)
        use_checked_yaml()  # no duplicate key, aliases bounded, in every YAML jsonargparse reads
        self._verified: str | None = None  # the --ckpt_path file already checked
        self._checkpoint: dict[str, Any] | None = None  # what was read from it, handed to its users
        self._ckpt_path: str | None = None  # --ckpt_path resolved and checked
        self._lock: RunLock | None = None  # held by a fit (launch rank 0) while it runs
        self._clear_before_fit: Path | None = None  # --overwrite true: the earlier run to set aside
        self._max_iterations: int | None = None  # fit's --max_iterations
        try:
            super().__init__(
                TreeGRPOModule,
                PromptDataModule,
                args=args,
                run=run,
                parser_class=OneLineParser,
                save_config_callback=LoggedConfigRecord,
                # the module builds its optimizer from --model.optimizer / --model.lr_scheduler:
                # Lightning's own --optimizer / --lr_scheduler would be accepted and then ignored
                auto_configure_optimizers=False,
                parser_kwargs={
                    "prog": "python -m lit_treegrpo",
                    "description": "Tree-structured GRPO for diffusion and flow models (TreeGRPO, BranchGRPO).",
                    "default_env": False,
                },
            )
        finally:
            if self._lock is not None:
                self._lock.release()

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Lightning's four, and ``export`` (:mod:`lit_treegrpo.artifacts.export`)."""
        return {**LightningCLI.subcommands(), "export": {"model", "datamodule"}}

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        # Lightning takes each subcommand's options from the Trainer method of its name; export
        # is no Trainer method, so its options come from ExportCommand.export's signature
        self._subcommand_parsers = {}
        subcommands = parser.add_subcommands()
        for name in self.subcommands():
            klass = ExportCommand if name == "export" else self.trainer_class
            description = (getattr(klass, name).__doc__ or "").strip().splitlines()[0]
            options = {"description": description, **kwargs.get(name, {})}
            self._subcommand_parsers[name] = self._prepare_subcommand_parser(klass, name, **options)
            subcommands.add_subcommand(name, self._subcommand_parsers[name], help=description)

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        # an abbreviated option (--trainer.max_step) is a typo to report, not a guess to expand
        kwargs.setdefault("allow_abbrev", False)
        return super().init_parser(**kwargs)

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        add_command_options(parser, subcommand)  # --raw_weights, --overwrite
        return parser

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # jsonargparse reports a YAML syntax error in a --config file as coming from "<unicode
        # string>"; read each one first, so the message names the file
        argv = sys.argv[1:] if args is None else args
        if isinstance(argv, (list, tuple)):
            argv = negative_values_joined(list(argv))  # --option -1e3 is a value, not an option
            check_path_lengths(argv)  # before Path.exists looks (and raises on a path too long)
            argv = resolve_config_names(argv)  # --config shapes: the shipped configs/shapes.yaml
            files = config_files(argv)
            OneLineParser.config_sources = tuple((f, os.path.abspath(f)) for f in files)
            for path in files:
                check_yaml_file(path)
            check_values(argv, parser)
            if args is None:
                sys.argv[1:] = argv  # Lightning warns about an args list given beside a command line
            else:
                args = argv
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        # Lightning's hook reads an explicit --ckpt_path file a second time, to merge its
        # hyper_parameters into the configuration. This module saves none, so a checkpoint that
        # holds some was written by something else, and a configuration taken from a file can name
        # any class to build: the configuration is the command line's alone. The file is read once
        # here (a corrupt, hostile or non-Lightning one reported in one line) and kept
        subcommand = self.config.get("subcommand")
        given = self.config[subcommand].get("ckpt_path") if subcommand else None
        if given not in (None, "last", "best", "hpc", "registry") and Path(given).is_file():
            self._verify_checkpoint(Path(given), "--ckpt_path")

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.set_defaults({"trainer.default_root_dir": DEFAULT_ROOT})
        # every command accepts it, so that one config file serves fit and validate alike
        # (a type jsonargparse reads at run time, as its --help shows it: kept as written)
        parser.add_argument("--max_iterations", type=Optional[int], default=None, help=MAX_ITERATIONS_HELP)  # noqa: UP045
        for action in parser._actions:
            if action.dest == "trainer.max_steps":
                action.help = MAX_STEPS_HELP

    def before_instantiate_classes(self) -> None:
        """Checks that need no model, made before any weights load (minutes for SD3.5); then a
        fit takes its run folder (:meth:`_take_run_folder`)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        check_config(config, subcommand=self.subcommand)
        if config.get("weights_only") is False:
            raise UserError(
                "--weights_only false: checkpoints are loaded with torch's safe unpickler only (they hold "
                "tensors and plain values; anything else may be hostile); drop the option"
            )
        limit = config.get("max_iterations")
        if limit is not None and limit < 1:
            raise UserError(
                f"--max_iterations must be >= 1, got {limit}; or leave it out to stop at --trainer.max_steps"
            )
        self._max_iterations = limit if self.subcommand == "fit" else None
        # the processes a DDP launcher starts beside rank 0 find the folder already taken by it
        owner = self.subcommand == "fit" and launch_rank() == 0
        root = Path(config["trainer"].get("default_root_dir") or DEFAULT_ROOT)
        loggers_in_run_folder(config["trainer"].get("logger"), root)
        if owner:
            try:
                check_new_run(root, config.get("ckpt_path"), config.get("overwrite", False))
            except RunFolderError as err:
                raise UserError(str(err)) from err
        self._ckpt_path = self._checked_ckpt_path(config)
        if self._ckpt_path not in (None, "best", "hpc", "registry"):
            assert self._checkpoint is not None  # read by _checked_ckpt_path
            # the resume rules (the weights' own, for the other commands), before the model loads
            check_resume_options(config, self._checkpoint, self._ckpt_path, fitting=self.subcommand == "fit")
        if self.subcommand == "export":
            check_out(config.get("out"), overwrite=config.get("overwrite", False))  # before the model loads
        if owner:
            self._take_run_folder(root, overwrite=config.get("overwrite", False))

    def _take_run_folder(self, root: Path, *, overwrite: bool) -> None:
        """Lock the folder for this fit (refused while another fit holds it); with
        ``--overwrite true`` the files its earlier run wrote are set aside in :meth:`before_fit`."""
        lock = RunLock(root)
        try:
            lock.acquire()
        except RunFolderError as err:
            raise UserError(str(err)) from err
        except OSError as err:
            raise UserError(
                f"--trainer.default_root_dir: cannot create or lock {root}: {explain_os_error(err)}"
            ) from err
        self._lock = lock
        self._clear_before_fit = root if overwrite else None

    def _checked_ckpt_path(self, config: Any) -> str | None:
        """``--ckpt_path`` resolved (``last`` -> ``<root>/checkpoints/last.ckpt``) and verified
        before any model loads: missing, truncated or garbage files, folders and files that are no
        Lightning checkpoint fail here in one line."""
        given = config.get("ckpt_path")
        if given is None or given in ("best", "hpc", "registry"):
            return given
        if not str(given).strip():
            raise UserError(
                "--ckpt_path: empty; give a checkpoint file, or last, or leave the option out to start a new run"
            )
        root = Path(config["trainer"].get("default_root_dir") or DEFAULT_ROOT)
        path = root / "checkpoints" / "last.ckpt" if given == "last" else Path(given)
        if not path.exists():
            export = self.subcommand == "export"
            if given == "last":
                fix = "give the checkpoint file" if export else "drop --ckpt_path to start a new run"
                raise UserError(
                    f"--ckpt_path last: no checkpoint at {path}; check --trainer.default_root_dir, or {fix}"
                )
            fix = "--ckpt_path last for the run's latest" if export else "drop --ckpt_path to start over"
            raise UserError(f"--ckpt_path: no checkpoint at {path}; check the path, or {fix}")
        if path.is_dir():
            # this project's checkpoints are single files (sharded ones are refused when written)
            inside = intact_checkpoints(path, most=1) or intact_checkpoints(path / "checkpoints", most=1)
            hint = f" such as {inside[0]}" if inside else ""  # only a file that reads as a checkpoint
            raise UserError(f"--ckpt_path: {path} is a folder; give a checkpoint file{hint}, or last")
        if self._verified != str(path):  # not already read by _parse_ckpt_path
            self._verify_checkpoint(path, f"--ckpt_path {given}" if given == "last" else "--ckpt_path")
        return str(path)

    def _verify_checkpoint(self, path: Path, option: str) -> None:
        """Read ``path`` once (zip, CRCs, safe unpickling, a Lightning checkpoint) and keep it."""
        self._checkpoint = read_checkpoint(path, option=option)
        self._verified = str(path)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
        """Fixed run folders: checkpoints in <root>/checkpoints (last.ckpt kept), TensorBoard in
        <root>/tensorboard, whatever logger version Lightning would otherwise open; atomic
        checkpoint writes unless the trainer is given its own CheckpointIO; last.ckpt written at
        the end of every fit, and kept in place when the folder was moved or copied
        (:class:`~lit_treegrpo.callbacks.KeepLastCheckpoint`)."""
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
        if not any(isinstance(c, KeepLastCheckpoint) for c in everything):
            callbacks = [*callbacks, KeepLastCheckpoint()]
        report_interrupts([c for c in [*everything, *callbacks] if isinstance(c, CheckpointOnInterrupt)])
        if config.get("logger") in (None, True):
            # no placeholder hp_metric: it would open the event file before anything is measured
            config["logger"] = RunTensorBoardLogger(
                save_dir=str(root),
                name="tensorboard",
                version="",
                default_hp_metric=False,
                run_name=run_name(self.model),
            )
        plugins = config.get("plugins")
        plugins = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            config["plugins"] = [*plugins, AtomicCheckpointIO()]
        callbacks = iteration_limit(config, output_callbacks(config, callbacks, everything), self._max_iterations)
        trainer = super()._instantiate_trainer(config, callbacks)
        compact_summary(trainer, everything)
        guard_strategy_load(trainer.strategy)
        checkpoint_io = trainer.strategy.checkpoint_io
        if (
            self._checkpoint is not None
            and self._ckpt_path is not None
            and isinstance(checkpoint_io, AtomicCheckpointIO)
        ):
            checkpoint_io.preload(self._ckpt_path, self._checkpoint)  # Lightning's restore reads no file
        return trainer

    def _run_subcommand(self, subcommand: str) -> None:
        """Run it; a SIGTERM during validate / test / predict ends in :class:`CommandInterrupted`
        (nothing was saved: :class:`CheckpointOnInterrupt` writes only during a fit)."""
        if subcommand == "export":
            self._export()
            return
        try:
            with write_failures_said(subcommand, self.trainer):  # a failed write in one line, naming its path
                super()._run_subcommand(subcommand)
        except SIGTERMException:
            if subcommand == "fit":
                raise  # last.ckpt was written; exits with status 0
            raise CommandInterrupted(self._interrupted(subcommand)) from None
        # the last batch was already in flight when the signal came: the loops ended normally
        if subcommand != "fit" and self.trainer.received_sigterm:
            raise CommandInterrupted(self._interrupted(subcommand))

    @staticmethod
    def _interrupted(subcommand: str) -> str:
        return (
            f"{subcommand} was stopped by SIGTERM; no checkpoint or config was written (only fit writes "
            f"them); run {subcommand} again for its results"
        )

    def _export(self) -> None:
        """``export``: the checkpoint's weights into the configured model, then written out."""
        # export's --ckpt_path defaults to last, read (once, safely) before the model loaded
        assert self._ckpt_path is not None and self._checkpoint is not None
        checkpoint, self._checkpoint = self._checkpoint, None
        root = Path(self.config["export"]["trainer"].get("default_root_dir") or DEFAULT_ROOT)
        export_checkpoint(
            self.model,
            checkpoint,
            self._ckpt_path,
            self.config_init["export"],
            root,
            adapter_config=self.config["export"]["model"].get("adapter"),
        )

    def before_fit(self) -> None:
        # --overwrite true sets the earlier run's files aside only now that this one's model and trainer
        # are built (a fit that fails to load keeps the earlier run); deleted at the first checkpoint
        if self._clear_before_fit is not None:
            try:
                clear_run(self._clear_before_fit)  # says which files it kept
            except RunFolderError as err:
                raise UserError(str(err)) from err
        # recorded in checkpoints, so that a resume can refuse another adapter option by name
        self.model.adapter_config = adapter_config(self.config["fit"]["model"])
        self._resolve_ckpt_path()

    def before_validate(self) -> None:
        self._resolve_ckpt_path()
        choose_weights(self.trainer, self._take_checkpoint(), raw=self.config["validate"].get("raw_weights", False))

    def before_test(self) -> None:
        self._resolve_ckpt_path()
        choose_weights(self.trainer, self._take_checkpoint(), raw=self.config["test"].get("raw_weights", False))

    def before_predict(self) -> None:
        self._resolve_ckpt_path()
        choose_weights(self.trainer, self._take_checkpoint(), raw=self.config["predict"].get("raw_weights", False))

    def _take_checkpoint(self) -> dict[str, Any] | None:
        """The checkpoint read from ``--ckpt_path``; the CLI keeps no reference to it afterwards
        (the CheckpointIO holds it until Lightning's restore, which frees it)."""
        checkpoint, self._checkpoint = self._checkpoint, None
        return checkpoint

    def _resolve_ckpt_path(self) -> None:
        """Hand the Trainer the checkpoint checked in :meth:`_checked_ckpt_path`, to be loaded
        ``weights_only`` whatever loads it."""
        if self.config.get(f"{self.subcommand}.ckpt_path") == "last":
            rank_zero_info(f"Resuming from {self._ckpt_path}")
        self.config_init[self.subcommand]["ckpt_path"] = self._ckpt_path  # what the Trainer receives
        if "weights_only" in self.config_init[self.subcommand]:
            self.config_init[self.subcommand]["weights_only"] = True
        if self.subcommand == "fit":
            self._checkpoint = None  # preloaded into the CheckpointIO; the CLI keeps no reference
        elif self._ckpt_path is None:
            config = self.config[self.subcommand]
            say_which_weights(self.subcommand, Path(config["trainer"].get("default_root_dir") or DEFAULT_ROOT))


def main(args: list[str] | None = None) -> None:
    """Console entry: run the CLI; an error from the configuration, files or environment becomes
    one line on stderr and exit status 2, a run stopped by a numerical fault one line and status 1,
    validate / test / predict stopped by SIGTERM one line and status 143."""
    quiet_known_warnings()
    debug = False  # a value env_flag refuses is itself a user error, reported without a traceback
    try:
        debug = env_flag(DEBUG_ENV)
        TreeGRPOCLI(args=args)
    except (*RUN_FAULTS, CommandInterrupted, *USER_ERRORS) as err:
        if debug:
            raise
        print(f"error: {one_line(err)}  (set {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        sys.exit(exit_status(err))
