"""Choice options checked against their ``Literal``: the list of choices is read from the type
(``typing.get_args``), never typed again, so the annotation the command line parses with and the
run-time check (for Python callers) cannot drift apart."""

from __future__ import annotations

from typing import Any, get_args


def choices(literal: Any) -> tuple[Any, ...]:
    """The values of a ``Literal`` type, in declaration order (nested ``Literal``s flattened)."""
    found = get_args(literal)
    if not found:
        raise TypeError(f"{literal!r} is not a Literal type with values")
    return found


def check_choice(option: str, value: object, literal: Any) -> None:
    """Raise one line ``<option> must be 'a', 'b' or 'c', got 'x'`` unless ``value`` is one of ``literal``'s values."""
    allowed = choices(literal)
    if value not in allowed:
        raise ValueError(f"{option} must be {listing(allowed)}, got {value!r}")


def listing(allowed: tuple[Any, ...]) -> str:
    """``'a'``; ``'a' or 'b'``; ``'a', 'b' or 'c'``."""
    quoted = [repr(a) for a in allowed]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
