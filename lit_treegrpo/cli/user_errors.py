"""How the command line reports what went wrong: in one line naming the option and the fix, with
an exit status (:func:`exit_status`), never with a usage block or, for a user error, a traceback."""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import re
import signal
from collections.abc import Iterator
from typing import Any, NoReturn

import yaml
from jsonargparse import DefaultHelpFormatter
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningArgumentParser

from ..artifacts.run_folder import RunTensorBoardLogger
from ..common.config_yaml import ConfigYAMLError, checked_loader, load_yaml, read_yaml_file
from ..common.errors import WRITE_ERRNOS, explain_os_error, first_line, write_error
from ..common.reads import regular_file
from ..rewards import NonFiniteRewardError
from ..training.faults import FaultLimitError


class UserError(Exception):
    """A mistake in the command line or config: reported in one line, without a traceback."""


class CommandInterrupted(Exception):
    """``validate`` / ``test`` / ``predict`` stopped by SIGTERM before they finished."""


class OneLineParser(LightningArgumentParser):
    """Reports a parse error as one :class:`UserError` line (the option, what is wrong, a did-you-mean) instead of
    jsonargparse's usage block."""

    #: the ``--config`` files of the command line being parsed, as given and as absolute paths (a
    #: parse runs inside the config file's folder), so that an error can name the file that set an
    #: option (set by the CLI before it parses)
    config_sources: tuple[tuple[str, str], ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", CompactHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        raise UserError(explain_parse_error(message, parser, self.config_sources))

    def format_help(self) -> str:
        """``--help`` of a command that has options: a one-line usage, and each option's and group's
        first sentence with its type and default (``--print_config`` shows a whole configuration)."""
        options = [a for a in self._actions if a.option_strings]
        if len(options) < 12:  # the top-level parser: its usage lists the subcommands
            return super().format_help()
        saved = (self.usage, [(a, a.help) for a in self._actions], [(g, g.description) for g in self._action_groups])
        self.usage = f"{self.prog} [-h] [-c CONFIG] [--print_config] [--SECTION.OPTION VALUE ...]"
        for action in self._actions:
            action.help = first_sentence(action.help)
        for group in self._action_groups:
            group.description = first_sentence(group.description)
        try:
            return super().format_help()
        finally:
            self.usage = saved[0]
            for action, text in saved[1]:
                action.help = text
            for group, text in saved[2]:
                group.description = text


class CompactHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help without the list of every known subclass of a class option (its
    ``--OPTION.help`` shows a subclass's options)."""

    def _get_help_string(self, action: Any) -> str:
        return re.sub(r", known subclasses: [^()]*\)$", ")", super()._get_help_string(action))


def first_sentence(text: Any) -> Any:
    """The first sentence of a help text (up to a full stop before a capital or a backquote)."""
    if not isinstance(text, str):
        return text
    flat = " ".join(text.split())
    match = re.search(r"(?<!\be\.g)(?<!\bi\.e)\.\s+(?=[A-Z`\\(])", flat)
    return flat[: match.start() + 1] if match else flat


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
    """``"; did you mean --model.tree.branching?"``: the closest candidate with the same parent (``--model.tree``),
    compared by its last component; with ``list_siblings``, when none is close, the valid names under that parent."""
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


#: options that moved, old -> new: a config written for an earlier version gets told where they went
MOVED_OPTIONS = {
    "--model.tree.max_batch": "--model.rollout.max_batch",
    "--model.tree.max_leaves": "--model.rollout.max_leaves",
    "--model.shared_noise": "--model.tree.shared_noise",
}
#: options (with everything under them) that became another object's, old -> where they went
OWNED_ELSEWHERE = {
    "--model.pruning": (
        "the PruningSchedule callback owns the pruning: give `trainer.callbacks+: [{class_path: "
        "lit_treegrpo.callbacks.PruningSchedule, init_args: {width: parent_top1}}]` with the same options "
        "(a fixed depth window [lo, hi) is depth_start lo, depth_window hi - lo, depth_shift 0; fixed steps are steps)"
    ),
}


#: Lightning's own options that this CLI leaves out, -> the option that does it here
NOT_HERE = {
    "--optimizer": (
        "the module builds its optimizer from --model.optimizer (e.g. --model.optimizer torch.optim.SGD "
        "--model.optimizer.init_args.lr 0.01); give it there"
    ),
    "--lr_scheduler": (
        "the module builds its learning-rate schedule from --model.lr_scheduler (e.g. --model.lr_scheduler "
        "torch.optim.lr_scheduler.StepLR --model.lr_scheduler.init_args.step_size 100); give it there"
    ),
}


#: options removed as no configuration set them, old -> what replaced them
REMOVED_OPTIONS = {
    "--model.val_seed": "validation, test and predict sample from seeds 1234, 1235, ... (--model.val_samples of them)",
    "--model.health": "the on-policy check's tolerance follows the denoiser's dtype",
    "--model.reuse_rollout_forward": "the training pass always recomputes the stochastic steps' forwards",
    "--model.faults.max_consecutive_skips": "a skip policy stops after 3 steps in a row without an update",
    "--model.memory_guard.available_gb": "the guard measures the memory (--model.memory_guard.fraction sets the share used)",
    "--model.memory_guard.max_train_parents": "the guard sizes the training forwards from the memory it measures",
    "--model.prompt_cache.encode_batch": "every text-encoder call takes 8 prompts",
    "--model.prompt_cache.on_cpu": "cached rows stay on the model's device",
    "--model.rollout.max_leaves": "the memory guard refuses a tree that cannot fit",
}


def _no_such_option(option: str, options: list[str], see: str, what: str = "") -> str:
    for lightning, where in NOT_HERE.items():
        if option == lightning or option.startswith(lightning + "."):
            return f"{option}{what}: not an option of this command line; {where}"
    if option in MOVED_OPTIONS:
        return f"{option}{what}: this option moved to {MOVED_OPTIONS[option]}; rename it there ({see})"
    for old, where in {**OWNED_ELSEWHERE, **REMOVED_OPTIONS}.items():
        if option == old or option.startswith(old + "."):
            return f"{option}{what}: no longer an option; {where}"
    return f"{option}{what}: no such option{_did_you_mean(option, options, list_siblings=True)} ({see})"


def _setting_file(files: tuple[tuple[str, str], ...], keys: list[str]) -> str | None:
    """The last of ``files`` (YAML configs, as given and absolute) that sets the nested key
    ``keys``, as given, or None."""
    found = None
    for given, path in files:
        try:
            value: Any = read_yaml_file(path, f"--config {given}")
        except (ValueError, OSError):
            continue  # reported on its own by check_yaml_file
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            found = given
    return found


def _option_elsewhere(class_path: str, name: str, option: str, files: tuple[tuple[str, str], ...]) -> str | None:
    """Why an adapter does not take ``name`` when other adapter families do (a method preset for
    flow-matching models on SD 1.5, say): which adapters take it, and the config file that set it."""
    from ..models import DiffusionAdapter, FluxAdapter, QwenImageAdapter, SD3Adapter, SD15Adapter, WanAdapter
    from ..models.flow import FlowMatchingAdapter
    from ..models.shapes import ShapesAdapter

    module, _, cls_name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module), cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, DiffusionAdapter)):
        return None
    families = (SD3Adapter, FluxAdapter, QwenImageAdapter, WanAdapter, ShapesAdapter, SD15Adapter)
    takers = [f for f in families if name in _init_parameters(f"{f.__module__}.{f.__name__}")]
    if not takers:
        return None
    flow = all(issubclass(f, FlowMatchingAdapter) for f in takers) and not issubclass(cls, FlowMatchingAdapter)
    kind = "a flow-matching adapter" if flow else "another adapter"
    source = _setting_file(files, [*option.removeprefix("--").split("."), "init_args", name])
    who = f"{source} sets it, and needs" if source else "the configuration that sets it needs"
    return (
        f"{option}.init_args.{name}: {cls_name} takes no option {name!r}; {who} {kind} (one that takes it: "
        f"{', '.join(f.__name__ for f in takers)}): give one as --model.adapter, or leave {name} out"
    )


def explain_parse_error(message: str, parser: Any, files: tuple[tuple[str, str], ...] = ()) -> str:
    """jsonargparse's multi-line parse error -> one line naming the option and the fix; ``files``
    (the ``--config`` files) let it name the file that set an option."""
    prog = parser.prog.replace(" [options]", "")
    see = f"`{prog} --help` lists every option"
    options = _options(parser)
    text = message.strip()
    unknown = re.match(r"unrecognized arguments: (.*)", text)
    if unknown:
        given = [a.split("=", 1)[0] for a in unknown.group(1).split() if a.startswith("--")]
        if given:
            return _no_such_option(given[0], options, see)
        return f"unexpected argument(s) {unknown.group(1)!r}; options start with -- ({see})"
    missing = re.match(r"argument (--[\w.]+): expected one argument", text)
    if missing:  # argparse takes a value such as -1 or -inf for the next option
        return (
            f"{missing.group(1)}: expected a value; a value that starts with '-' (-1, -inf) is given after '=' "
            f"(--option=-1) ({see})"
        )
    key = re.search(r"does not accept option '([\w.]+)'", text) or re.search(
        r"Option '([\w.]+)' is not accepted before", text
    )
    if key:
        return _no_such_option(f"--{key.group(1)}", options, see, " (a command-line option or a config key)")
    keyed = re.match(r'Parser key "([\w.]+)":\s*(.*)', text, flags=re.S)
    if not keyed:
        return f"{' '.join(text.split())} ({see})"
    option, detail = f"--{keyed.group(1)}", keyed.group(2)
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    class_option = re.search(r"Problem with given class_path '([\w.]+)':\s*Option '(\w+)' is not accepted", detail)
    if class_option:
        class_path, name = class_option.groups()
        hint = _did_you_mean(name, _init_parameters(class_path))
        elsewhere = None if hint else _option_elsewhere(class_path, name, option, files)
        if elsewhere is not None:
            return f"{elsewhere} ({see})"
        return f"{option}.init_args.{name}: {class_path} takes no option {name!r}{hint} ({see})"
    nested = re.search(r'Parser key "([\w.]+)":\s*(.*)', detail, flags=re.S)
    if nested:  # a bad init_args value of a class_path option (an adapter, an optimizer ...)
        return explain_parse_error(
            f'Parser key "{keyed.group(1)}.init_args.{nested.group(1)}": {nested.group(2)}', parser, files
        )
    class_problem = re.search(r"Problem with given class_path '([\w.]+)':\s*(.*)", detail, flags=re.S)
    if class_problem:
        reason = class_problem.group(2).strip().splitlines()[0].strip()
        return f"{option}: cannot use class_path '{class_problem.group(1)}': {reason}; fix the class path ({see})"
    expected = re.match(r"Expected a (.+?)\. Got value: (.*)", lines[0]) if lines else None
    if expected:
        # a class_path's init_args value: "nan. Got value: Namespace(class_path=...)" after the value
        wanted, got = _type_name(expected.group(1)), re.sub(r"\. Got value: Namespace\(.*", "", expected.group(2))
        literal = re.findall(r"'([^']*)'", wanted) if wanted.startswith("one of") else []
        return f"{option}: expected {wanted}, got {got!r}{_did_you_mean(got, literal)}; fix the value ({see})"
    subtypes = re.search(r"Subtypes: \[(.*)\]", detail)
    value = re.search(r"Given value: (.*)", detail)
    if subtypes and value:
        wanted = ", ".join(_type_name(t) for t in re.split(r",\s*(?![^\[]*\])", subtypes.group(1)))
        given = re.sub(r"\. Got value: .*", "", value.group(1)).strip()
        return f"{option}: {given!r} is none of {wanted}; fix the value ({see})"
    return f"{option}: {' '.join(lines)} ({see})"


def config_files(argv: list[str] | tuple[str, ...]) -> list[str]:
    """The files given to ``--config`` / ``-c`` in a command line."""
    files = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            files.append(str(argv[i + 1]))
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def check_yaml_file(path: str) -> None:
    """Raise :class:`UserError` naming ``--config path`` when the file is larger than
    :data:`~lit_treegrpo.common.config_yaml.MAX_CONFIG_BYTES`, not UTF-8, not valid YAML, gives a
    key twice or expands beyond the alias bound (:mod:`lit_treegrpo.common.config_yaml`), or is a FIFO, device,
    socket or folder (told by its status: jsonargparse would open it, and wait for ever on a FIFO)."""
    try:
        fix = "give a YAML file, or the name of a shipped config (--config shapes)"
        if not regular_file(path, "a config file", fix, option="--config"):
            return  # jsonargparse's own error names the missing file
        loaded = read_yaml_file(path, f"--config {path}")
        if not isinstance(loaded, dict):  # jsonargparse said only "Unexpected config:"
            what = "empty" if loaded is None else f"a YAML {type(loaded).__name__}, not a mapping of options"
            raise UserError(f"--config {path}: the file is {what}; give a mapping such as `trainer: {{max_steps: 10}}`")
    except ValueError as err:  # too large, not UTF-8, not valid or refused YAML: named already
        raise UserError(str(err)) from err
    except OSError as err:
        raise UserError(f"--config {path}: cannot read it: {explain_os_error(err)}") from err


def check_yaml_values(argv: list[str] | tuple[str, ...]) -> None:
    """Refuse a command-line value written in YAML (``--model.reward_kwargs '{a: 1, a: 2}'``) that gives a key twice or
    expands beyond the alias bound, naming its option."""
    option = None
    loader = checked_loader()
    for arg in argv:
        arg = str(arg)
        if arg.startswith("--"):
            option, _, value = arg.partition("=")
            if not value:
                continue
        else:
            value = arg
        if option in (None, "--config") or not any(c in value for c in ":[{&*"):
            continue
        try:
            load_yaml(value, loader)
        except ConfigYAMLError as err:
            raise UserError(f"{option}: {err}") from err
        except yaml.YAMLError:
            continue  # not YAML: a plain text value


@contextlib.contextmanager
def write_failures_said(subcommand: str, trainer: Any) -> Iterator[None]:
    """Around a command's run, writes the disk refuses said in one line naming the path: ``validate`` / ``test``
    print their results after Lightning has logged them, so their logger keeps a failed write (a full disk, a
    read-only folder) and it is raised here once the results are out, not in their place; a write refused without
    naming its file (a full disk met by a PNG's ``write``: the system names no path then) names the run folder,
    where the command writes."""
    loggers = [logger for logger in trainer.loggers if isinstance(logger, RunTensorBoardLogger)]
    for logger in loggers:
        logger.defer_write_failures = subcommand in ("validate", "test")
    try:
        yield
    except OSError as err:
        if err.filename is not None or err.strerror is None or err.errno not in WRITE_ERRNOS:
            raise  # it names its path, or says itself in one line
        where = f"{subcommand} could not write its outputs in {trainer.default_root_dir} (--trainer.default_root_dir)"
        raise write_error(f"{where}: {explain_os_error(err)}", err) from err
    for logger in loggers:
        logger.raise_write_failure(f" ({subcommand} printed its results above; they are not in TensorBoard)")


# numerical faults that stop a run (a NaN reward, loss or gradient under faults.nonfinite=error,
# too many consecutive skips under skip): explained in one line, exit status 1
RUN_FAULTS = (NonFiniteRewardError, FloatingPointError, FaultLimitError)
# what the configuration, the files or the environment got wrong: one line, exit status 2. A
# ValueError is the project's convention for a bad value (named in its message); every OSError is
# about a file, a folder or the network; ImportError a missing package
USER_ERRORS = (UserError, ValueError, OSError, ImportError, MisconfigurationException)


def exit_status(err: BaseException) -> int | None:
    """The status ``main`` exits with after printing ``err`` in one line; None: a bug, which keeps its traceback."""
    if isinstance(err, RUN_FAULTS):
        return 1
    if isinstance(err, CommandInterrupted):
        return 128 + signal.SIGTERM
    if isinstance(err, USER_ERRORS):
        return 2
    return None


def one_line(err: BaseException) -> str:
    """The message ``main`` prints for ``err``."""
    cause = err.__cause__
    if str(err).startswith("Does not validate against any of the Union subtypes") and isinstance(cause, ValueError):
        # jsonargparse building a class of a union (a callback of trainer.callbacks) wraps the
        # class's own message, which names the option
        where = "--trainer.callbacks: " if "lightning.pytorch.callbacks.callback.Callback" in str(err) else ""
        if "lit_treegrpo.models.lora.LoraSettings" in str(err):  # an adapter's `lora` (LoraSettings or null)
            where = "--model.adapter.init_args."  # its message names lora.<field>
        return f"{where}{one_line(cause)}"
    if isinstance(err, MisconfigurationException):
        return f"the trainer's settings (--trainer.*): {first_line(err)}"
    if isinstance(err, OSError):
        return explain_os_error(err)
    return first_line(err)
