"""The command line: ``python -m lit_treegrpo {fit,validate,test,predict} --config FILE``.

LightningCLI over :class:`TreeGRPOModule` and :class:`PromptDataModule`, with three project rules:

- Everything a run writes lives under ``--trainer.default_root_dir``: TensorBoard events in
  ``tensorboard/`` (one fixed folder, so a resumed run appends to the same curves) and checkpoints
  in ``checkpoints/`` with ``last.ckpt`` always kept. Lightning's default puts "last" under a new
  logger version, so ``--ckpt_path last`` silently starts over; here the folder is fixed.
- ``--ckpt_path last`` resumes from ``<root>/checkpoints/last.ckpt`` and says so, or fails with a
  clear message when there is none.
- A user error (an unknown option, a value of the wrong type, a missing file, an impossible tree)
  prints one line naming the option and the fix, and exits with status 2; set
  ``LIT_TREEGRPO_DEBUG=1`` for the traceback. Everything that needs no weights is checked before
  any model loads (:meth:`TreeGRPOCLI.before_instantiate_classes`). A run stopped by a numerical
  fault (a NaN reward, loss or gradient; too many consecutive skips) also ends in one line, with
  status 1.
- Checkpoints are written atomically (:class:`~lit_treegrpo.checkpoint.AtomicCheckpointIO`), and a
  truncated or corrupt ``--ckpt_path`` is reported before any model loads.
- SIGTERM or a first Ctrl-C stops a fit after the training step in flight and writes
  ``last.ckpt`` (:class:`~lit_treegrpo.callbacks.CheckpointOnInterrupt`); the process then exits
  with status 0. ``validate`` / ``test`` / ``predict`` never write a checkpoint: interrupted, they
  stop after the batch in flight and exit with status 143 (SIGTERM) or 1 (Ctrl-C).
- A fit never destroys an earlier one (:mod:`lit_treegrpo.run_folder`): a folder that holds a run
  is resumed (``--ckpt_path last``) or explicitly started over (``--overwrite true``), a second live
  fit in the same folder is refused, and each fit's config is saved beside, never over, the
  earlier ones; other commands save no config.
- One rule for errors: whatever comes from the configuration, the files or the environment (a
  parse or YAML error, a bad value, any ``OSError``: a missing or unreadable file, a full disk, a
  folder that cannot be created; a checkpoint of any kind that cannot be loaded; Lightning's
  ``MisconfigurationException``; a model not in the hub cache while offline) ends in one line and
  status 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import os
import re
import signal
import sys
import warnings
from pathlib import Path
from typing import Any, NoReturn

import yaml
from jsonargparse import Namespace, set_parsing_settings
from lightning.fabric.plugins.io import CheckpointIO
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from .callbacks import CheckpointOnInterrupt
from .checkpoint import AtomicCheckpointIO, check_checkpoint, check_lightning_checkpoint
from .core.loss import ClippedPolicyLoss
from .core.pruning import PruningConfig
from .core.spec import TreeSpec
from .data import PromptDataModule
from .errors import explain_os_error, first_line
from .faults import FaultLimitError
from .module import TreeGRPOModule
from .rewards import NonFiniteRewardError, check_reward_names
from .run_folder import (
    RunConfigRecord,
    RunFolderError,
    RunLock,
    RunTensorBoardLogger,
    check_new_run,
    clear_run,
    launch_rank,
)
from .settings import AdvantageSettings, FaultPolicy, MemoryGuard, check_settings

DEFAULT_ROOT = "runs/lit_treegrpo"
DEBUG_ENV = "LIT_TREEGRPO_DEBUG"


class UserError(Exception):
    """A mistake in the command line or config: reported in one line, without a traceback."""


class CommandInterrupted(Exception):
    """``validate`` / ``test`` / ``predict`` stopped by SIGTERM before they finished."""


class OneLineParser(LightningArgumentParser):
    """Reports a parse error as one :class:`UserError` line (the option, what is wrong, a
    did-you-mean) instead of jsonargparse's usage block. Parsers that jsonargparse builds with
    ``exit_on_error=False`` for its own nested checks keep raising ``ArgumentError`` as before."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        raise UserError(explain_parse_error(message, parser))


def _options(parser: Any) -> list[str]:
    """Every ``--key`` the parser (and its subcommands) accepts, without ``.help`` entries."""
    found: list[str] = []
    for action in parser._actions:
        found += [s for s in action.option_strings if s.startswith("--") and not s.endswith(".help")]
        for sub in (getattr(action, "choices", None) or {}).values():
            if isinstance(sub, LightningArgumentParser):
                found += _options(sub)
    return found


def _did_you_mean(word: str, candidates: list[str], *, list_siblings: bool = False) -> str:
    """``"; did you mean --model.tree.branching?"``: the closest candidate with the same parent
    (``--model.tree``), compared by its last component; with ``list_siblings``, when none is close,
    the valid names under that parent."""
    parent, _, leaf = word.rpartition(".")
    siblings = {c.rpartition(".")[2]: c for c in candidates if c.rpartition(".")[0] == parent}
    if not siblings:
        close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.8)
        return f"; did you mean {close[0]}?" if close else ""
    close = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {siblings[close[0]]}?"
    if list_siblings and parent:
        return f"; {parent} takes {', '.join(sorted(siblings))}"
    return ""


def _init_parameters(class_path: str) -> list[str]:
    """Keyword parameters a class accepts, following ``**kwargs`` up its bases."""
    module, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    found: list[str] = []
    for base in cls.__mro__:
        if "__init__" not in vars(base):
            continue
        params = inspect.signature(base.__init__).parameters.values()
        found += [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return found


def _type_name(text: str) -> str:
    """``<class 'int'>`` -> ``int``; ``typing.Literal['a', 'b']`` -> ``one of 'a', 'b'``."""
    text = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", text.strip()).replace("NoneType", "null")
    literal = re.fullmatch(r"typing\.Literal\[(.*)\]", text)
    return f"one of {literal.group(1)}" if literal else text.replace("typing.", "")


def explain_parse_error(message: str, parser: Any) -> str:
    """jsonargparse's multi-line parse error -> one line naming the option and the fix."""
    prog = parser.prog.replace(" [options]", "")
    see = f"`{prog} --help` lists every option"
    options = _options(parser)
    text = message.strip()
    unknown = re.match(r"unrecognized arguments: (.*)", text)
    if unknown:
        given = [a.split("=", 1)[0] for a in unknown.group(1).split() if a.startswith("--")]
        if given:
            return f"{given[0]}: no such option{_did_you_mean(given[0], options, list_siblings=True)} ({see})"
        return f"unexpected argument(s) {unknown.group(1)!r}; options start with -- ({see})"
    key = re.search(r"does not accept option '([\w.]+)'", text) or re.search(r"Option '([\w.]+)' is not accepted before", text)
    if key:
        option = f"--{key.group(1)}"
        hint = _did_you_mean(option, options, list_siblings=True)
        return f"{option} (a command-line option or a config key): no such option{hint} ({see})"
    keyed = re.match(r'Parser key "([\w.]+)":\s*(.*)', text, flags=re.S)
    if not keyed:
        return f"{' '.join(text.split())} ({see})"
    option, detail = f"--{keyed.group(1)}", keyed.group(2)
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    class_option = re.search(r"Problem with given class_path '([\w.]+)':\s*Option '(\w+)' is not accepted", detail)
    if class_option:
        class_path, name = class_option.groups()
        hint = _did_you_mean(name, _init_parameters(class_path))
        return f"{option}.init_args.{name}: {class_path} takes no option {name!r}{hint} ({see})"
    nested = re.search(r'Parser key "([\w.]+)":\s*(.*)', detail, flags=re.S)
    if nested:  # a bad init_args value of a class_path option (an adapter, an optimizer ...)
        return explain_parse_error(f'Parser key "{keyed.group(1)}.init_args.{nested.group(1)}": {nested.group(2)}', parser)
    class_problem = re.search(r"Problem with given class_path '([\w.]+)':\s*(.*)", detail, flags=re.S)
    if class_problem:
        reason = class_problem.group(2).strip().splitlines()[0].strip()
        return f"{option}: cannot use class_path '{class_problem.group(1)}': {reason}; fix the class path ({see})"
    expected = re.match(r"Expected a (.+?)\. Got value: (.*)", lines[0]) if lines else None
    if expected:
        wanted, got = _type_name(expected.group(1)), expected.group(2)
        literal = re.findall(r"'([^']*)'", wanted) if wanted.startswith("one of") else []
        return f"{option}: expected {wanted}, got {got!r}{_did_you_mean(got, literal)}; fix the value ({see})"
    subtypes = re.search(r"Subtypes: \[(.*)\]", detail)
    value = re.search(r"Given value: (.*)", detail)
    if subtypes and value:
        wanted = ", ".join(_type_name(t) for t in re.split(r",\s*(?![^\[]*\])", subtypes.group(1)))
        given = re.sub(r"\. Got value: .*", "", value.group(1)).strip()
        return f"{option}: {given!r} is none of {wanted}; fix the value ({see})"
    return f"{option}: {' '.join(lines)} ({see})"


def _plain(value: Any) -> Any:
    """A parsed Namespace as plain dicts, without jsonargparse's bookkeeping keys (``__path__`` of
    a section read from its own file)."""
    if isinstance(value, Namespace):
        value = value.as_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if not k.startswith("__")}
    return value


def _build(option: str, make: Any) -> Any:
    """``make()``, its ``ValueError`` prefixed by the option it concerns."""
    try:
        return make()
    except (ValueError, TypeError) as err:
        raise UserError(f"{option}: {err}") from err


def _data_parallel_world(trainer: Any) -> int | None:
    """Data-parallel processes from the trainer options, when they say it plainly (``devices``
    an int, a list or a ``"0,1"`` string); ``None`` for ``auto`` / ``-1`` and for strategies that
    split devices between tensor and data parallelism."""
    strategy = trainer.get("strategy")
    strategy_name = strategy if isinstance(strategy, str) else getattr(strategy, "class_path", "") or ""
    if "ModelParallel" in str(strategy_name) or type(strategy).__name__ == "ModelParallelStrategy":
        return None
    devices = trainer.get("devices", "auto")
    if isinstance(devices, str):
        if devices.strip() in ("auto", "-1"):
            return None
        parts = [d for d in devices.split(",") if d.strip()]
        count = int(parts[0]) if len(parts) == 1 and devices.strip().lstrip("-").isdigit() else len(parts)
    elif isinstance(devices, int):
        count = devices
    elif isinstance(devices, (list, tuple)):
        count = len(devices)
    else:
        return None
    if count < 1:
        return None
    return count * int(trainer.get("num_nodes") or 1)


def _nan_options(value: Any, option: str) -> list[str]:
    """The options under ``value`` (a parsed section) whose value is a float NaN."""
    if isinstance(value, float):
        return [option] if math.isnan(value) else []
    if isinstance(value, Namespace):
        value = value.as_dict()
    if isinstance(value, dict):
        return [found for k, v in value.items() if not str(k).startswith("__") for found in _nan_options(v, f"{option}.{k}")]
    if isinstance(value, (list, tuple)):
        return [found for i, v in enumerate(value) for found in _nan_options(v, f"{option}[{i}]")]
    return []


def check_config(config: Any) -> None:
    """Everything the run's options say that can be checked without weights: no NaN anywhere, the
    tree, advantage, loss, pruning, fault and memory settings, the reward names and their extras,
    the prompts, the batch sizes against the world size. Raises :class:`UserError` /
    ``ValueError`` (one line)."""
    # YAML's .nan parses as a float, and would surface (if at all) as a NaN reward or a message
    # from deep inside the optimizer that names no option
    nans = [found for section in ("model", "data", "trainer") for found in _nan_options(config.get(section), f"--{section}")]
    if nans:
        raise UserError(f"{nans[0]}: nan is not a value any option accepts; give a number")
    model = config["model"]
    try:
        check_reward_names(model.get("reward"), _plain(model.get("reward_kwargs")) or {})
    except (ValueError, ImportError) as err:
        raise UserError(f"--model.reward: {err}") from err
    tree = _build("--model.tree", lambda: TreeSpec.from_dict(_plain(model["tree"])))
    _build("--model.advantage", lambda: AdvantageSettings(**_plain(model["advantage"])))
    _build("--model.pruning", lambda: PruningConfig(**_plain(model["pruning"])))
    _build("--model.faults", lambda: FaultPolicy(**_plain(model["faults"])))
    _build("--model.memory_guard", lambda: MemoryGuard(**_plain(model["memory_guard"])))
    loss = _build("--model.loss", lambda: _loss(model.get("loss")))
    adapter = model.get("adapter")
    adapter_args = _plain(adapter.get("init_args")) if isinstance(adapter, Namespace) else None
    adapter_args = adapter_args if isinstance(adapter_args, dict) else {}
    try:
        check_settings(
            tree,
            minibatches=model["minibatches"],
            accumulate=model["accumulate"],
            inner_epochs=model["inner_epochs"],
            grad_clip=model["grad_clip"],
            val_samples=model["val_samples"],
            edges_per_update=model["edges_per_update"],
            adapter_num_steps=adapter_args.get("num_steps"),
            prefix="--model.",
        )
    except ValueError as err:
        raise UserError(str(err)) from err
    if loss is not None and loss.kl_beta > 0 and "lora" in adapter_args and adapter_args["lora"] is None:
        raise UserError(
            "--model.loss.kl_beta > 0 needs the adapter's lora (the KL reference is the model with "
            "LoRA disabled); set --model.adapter.init_args.lora or --model.loss.kl_beta 0"
        )
    data = _plain(config["data"])
    with warnings.catch_warnings():  # e.g. duplicate prompts: warned when the real module is built
        warnings.simplefilter("ignore")
        datamodule = PromptDataModule(**data)
    world = _data_parallel_world(config["trainer"])
    if world is not None:
        datamodule.per_rank_batch_size(world)


def _loss(spec: Any) -> ClippedPolicyLoss | None:
    """The loss of a ``class_path`` / ``init_args`` spec, built (it holds no weights), or None."""
    if spec is None:
        return ClippedPolicyLoss()
    if not isinstance(spec, Namespace) or "class_path" not in spec:
        return None
    module, _, name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return cls(**(_plain(spec.get("init_args")) or {}))


class TreeGRPOCLI(LightningCLI):
    """LightningCLI with fixed run folders and honest resume (see the module docstring)."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        set_parsing_settings(docstring_parse_attribute_docstrings=True)
        self._verified: str | None = None  # the --ckpt_path file already checked
        self._ckpt_path: str | None = None  # --ckpt_path resolved and checked
        self._lock: RunLock | None = None  # held by a fit (launch rank 0) while it runs
        self._clear_before_fit: Path | None = None  # --overwrite true: the earlier run to delete
        try:
            super().__init__(
                TreeGRPOModule,
                PromptDataModule,
                args=args,
                run=run,
                parser_class=OneLineParser,
                save_config_callback=RunConfigRecord,
                parser_kwargs={
                    "prog": "python -m lit_treegrpo",
                    "description": "Tree-structured GRPO for diffusion and flow models (TreeGRPO, BranchGRPO).",
                    "default_env": False,
                },
            )
        finally:
            if self._lock is not None:
                self._lock.release()

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        # an abbreviated option (--trainer.max_step) is a typo to report, not a guess to expand
        kwargs.setdefault("allow_abbrev", False)
        return super().init_parser(**kwargs)

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand == "fit":
            parser.add_argument(
                "--overwrite",
                type=bool,
                default=False,
                help=(
                    "Start a new run in a --trainer.default_root_dir that already holds one "
                    "(checkpoints/last.ckpt): its checkpoints/, tensorboard/ and samples/ are deleted once "
                    "the new run's model has loaded. Without it such a fit is refused; --ckpt_path last "
                    "resumes the run instead."
                ),
            )
        return parser

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # jsonargparse reports a YAML syntax error in a --config file as coming from "<unicode
        # string>"; read each one first, so the message names the file
        argv = sys.argv[1:] if args is None else args
        if isinstance(argv, (list, tuple)):
            for path in _config_files(argv):
                check_yaml_file(path)
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        # Lightning's hook reads the hyper-parameters of an explicit --ckpt_path file with
        # torch.load before anything else: check the file first, so a corrupt one, or one that is
        # no Lightning checkpoint, is reported in one line instead of as a traceback
        subcommand = self.config.get("subcommand")
        given = self.config[subcommand].get("ckpt_path") if subcommand else None
        if given not in (None, "last", "best", "hpc", "registry") and Path(given).is_file():
            self._verify_checkpoint(Path(given), "--ckpt_path")
        super()._parse_ckpt_path()

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.set_defaults({"trainer.default_root_dir": DEFAULT_ROOT})

    def before_instantiate_classes(self) -> None:
        """Checks that need no model, made before any weights load (minutes for SD3.5); then a
        fit takes its run folder (:meth:`_take_run_folder`)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        check_config(config)
        # the processes a DDP launcher starts beside rank 0 find the folder already taken by it
        owner = self.subcommand == "fit" and launch_rank() == 0
        root = Path(config["trainer"].get("default_root_dir") or DEFAULT_ROOT)
        if owner:
            try:
                check_new_run(root, config.get("ckpt_path"), config.get("overwrite", False))
            except RunFolderError as err:
                raise UserError(str(err)) from err
        self._ckpt_path = self._checked_ckpt_path(config)
        if owner:
            self._take_run_folder(root, overwrite=config.get("overwrite", False))

    def _take_run_folder(self, root: Path, *, overwrite: bool) -> None:
        """Lock the folder for this fit (refused while another fit holds it); with
        ``--overwrite true`` its earlier run is deleted in :meth:`before_fit`."""
        lock = RunLock(root)
        try:
            lock.acquire()
        except RunFolderError as err:
            raise UserError(str(err)) from err
        except OSError as err:
            raise UserError(f"--trainer.default_root_dir: cannot create or lock {root}: {explain_os_error(err)}") from err
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
            raise UserError("--ckpt_path: empty; give a checkpoint file, or last, or leave the option out to start a new run")
        root = Path(config["trainer"].get("default_root_dir") or DEFAULT_ROOT)
        path = root / "checkpoints" / "last.ckpt" if given == "last" else Path(given)
        if not path.exists():
            if given == "last":
                raise UserError(
                    f"--ckpt_path last: no checkpoint at {path}; check --trainer.default_root_dir, or "
                    f"drop --ckpt_path to start a new run"
                )
            raise UserError(f"--ckpt_path: no checkpoint at {path}; check the path, or drop --ckpt_path to start over")
        if path.is_dir():
            # this project's checkpoints are single files (sharded ones are refused when written)
            inside = sorted(path.glob("*.ckpt")) or sorted(path.glob("checkpoints/*.ckpt"))
            hint = f" such as {inside[0]}" if inside else ""
            raise UserError(f"--ckpt_path: {path} is a folder; give a checkpoint file{hint}, or last")
        if self._verified != str(path):  # not already read by _parse_ckpt_path
            self._verify_checkpoint(path, f"--ckpt_path {given}" if given == "last" else "--ckpt_path")
        return str(path)

    def _verify_checkpoint(self, path: Path, option: str) -> None:
        check_checkpoint(path, option=option)
        check_lightning_checkpoint(path, option=option)
        self._verified = str(path)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
        """Fixed run folders: checkpoints in <root>/checkpoints (last.ckpt kept), TensorBoard in
        <root>/tensorboard, whatever logger version Lightning would otherwise open; atomic
        checkpoint writes unless the trainer is given its own CheckpointIO."""
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
            # no placeholder hp_metric: it would open the event file before anything is measured
            config["logger"] = RunTensorBoardLogger(
                save_dir=str(root), name="tensorboard", version="", default_hp_metric=False
            )
        plugins = config.get("plugins")
        plugins = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            config["plugins"] = [*plugins, AtomicCheckpointIO()]
        return super()._instantiate_trainer(config, callbacks)

    def _run_subcommand(self, subcommand: str) -> None:
        """Run it; a SIGTERM during validate / test / predict ends in :class:`CommandInterrupted`
        (nothing was saved: :class:`CheckpointOnInterrupt` writes only during a fit)."""
        try:
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

    def before_fit(self) -> None:
        # --overwrite true deletes the earlier run only now that this one's model and trainer are
        # built: a fit that fails to load keeps the earlier run
        if self._clear_before_fit is not None:
            clear_run(self._clear_before_fit)
        self._resolve_ckpt_path()

    def before_validate(self) -> None:
        self._resolve_ckpt_path()

    def before_test(self) -> None:
        self._resolve_ckpt_path()

    def before_predict(self) -> None:
        self._resolve_ckpt_path()

    def _resolve_ckpt_path(self) -> None:
        """Hand the Trainer the checkpoint checked in :meth:`_checked_ckpt_path`."""
        if self.config.get(f"{self.subcommand}.ckpt_path") == "last":
            rank_zero_info(f"Resuming from {self._ckpt_path}")
        self.config_init[self.subcommand]["ckpt_path"] = self._ckpt_path  # what the Trainer receives


def _config_files(argv: list[str] | tuple[str, ...]) -> list[str]:
    """The files given to ``--config`` / ``-c`` in a command line."""
    files = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            files.append(str(argv[i + 1]))
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def check_yaml_file(path: str) -> None:
    """Raise :class:`UserError` naming ``--config path`` when the file is not valid YAML."""
    if not Path(path).is_file():
        return  # jsonargparse's own error names the missing file
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"--config {path}: not UTF-8 text ({err.reason} at byte {err.start}); re-save it as UTF-8") from err
    except OSError as err:
        raise UserError(f"--config {path}: cannot read it: {explain_os_error(err)}") from err
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or first_line(err)
        raise UserError(f"--config {path}: not valid YAML: {problem}{where}; fix the file") from err


# numerical faults that stop a run (a NaN reward, loss or gradient under faults.nonfinite=error,
# too many consecutive skips under skip): explained in one line, exit status 1
RUN_FAULTS = (NonFiniteRewardError, FloatingPointError, FaultLimitError)
# what the configuration, the files or the environment got wrong: one line, exit status 2. A
# ValueError is the project's convention for a bad value (named in its message); every OSError is
# about a file, a folder or the network; ImportError a missing package
USER_ERRORS = (UserError, ValueError, OSError, ImportError, MisconfigurationException)


def exit_status(err: BaseException) -> int | None:
    """The status ``main`` exits with after printing ``err`` in one line; None: a bug, which keeps
    its traceback."""
    if isinstance(err, RUN_FAULTS):
        return 1
    if isinstance(err, CommandInterrupted):
        return 128 + signal.SIGTERM
    if isinstance(err, USER_ERRORS):
        return 2
    return None


def one_line(err: BaseException) -> str:
    """The message ``main`` prints for ``err``."""
    if isinstance(err, MisconfigurationException):
        return f"the trainer's settings (--trainer.*): {first_line(err)}"
    if isinstance(err, OSError):
        return explain_os_error(err)
    return first_line(err)


def quiet_known_warnings() -> None:
    """Silence, for the whole process, the warnings that say nothing a user can act on. Both
    Lightning warnings are by design here: adapters keep every submodule in eval mode (no dropout
    in the policy), and the prompt stream is a pure function of the step, with nothing for loader
    workers to do. The third is Lightning's own use of a torch API it has not caught up with."""
    warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode at the start of training")
    warnings.filterwarnings("ignore", message=r".*does not have many workers which may be a bottleneck")
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")


def main(args: list[str] | None = None) -> None:
    """Console entry: run the CLI; an error from the configuration, files or environment becomes
    one line on stderr and exit status 2, a run stopped by a numerical fault one line and status 1,
    validate / test / predict stopped by SIGTERM one line and status 143."""
    quiet_known_warnings()
    try:
        TreeGRPOCLI(args=args)
    except (*RUN_FAULTS, CommandInterrupted, *USER_ERRORS) as err:
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"error: {one_line(err)}  (set {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        sys.exit(exit_status(err))
