"""Log lines of other libraries that carry nothing for a user of this project, dropped by a logging
filter on the logger that prints each (the command line's start-up: :mod:`lit_treegrpo.cli.run_output`;
Lightning's advertisement for its cloud logger is dropped by the package itself, on import)."""

from __future__ import annotations

import logging


class DropMessages(logging.Filter):
    """Drops the records whose message contains ``fragment``."""

    def __init__(self, fragment: str) -> None:
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


def drop_messages(pairs: tuple[tuple[str, str], ...]) -> None:
    """Install a :class:`DropMessages` for each (logger name, fragment), once per process."""
    for name, fragment in pairs:
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropMessages) and f.fragment == fragment for f in logger.filters):
            logger.addFilter(DropMessages(fragment))
