"""Values checked against their declaration where they enter (rule 3 of docs/failure_modes.md)."""

from __future__ import annotations

import collections.abc as abc
import inspect
import math
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Annotated, Any, Literal, Union, get_args, get_origin


@dataclass(frozen=True)
class Range:
    """A number's bounds, declared as ``Annotated[float, Range(0, 1)]`` (both ends included unless
    ``low_open`` / ``high_open``); ``None``: unbounded on that side."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


class ArgumentError(ValueError):
    """A value that is not what its parameter declares (one line naming the option)."""


def _is_path(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, (PurePath, os.PathLike))


def _is_union(hint: Any) -> bool:
    return get_origin(hint) is Union or isinstance(hint, types.UnionType)


def describe(hint: Any) -> str:
    """``float | None`` -> ``a number or null``."""
    if hint is Any or hint is object:
        return "any value"
    if hint is None or hint is type(None):
        return "null"
    if _is_union(hint):
        return " or ".join(dict.fromkeys(describe(h) for h in get_args(hint)))
    origin = get_origin(hint)
    if origin is Annotated:
        base, *marks = get_args(hint)
        ranges = [str(m) for m in marks if isinstance(m, Range)]
        return describe(base) + (f" {ranges[0]}" if ranges else "")
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(hint))
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is str:
        return "text"
    if _is_path(hint):
        return "a path"
    if origin in (list, tuple, abc.Sequence) or hint in (list, tuple):
        return "a list"
    if origin in (dict, abc.Mapping) or hint in (dict, Mapping):
        return "a mapping"
    if origin is abc.Callable or hint is Callable:
        return "a function"
    return f"a {getattr(hint, '__name__', str(hint))}"


def _matches(value: Any, hint: Any, option: str) -> bool:
    """Whether ``value`` is of the declared type ``hint``; raises :class:`ArgumentError` for the
    right type out of its declared range, or for an item of a list or mapping (naming it)."""
    if hint is Any or hint is object or isinstance(hint, (typing.TypeVar, typing.ForwardRef, str)):
        return True  # undeclared, or a declaration this check cannot read: the loader's own checks apply
    if hint is None or hint is type(None):
        return value is None
    if _is_union(hint):
        arms = get_args(hint)
        if isinstance(value, str) and not value.strip() and any(_is_path(arm) for arm in arms):
            raise ArgumentError(f"{option}: empty; give a path")
        for arm in arms:  # a value that fits a plain arm, e.g. null, never reports another arm's range
            try:
                if _matches(value, arm, option):
                    return True
            except ArgumentError:
                if len([a for a in arms if a is not type(None)]) == 1:
                    raise
        return False
    origin = get_origin(hint)
    if origin is Annotated:
        base, *marks = get_args(hint)
        if not _matches(value, base, option):
            return False
        for mark in marks:
            if isinstance(mark, Range) and not mark.holds(value):
                raise ArgumentError(f"{option} must be {mark}, got {value!r}")
        return True
    if origin is Literal:
        return value in get_args(hint)
    if hint in (bool, int, float, str) or _is_path(hint):
        return _matches_scalar(value, hint, option)
    if origin in (list, tuple, abc.Sequence) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        args = [a for a in get_args(hint) if a is not Ellipsis]
        item = args[0] if len(args) == 1 else Any
        for i, v in enumerate(value):
            check_value(v, item, f"{option}[{i}]")
        return True
    if origin in (dict, abc.Mapping, abc.MutableMapping) or hint in (dict, Mapping):
        if not isinstance(value, Mapping):
            return False
        args = get_args(hint)
        for k, v in value.items():
            check_value(v, args[1] if len(args) == 2 else Any, f"{option}.{k}")
        return True
    if origin is abc.Callable or hint is Callable:
        return callable(value)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a typing construct this check does not know: left to the loader


def _matches_scalar(value: Any, hint: Any, option: str) -> bool:
    """Whether ``value`` is a ``bool``, ``int``, ``float`` (finite), ``str`` or path, as ``hint`` says."""
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        if not math.isfinite(value):
            raise ArgumentError(f"{option} must be a finite number, got {value!r}")
        return True
    if hint is str:
        return isinstance(value, str)
    if isinstance(value, str) and not value.strip():
        raise ArgumentError(f"{option}: empty; give a path")
    return isinstance(value, (str, os.PathLike))


def check_value(value: Any, hint: Any, option: str) -> None:
    """Raise :class:`ArgumentError` (``option``: what is wrong, the declared type) unless ``value``
    is of the declared type ``hint``, within its declared range."""
    if not _matches(value, hint, option):
        raise ArgumentError(f"{option}: expected {describe(hint)}, got {value!r:.80}; fix the value")


def declared(loader: Callable[..., Any]) -> dict[str, Any]:
    """The declared type of every keyword parameter of ``loader`` (a function, or a class: its
    ``__init__``), ranges included; ``Any`` where none is declared or it cannot be resolved."""
    function = loader.__init__ if isinstance(loader, type) else loader
    params = inspect.signature(loader).parameters
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except (NameError, TypeError):  # a name imported only for type checkers: resolve one by one
        hints = {}
        namespace = getattr(function, "__globals__", {})
        for name, annotation in getattr(function, "__annotations__", {}).items():
            try:
                hints[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation  # noqa: S307
            except Exception:  # noqa: BLE001 (an annotation that cannot be evaluated is undeclared)
                hints[name] = Any
    return {name: hints.get(name, Any) for name in params}


def check_arguments(loader: Callable[..., Any], given: Mapping[str, Any], option: str) -> None:
    """Check each of ``given`` against ``loader``'s declaration (:func:`declared`); errors name
    ``option.<argument>``."""
    hints = declared(loader)
    for name, value in given.items():
        check_value(value, hints.get(name, Any), f"{option}.{name}")
