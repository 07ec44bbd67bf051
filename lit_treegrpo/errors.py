"""Helpers for turning exceptions into the one-line messages the CLI and the fault policy print."""

from __future__ import annotations


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message, or its type's name when the message is empty."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
