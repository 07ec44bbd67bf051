"""Text-encoder helpers every adapter shares: refusing a tokenizer that loaded empty, and counting (and warning once
about) prompts cut at an encoder's token limit instead of the libraries' own log line on every call."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Sequence
from typing import Any


def check_tokenizer(tokenizer: Any, name: str) -> None:
    """Refuse a tokenizer that loaded empty (happens offline with some hub caches)."""
    if tokenizer is not None and len(tokenizer) == 0:
        raise ValueError(f"{name} loaded with an empty vocabulary; its files are missing or broken")


class PromptTruncationWarning(UserWarning):
    """Prompts longer than a text encoder's token limit were truncated."""


def token_lengths(tokenizer: Any, prompts: Sequence[str]) -> list[int]:
    """Tokens per prompt, special tokens included, without truncation."""
    if hasattr(tokenizer, "model_max_length"):  # Hugging Face: no "sequence too long" log line
        ids = tokenizer(list(prompts), truncation=False, verbose=False)["input_ids"]
    else:
        ids = tokenizer(list(prompts))
        ids = ids["input_ids"] if isinstance(ids, dict) else ids
    return [len(seq) for seq in ids]


class TruncationWarner:
    """Warns once per text encoder (per adapter, so once per run) when prompts exceed the
    encoder's token limit, with how many of the batch were truncated; counts every call."""

    def __init__(self) -> None:
        self.truncated: dict[str, int] = {}
        self.seen: dict[str, int] = {}

    def __call__(self, tokenizer: Any, prompts: Sequence[str], max_length: int, encoder: str) -> int:
        """Count (and, the first time for ``encoder``, warn about) the prompts with more than
        ``max_length`` tokens (special tokens included); returns how many there are in ``prompts``."""
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        lengths = token_lengths(tokenizer, prompts)
        over = [i for i, n in enumerate(lengths) if n > max_length]
        first_time = encoder not in self.truncated or self.truncated[encoder] == 0
        self.truncated[encoder] = self.truncated.get(encoder, 0) + len(over)
        self.seen[encoder] = self.seen.get(encoder, 0) + len(lengths)
        if over and first_time:
            longest = max(lengths[i] for i in over)
            warnings.warn(
                f"{len(over)} of {len(lengths)} prompts exceed the {encoder} text encoder's {max_length} "
                f"tokens and were truncated (the longest has {longest}, e.g. {prompts[over[0]][:60]!r}); "
                "the model never sees the rest. This warning is shown once per encoder; "
                "shorten the prompts to avoid it",
                PromptTruncationWarning,
                stacklevel=2,
            )
        return len(over)


_TRUNCATION_LOGS = (
    "The following part of your input was truncated",  # diffusers, on every encode_prompt call
    "Token indices sequence length is longer than",  # transformers, once per tokenizer
)


class _DropTruncationLogs(logging.Filter):
    """Drops the libraries' own truncation log lines, which :class:`TruncationWarner` replaces
    with one warning per encoder."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_TRUNCATION_LOGS)


@contextlib.contextmanager
def quiet_truncation_logs(pipeline: Any) -> Iterator[None]:
    """While encoding through ``pipeline.encode_prompt``, drop the truncation log lines of the
    pipeline's module and of transformers' tokenizers (only those: other records pass)."""
    loggers = [logging.getLogger(type(pipeline).__module__), logging.getLogger("transformers.tokenization_utils_base")]
    dropper = _DropTruncationLogs()
    for logger in loggers:
        logger.addFilter(dropper)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(dropper)
