"""Environment flags, read as booleans by one rule (:func:`env_flag`)."""

from __future__ import annotations

import os

#: what a flag may say, lower-cased and stripped; empty or unset is off
OFF = ("", "0", "false", "no", "off")
ON = ("1", "true", "yes", "on")


def env_flag(name: str) -> bool:
    """Whether the environment variable ``name`` is on: ``1``, ``true``, ``yes``, ``on`` (any case); unset, empty,
    ``0``, ``false``, ``no``, ``off`` are off."""
    value = os.environ.get(name, "").strip().lower()
    if value in OFF:
        return False
    if value in ON:
        return True
    raise ValueError(
        f"{name}={os.environ[name]!r}: not a flag value; set it to 1 (or true, yes, on) to turn it on, "
        "or 0 (false, no, off, empty) or unset it to turn it off"
    )
