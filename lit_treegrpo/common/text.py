"""Prompts as they enter: printable text (:func:`check_prompt`), cut to :data:`MAX_PROMPT_CHARS` characters before
anything tokenises them (:func:`cut_prompts`), as rules 2 and 3 of docs/failure_modes.md ask."""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence

MAX_PROMPT_CHARS = 10_000
#: what no prompt may hold: the control characters (Unicode's Cc) but tab and line breaks (a .jsonl
#: prompt may span lines), and lone surrogates, which no file encoding can hold
_NOT_PRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


class PromptCutWarning(UserWarning):
    """Prompts longer than :data:`MAX_PROMPT_CHARS` characters were cut."""


def prompt_problem(text: str) -> str | None:
    """What makes ``text`` no printable text (a control character other than tab and line breaks,
    or a lone surrogate, which no file encoding can hold), or None."""
    found = _NOT_PRINTABLE.search(text)
    if found is None:
        return None
    code = ord(found.group())
    kind = "lone surrogate" if 0xD800 <= code <= 0xDFFF else "control character"
    return f"the {kind} U+{code:04X} at character {found.start() + 1}"


def check_prompt(text: object, where: str) -> str:
    """``text`` if it is a string of printable text; ``ValueError`` starting with ``where`` otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"{where}: a prompt must be text, got {type(text).__name__} {text!r:.60}")
    problem = prompt_problem(text)
    if problem is not None:
        raise ValueError(
            f"{where}: the prompt {text[:40]!r} holds {problem}; prompts must be printable text: remove it"
        )
    return text


def cut_prompts(prompts: Sequence[str], where: str, limit: int = MAX_PROMPT_CHARS) -> list[str]:
    """``prompts`` each cut to ``limit`` characters, with one :class:`PromptCutWarning` naming
    ``where`` when any was longer."""
    cut = [p[:limit] for p in prompts]
    longer = [len(p) for p in prompts if len(p) > limit]
    if longer:
        warnings.warn(
            f"{where}: {len(longer)} of {len(prompts)} prompts are longer than {limit:,} characters (the longest "
            f"has {max(longer):,}) and were cut to {limit:,} before tokenising; no text encoder reads that far",
            PromptCutWarning,
            stacklevel=2,
        )
    return cut
