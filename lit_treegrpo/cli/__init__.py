"""The command line: ``python -m lit_treegrpo {fit,validate,test,predict,export} --config FILE``.

- :mod:`.app`: :class:`TreeGRPOCLI` (LightningCLI with fixed run folders, honest resume, safe
  checkpoint reads) and the console entry's run of it.
- :mod:`.first_checks`: what is checked before Lightning and the models are imported (the model's
  weights, then the rewards' extras, in seconds), and the shipped configs' names (``--config shapes``).
- :mod:`.checks`: every check that needs no model, run before any weights load; the Trainer's
  options in :mod:`.trainer_checks`.
- :mod:`.user_errors`: :class:`UserError` and the rule that turns a configuration, file or
  environment error into one line and exit status 2; :mod:`.special_files`: a FIFO or device given
  where the parser would read a file, refused before it opens it.
- :mod:`.commands`: the ``export`` subcommand (its options and its run), and which weights
  validate / test / predict evaluate (a checkpoint's EMA).
- :mod:`.run_output`: what a run prints (progress lines or bar, a compact summary, a Ctrl-C said as
  such) and ``--max_iterations``; :mod:`.config_record`: every logger keeps the fit's configuration.

:func:`main` (the console entry, ``lit-treegrpo``) runs the first checks, then imports the rest.

May import everything else of the package: the command line is the top, and nothing imports it.
"""

from __future__ import annotations

import sys
from typing import Any

from .first_checks import DEBUG_ENV, FirstCheckError, first_checks


def main(args: list[str] | None = None) -> None:
    """Console entry: :func:`~.first_checks.first_checks` (one line and exit status 2 on a
    failure, before the heavy imports), then :func:`lit_treegrpo.cli.app.main`."""
    try:
        first_checks(sys.argv[1:] if args is None else list(args))
    except FirstCheckError as err:
        if _debug():
            raise
        print(f"error: {err}  (set {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        sys.exit(2)
    from .app import main as run

    run(args)


def _debug() -> bool:
    """Whether ``LIT_TREEGRPO_DEBUG`` asks for the traceback (a value it refuses counts as off here:
    the command line's own start reports it)."""
    from ..common.env import env_flag

    try:
        return env_flag(DEBUG_ENV)
    except ValueError:
        return False


def __getattr__(name: str) -> Any:
    if name == "TreeGRPOCLI":
        from .app import TreeGRPOCLI

        return TreeGRPOCLI
    raise AttributeError(f"module 'lit_treegrpo.cli' has no attribute {name!r}")


__all__ = ["DEBUG_ENV", "TreeGRPOCLI", "main"]
