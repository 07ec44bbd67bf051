"""What the option fuzzer (``test_fuzz_options.py``) is made of: the CLI's numeric and path options
read from its own parser, the values a careless or hostile user gives them, a workspace of user
files and special files around a run folder with a hash tree of it, and one bounded run of
``python -m lit_treegrpo fit``.

The option list is the parser's, not a hand list: every option of ``fit --config BASE`` whose type
(jsonargparse's ``_typehint``) takes an ``int`` or a ``float`` (``bool`` and ``Literal`` choices
excluded), or a list or tuple of them, or a path (``pathlib.Path`` in the type, a help text that
asks for a file or a folder, ``--config``); then the arguments of every class the configuration
builds (the adapter, the loss, the optimizer, the callbacks) and of the dataclasses inside them
(``lora``, ``tree.window``), typed by the same jsonargparse ``add_class_arguments`` the CLI uses,
``**kwargs`` followed up the bases.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import hashlib
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
import types
import typing
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

GiB = 1 << 30

# ------------------------------------------------------------------------ the option list


@dataclasses.dataclass(frozen=True)
class Option:
    """One option of the CLI: ``key`` as in the parsed configuration (``model.adapter.init_args.num_steps``,
    ``trainer.callbacks[1].init_args.scale``); ``kind`` is ``int``, ``float``, ``numbers`` (a list or
    tuple of numbers) or ``path``; ``class_name`` is the class whose argument it is, if any."""

    key: str
    kind: str
    class_name: str | None = None

    @property
    def in_a_list(self) -> bool:
        """An argument of one element of a list of classes (a callback): set through a config file,
        as no command-line option names one element."""
        return "[" in self.key

    def names(self) -> list[tuple[str, ...]]:
        """What an error line may call the option: each tuple's words must all appear. The full key,
        the key without ``init_args`` (jsonargparse accepts both on the command line; a top-level
        option only as ``--key``), the enclosing
        group of two or more parts with the argument's own name (``--model.tree: branching ...``),
        and, for a callback, its class or ``trainer.callbacks`` with the argument's name."""
        if "." not in self.key:  # a top-level option: --config, --ckpt_path, --max_iterations
            return [(f"--{self.key}",)]
        short = self.key.replace(".init_args.", ".")
        leaf = re.split(r"[.\]]", self.key)[-1]
        found: list[tuple[str, ...]] = [(self.key,), (short,)]
        parts = short.split(".")
        found += [(".".join(parts[:n]), leaf) for n in range(2, len(parts)) if not parts[n - 1].endswith("]")]
        if self.in_a_list:
            found += [(self.key.split("[")[0], leaf)] + ([(self.class_name, leaf)] if self.class_name else [])
        return list(dict.fromkeys(found))

    def named_in(self, line: str) -> bool:
        """Whether ``line`` names this option (see :meth:`names`); a key is matched as a whole (not
        ``--model.seed`` inside ``--model.seed_x``), an argument's own name as a word (``clip`` in
        ``--model.advantage: advantage.clip must be > 0``)."""

        def has(word: str) -> bool:
            before = r"(?<![\w.])" if "." in word else r"(?<!\w)"
            return re.search(rf"{before}{re.escape(word)}(?!\w)", line) is not None

        return any(all(has(word) for word in words) for words in self.names())


def _parts(hint: Any) -> list[Any]:
    """The members of a Union / Optional type (``X | None`` included), or the type itself."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [p for arg in typing.get_args(hint) for p in _parts(arg)]
    return [hint]


def _is_number(hint: Any) -> bool:
    return hint in (int, float)


def _is_path(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, (os.PathLike, Path))


def kind_of(hint: Any, help_text: str | None = None) -> str | None:
    """``int`` / ``float`` / ``numbers`` / ``path`` for a type the fuzzer draws values for, else None.
    A ``str`` whose help asks for a file or a folder is a path (``--data.prompts``: a file or the
    name of a built-in set)."""
    parts = [p for p in _parts(hint) if p is not type(None)]
    if any(_is_path(p) for p in parts):
        return "path"
    if float in parts:
        return "float"
    if int in parts:
        return "int"
    for part in parts:
        origin, args = typing.get_origin(part), [a for a in typing.get_args(part) if a is not Ellipsis]
        if origin in (list, tuple, Sequence) and args and all(any(_is_number(p) for p in _parts(a)) for a in args):
            return "numbers"
    first = (help_text or "").split(". ")[0]
    if str in parts and re.search(r"\b(file|folder|directory)\b", first):
        return "path"
    return None


def _dataclass_in(hint: Any) -> type | None:
    return next((p for p in _parts(hint) if dataclasses.is_dataclass(p) and isinstance(p, type)), None)


@functools.cache
def _class_arguments(class_path: str) -> dict[str, tuple[Any, str]]:
    """``name -> (type, help)`` of the arguments jsonargparse reads for ``class_path`` (as the
    CLI does for a ``class_path`` / ``init_args`` value, ``**kwargs`` followed up the bases)."""
    import importlib

    from jsonargparse import ArgumentParser

    module, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, fail_untyped=False, sub_configs=True)
    return {
        a.dest: (getattr(a, "_typehint", None), a.help or "")
        for a in parser._actions
        if a.dest != "help" and not a.dest.endswith(".help")
    }


def _plain(value: Any) -> Any:
    return value.as_dict() if hasattr(value, "as_dict") else value


def _is_class_spec(value: Any) -> bool:
    return isinstance(value, Mapping) and "class_path" in value and isinstance(value.get("init_args"), Mapping)


def _walk(key: str, hint: Any, help_text: str, value: Any, found: list[Option], class_name: str | None) -> None:
    """Add the options at ``key`` (whose parsed value is ``value``) to ``found``."""
    value = _plain(value)
    if _is_class_spec(value):
        arguments = _class_arguments(value["class_path"])
        owner = value["class_path"].rpartition(".")[2]
        for name, sub in value["init_args"].items():
            sub_hint, sub_help = arguments.get(name, (None, ""))
            _walk(f"{key}.init_args.{name}", sub_hint, sub_help, sub, found, owner)
        return
    if isinstance(value, (list, tuple)) and value and all(_is_class_spec(_plain(v)) for v in value):
        for i, item in enumerate(value):
            _walk(f"{key}[{i}]", None, "", item, found, class_name)
        return
    dataclass = _dataclass_in(hint)
    if dataclass is not None and isinstance(value, Mapping):
        hints = typing.get_type_hints(dataclass)
        for name, sub in value.items():
            _walk(f"{key}.{name}", hints.get(name), "", sub, found, class_name)
        return
    kind = kind_of(hint, help_text)
    if kind is not None:
        found.append(Option(key, kind, class_name))


class _Parsed(Exception):
    pass


@functools.cache
def parsed(base: str) -> tuple[Any, Any]:
    """The CLI's ``fit`` parser and the configuration it parses from ``fit --config BASE``, in this
    process (seconds), before anything is built."""
    from lit_treegrpo.cli import TreeGRPOCLI

    class ParseOnly(TreeGRPOCLI):
        def before_instantiate_classes(self) -> None:
            raise _Parsed(self)

    try:
        with warnings.catch_warnings():  # Lightning's "args given beside a command line" (pytest's)
            warnings.simplefilter("ignore")
            ParseOnly(args=["fit", "--config", base])
    except _Parsed as stop:
        cli = stop.args[0]
    return cli.parser._subcommands_action._name_parser_map["fit"], cli.config["fit"]


@functools.cache
def cli_options(base: str) -> tuple[Option, ...]:
    """The numeric and path options of ``fit --config BASE``, read from the CLI's own parser and
    the configuration it parses (see the module docstring)."""
    from jsonargparse import ActionConfigFile

    fit, config = parsed(base)
    found: list[Option] = []
    for action in fit._actions:
        if isinstance(action, ActionConfigFile):
            found.append(Option(action.dest, "path"))
        elif hasattr(action, "_typehint") and not action.dest.endswith(".help"):
            _walk(action.dest, action._typehint, action.help or "", config.get(action.dest), found, None)
    return tuple(sorted(set(found), key=lambda o: o.key))


# ------------------------------------------------------------------------ values

#: integers at and past the edges: zero, negatives, counts that would take years or exabytes, 64-bit overflow
INT_TEXTS = ("0", "-1", "1", "2", "3", "-1000", "100000", "1000000", "1000000000", "1000000000000000000",
             str(2**31), str(2**63 - 1), str(2**63), str(2**64), str(-(2**63) - 1), "1" + "0" * 30)  # fmt: skip
#: floats at and past the edges: zeros, tiny and subnormal, huge, past float64, infinities and NaN in
#: YAML's and Python's spellings
FLOAT_TEXTS = ("0", "0.0", "-0.0", "0.5", "-0.5", "-1.0", "1e-308", "5e-324", "1.0e-45", "1e9", "1.0e9", "1e18",
               "3.5e38", "1e308", "-1e308", "1e309", ".inf", "-.inf", "inf", "-inf", ".nan", "nan", "NaN")  # fmt: skip

#: the path kinds the workspace holds (``Workspace.path``), relative to it
PATH_KINDS = {
    "missing": "user/missing/nothing.txt",
    "file": "user/notes.txt",
    "empty_file": "user/empty.txt",
    "binary_file": "user/data.bin",
    "bad_jsonl": "user/prompts.jsonl",
    "bad_csv": "user/prompts.csv",
    "bad_yaml": "user/broken.yaml",
    "folder": "user/photos",
    "empty_folder": "user/empty_dir",
    "the_users_folder": "user",
    "the_run_folder": "run",
    "fifo": "user/pipe",
    "link_to_file": "user/link_to_notes",
    "link_to_folder": "user/link_to_photos",
    "dangling_link": "user/dangling",
    "link_loop": "user/loop",
    "link_to_device": "user/zero",
    "under_a_file": "user/notes.txt/child",
    "long_name": "user/" + "n" * 255,
    "too_long_name": "user/" + "n" * 300,
    "too_long_path": "user/" + "/".join(["p" * 200] * 25),
    "relative": "../user/notes.txt",  # from the command's working folder, cwd/
    "empty": "",
    "blank": "   ",
}


# ------------------------------------------------------------------------ the workspace and its hash tree

#: files of the user's beside the run folder (``user/``); ``Workspace`` adds the special ones
USER_FILES = {
    "notes.txt": b"a red circle\na blue square\na green triangle\n",
    "empty.txt": b"",
    "data.bin": bytes(range(256)) * 4,
    "prompts.jsonl": b'{"prompt": "a red circle"}\n{not json\n',
    "prompts.csv": b"caption;weight\nx;1\n",
    "broken.yaml": b"model: [unclosed\n  - : :\n",
    "photos/cat.png": b"\x89PNG\r\n\x1a\nnot really a png",
}
#: files of the user's inside a new run's folder, of names no fit writes
USER_FILES_IN_A_NEW_RUN = {
    "notes.txt": b"my notes\n",
    "photos/cat.png": b"\x89PNG\r\n\x1a\nmine",
    "checkpoints/README.txt": b"my checkpoints go here\n",
    "tensorboard/other_exp/events.out.tfevents.1.host.0": b"another experiment's events",
}
#: files of the user's inside an earlier run's folder (issue 56's ``--overwrite`` trial): kept whatever a new fit does
USER_FILES_IN_AN_EARLIER_RUN = {
    "notes.txt": b"my notes\n",
    "checkpoints/keep_me.ckpt": b"my own checkpoint",
    "checkpoints/archive/old/last.ckpt": b"an archived run's checkpoint",
    "tensorboard/other_exp/events.out.tfevents.1.host.0": b"another experiment's events",
    "samples/step_vacation.png": b"\x89PNG\r\n\x1a\nholiday",
}


def _write(root: Path, files: Mapping[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


@dataclasses.dataclass
class Workspace:
    """``folder/cwd`` (the command's working folder, empty), ``folder/user`` (the user's files:
    text, binary, a folder, an empty one, a FIFO, links to a file, a folder, nothing, themselves and
    ``/dev/zero``) and ``folder/run`` (the run folder: the user's files only, or an earlier run's
    copy with the user's files added)."""

    folder: Path

    @classmethod
    def make(cls, folder: Path, earlier_run: Path | None) -> Workspace:
        (folder / "cwd").mkdir(parents=True)
        user = folder / "user"
        _write(user, USER_FILES)
        (user / "empty_dir").mkdir()
        os.mkfifo(user / "pipe")
        os.symlink("notes.txt", user / "link_to_notes")
        os.symlink("photos", user / "link_to_photos")
        os.symlink("nowhere", user / "dangling")
        os.symlink("loop", user / "loop")
        os.symlink("/dev/zero", user / "zero")
        if earlier_run is None:
            _write(folder / "run", USER_FILES_IN_A_NEW_RUN)
        else:
            shutil.copytree(earlier_run, folder / "run", symlinks=True)
            _write(folder / "run", USER_FILES_IN_AN_EARLIER_RUN)
        return cls(folder)

    def path(self, kind: str) -> str:
        """The path of a :data:`PATH_KINDS` kind, as given on the command line (absolute, but for
        ``relative``, ``empty`` and ``blank``)."""
        rel = PATH_KINDS[kind]
        if kind in ("relative", "empty", "blank"):
            return rel
        return str(self.folder / rel)

    def tree(self) -> dict[str, tuple[Any, ...]]:
        """``relative path -> ("dir",) | ("file", sha256) | ("link", target) | ("other", mode)`` of
        everything under the folder; nothing is opened but regular files, no link is followed."""
        found: dict[str, tuple[Any, ...]] = {}
        for top, dirs, files in os.walk(self.folder, followlinks=False):
            for name in dirs + files:
                path = os.path.join(top, name)
                rel = os.path.relpath(path, self.folder)
                info = os.lstat(path)
                if os.path.islink(path):
                    found[rel] = ("link", os.readlink(path))
                elif os.path.isdir(path):
                    found[rel] = ("dir",)
                elif os.path.isfile(path):
                    digest = hashlib.sha256()
                    with open(path, "rb") as f:
                        for block in iter(lambda: f.read(1 << 20), b""):  # noqa: B023
                            digest.update(block)
                    found[rel] = ("file", digest.hexdigest())
                else:
                    found[rel] = ("other", oct(info.st_mode))
        return found


def manifest_entries(root: Path) -> dict[str, str]:
    """``relative path -> sha256`` of the files a run folder's manifest says its fits wrote."""
    from lit_treegrpo.common.files import MANIFEST_NAME

    try:
        files = json.loads((root / MANIFEST_NAME).read_text()).get("files", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {rel: entry.get("sha256") for rel, entry in files.items() if isinstance(entry, dict)}


def _bookkeeping(rel: str) -> bool:
    """Whether ``rel`` (relative to a run folder) is the fits' manifest, lock or set-aside folder."""
    from lit_treegrpo.artifacts.locks import LOCK_NAME
    from lit_treegrpo.artifacts.run_outputs import SET_ASIDE
    from lit_treegrpo.common.files import MANIFEST_NAME

    return rel in (MANIFEST_NAME, LOCK_NAME, SET_ASIDE) or rel.startswith(SET_ASIDE + "/")


def _a_run_output(rel: str) -> bool:
    """Whether ``rel`` (relative to a run folder) has a name a fit writes there (its checkpoints,
    events, config records, sample grids and trees: ``RUN_OUTPUT_NAMES``)."""
    from lit_treegrpo.artifacts.run_outputs import RUN_OUTPUT_NAMES

    output, _, rest = rel.partition("/")
    name = rest.rsplit("/", 1)[-1]
    return bool(rest) and any(fnmatch.fnmatchcase(name, p) for p in RUN_OUTPUT_NAMES.get(output, ()))


def changes_outside_the_run(
    ws: Workspace,
    before: Mapping[str, tuple[Any, ...]],
    after: Mapping[str, tuple[Any, ...]],
    root: str,
    *,
    earlier: Mapping[str, str],
    may_replace_earlier: bool,
) -> list[str]:
    """What changed in the workspace that the run does not own. Outside its run folder ``root``:
    anything. Inside it: a file of the user's (changed or removed), a new file of a name no fit
    writes, and a file of the earlier run (``earlier``: its manifest, ``path -> sha256``) unless
    ``may_replace_earlier``. The run's own bookkeeping (manifest, lock, set-aside folder) may change."""
    root_real = Path(os.path.realpath(root if os.path.isabs(root) else ws.folder / "cwd" / root))

    def in_run(rel: str) -> str | None:
        path = ws.folder / rel
        where = Path(os.path.realpath(path.parent)) / path.name  # a link itself, not what it points to
        try:
            return where.relative_to(root_real).as_posix()
        except ValueError:
            return None

    def replaceable(rel: str) -> bool:
        entry, inside = before.get(rel), in_run(rel)
        return (
            may_replace_earlier
            and inside is not None
            and entry is not None
            and entry[0] == "file"
            and earlier.get(inside) == entry[1]
        )

    problems = []
    for rel in sorted(set(before) | set(after)):
        old, new = before.get(rel), after.get(rel)
        if old == new:
            continue
        inside = in_run(rel)
        what = "added" if old is None else "removed" if new is None else "changed"
        if inside is None:
            problems.append(f"{rel} {what}, outside the run folder {root}")
        elif _bookkeeping(inside):
            continue
        elif old is None:
            if new[0] != "dir" and not _a_run_output(inside):
                problems.append(f"{rel} added in the run folder, a name no fit writes")
        elif old[0] == "dir":
            held = [r for r in before if r.startswith(rel + "/") and before[r][0] != "dir"]
            if new is None and not all(replaceable(r) for r in held):
                problems.append(f"{rel}/ removed, a folder that held files the run may not remove")
        elif not replaceable(rel):
            problems.append(f"{rel} {what}: the user's file, or the earlier run's that this run may not replace")
    return problems


# ------------------------------------------------------------------------ one run


@dataclasses.dataclass
class Outcome:
    """What one run of the CLI did: the command, its exit status (None: killed at the wall bound),
    stderr, and the seconds it took."""

    command: list[str]
    returncode: int | None
    stderr: str
    stdout: str
    seconds: float

    @property
    def last_line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else ""

    def shell(self) -> str:
        return shlex.join(self.command)


def _limit_memory(bytes_: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (bytes_, bytes_))


def run_cli(args: Sequence[str], *, cwd: Path, timeout: float, memory: int) -> Outcome:
    """``python -m lit_treegrpo ARGS`` in ``cwd`` with its address space bounded to ``memory``
    bytes (``RLIMIT_AS``: an allocation past it fails inside the process); killed, its whole
    process group, after ``timeout`` seconds."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for name in ("LIT_TREEGRPO_DEBUG", "RANK", "LOCAL_RANK", "WORLD_SIZE", "PYTHONWARNINGS"):
        env.pop(name, None)
    command = [sys.executable, "-m", "lit_treegrpo", *args]
    start = time.monotonic()
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,  # its own process group: a timeout kills what it started too
        preexec_fn=functools.partial(_limit_memory, memory),
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        returncode = None
    return Outcome(command, returncode, stderr, stdout, time.monotonic() - start)


def problems_of(outcome: Outcome, options: Iterable[Option], values: Iterable[str], timeout: float) -> list[str]:
    """The properties a command line must have, whatever its values: it ends within the wall bound,
    with status 0, or 2 and a last stderr line ``error: ...`` that names one of ``options`` (a line
    that names only the value given, a path, is said so); no Python traceback anywhere in stderr (a
    thread's included)."""
    values = list(values)
    problems = []
    if outcome.returncode is None:
        problems.append(f"still running after {timeout:.0f} s (killed)")
    elif outcome.returncode not in (0, 2):
        problems.append(f"exit status {outcome.returncode}")
    if "Traceback (most recent call last)" in outcome.stderr:
        problems.append("a Python traceback in stderr")
    if outcome.returncode == 2:
        if not outcome.last_line.startswith("error: "):
            problems.append("exit status 2 without a last line 'error: ...'")
        elif not any(option.named_in(outcome.last_line) for option in options):
            named = [value for value in values if "/" in value and value in outcome.last_line]
            problems.append("the error line names none of the options given" + (" (only the path)" if named else ""))
    if outcome.returncode is not None and outcome.returncode != 0 and "MemoryError" in outcome.stderr:
        problems.append("MemoryError (the address-space bound was reached)")
    return problems


def override_file(path: Path, config: Any, key: str, value: str) -> None:
    """Write to ``path`` a config file that sets ``key`` (``trainer.callbacks[1].init_args.scale``),
    one element's argument in a list of classes, to ``value`` as written (YAML text), the list
    otherwise as ``config`` (the parsed configuration) holds it."""
    match = re.fullmatch(r"(\w+)\.(\w+)\[(\d+)\]\.([\w.]+)", key)
    assert match is not None, key
    top, sub, index, rest = match.groups()
    items = [_plain(item) for item in config[top][sub]]
    node = items[int(index)]
    *inner, leaf = rest.split(".")
    for part in inner:
        node = node[part]
    node[leaf] = "FUZZED_VALUE"
    text = yaml.safe_dump({top: {sub: items}}, sort_keys=False)
    path.write_text(text.replace("FUZZED_VALUE", value))
