"""A command-line value the parser would read as a config file, checked before it opens it: jsonargparse reads the
value of a section or class option (``--data FILE``, ``--model.adapter FILE``) as a YAML file when it names one, and
takes a FIFO on purpose (for ``<(...)``), whose read waits for ever; a device's never ends. Such a value is refused
by its status, in one line naming the option (the ``--config`` files: :func:`~.user_errors.check_yaml_file`)."""

from __future__ import annotations

import os
import stat
import types
import typing
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser

from ..common.reads import READ_FIX, kind_of
from .user_errors import UserError, check_yaml_values


def check_values(argv: list[str] | tuple[str, ...], parser: Any) -> None:
    """The command line's values that ``parser`` would read or expand, checked before it does: no FIFO, device or
    socket (:func:`check_special_files`), no YAML that gives a key twice or expands beyond the alias bound
    (:func:`~.user_errors.check_yaml_values`)."""
    check_special_files(argv, parser)
    check_yaml_values(argv)


def _plain(typehint: Any) -> bool:
    """Whether a value of ``typehint`` is taken as given (a string, a number, a path, a choice): never read as a
    config file by the parser."""
    if typehint in (str, int, float, bool, type(None), Path):
        return True
    origin = typing.get_origin(typehint)
    if origin is typing.Literal:
        return True
    return origin in (typing.Union, types.UnionType) and all(_plain(arg) for arg in typing.get_args(typehint))


def _read_as_config(parser: Any, option: str) -> bool:
    """Whether ``parser`` (or a subcommand's) may read ``option``'s value as a config file when it names one: a
    section (``--data``), a class (``--model.adapter``), a mapping or a list, or an option it does not list (a
    class's own argument); not an option of a plain type (a path the command opens itself, checked there)."""
    for action in parser._actions:
        if option in action.option_strings:
            return not _plain(getattr(action, "_typehint", None))
    subcommands = [a.choices for a in parser._actions if isinstance(getattr(a, "choices", None), dict)]
    parsers = [p for choices in subcommands for p in choices.values() if isinstance(p, LightningArgumentParser)]
    return all(_read_as_config(p, option) for p in parsers)


def check_special_files(argv: list[str] | tuple[str, ...], parser: Any) -> None:
    """Refuse a value that names a FIFO, device or socket, told by its status, for an option ``parser`` may read as a
    config file (:func:`_read_as_config`: ``--data FILE``, ``--model.adapter FILE``): jsonargparse would open it,
    and wait for ever on a FIFO. ``--config`` is :func:`~.user_errors.check_yaml_file`'s; an option of a plain type is checked
    where the command opens its path (a prompt file, a checkpoint), with the fix for what it takes."""
    option = None
    for arg in map(str, argv):
        if arg.startswith("-"):
            option, _, value = arg.partition("=")
            if not value:
                continue
        elif option is None:
            continue  # the subcommand
        else:
            value = arg
        given, option = option, None  # one value per option
        if given in ("--config", "-c") or not _read_as_config(parser, given):
            continue
        try:
            mode = os.stat(value).st_mode
        except (OSError, ValueError):  # nothing there, a name too long or holding a NUL: a plain value
            continue
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            raise UserError(f"{given}: {value} is {kind_of(mode)}, not a regular file; {READ_FIX}")
