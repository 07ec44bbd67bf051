"""The command line: ``python -m lit_treegrpo {fit,validate,test,predict,export} --config FILE``.

- :mod:`.app`: :class:`TreeGRPOCLI` (LightningCLI with fixed run folders, honest resume, safe
  checkpoint reads) and :func:`main`, the console entry (``lit-treegrpo``).
- :mod:`.checks`: every check that needs no model, run before any weights load; the Trainer's
  options in :mod:`.trainer_checks`.
- :mod:`.user_errors`: :class:`UserError` and the rule that turns a configuration, file or
  environment error into one line and exit status 2.
- :mod:`.commands`: the ``export`` subcommand (its options and its run), and which weights
  validate / test / predict evaluate (a checkpoint's EMA).
- :mod:`.run_output`: what a run prints (progress lines or bar, a compact summary) and
  ``--max_iterations``.

May import everything else of the package: the command line is the top, and nothing imports it.
"""

from .app import DEBUG_ENV, TreeGRPOCLI, main

__all__ = ["DEBUG_ENV", "TreeGRPOCLI", "main"]
