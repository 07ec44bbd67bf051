"""What the CLI tests share: the one error line a refused command prints."""

from __future__ import annotations

import pytest


def one_error_line(capsys, monkeypatch, *args: str) -> str:
    """Run ``lit_treegrpo`` in this process with ``args``; it must exit with 2 and print one line."""
    from lit_treegrpo.cli import main

    monkeypatch.delenv("LIT_TREEGRPO_DEBUG", raising=False)
    with pytest.raises(SystemExit) as stop:
        main(list(args))
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]
