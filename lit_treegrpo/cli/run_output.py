"""What a run prints and how long it runs, as the CLI sets them up (:mod:`lit_treegrpo.cli.app`).

- Progress: on a terminal, Lightning's bar; otherwise (stdout to a file or a pipe) plain lines from
  :class:`~lit_treegrpo.callbacks.ProgressLines`, since a bar written to a file shows nothing for
  minutes.
- Start-up: :class:`~lit_treegrpo.callbacks.CompactModelSummary` replaces Lightning's table, and
  :func:`quiet_startup` drops log lines that carry nothing for a user of this project (Lightning's
  note on summary callbacks; transformers' note that it falls back to its PIL image processors,
  which is what the rewards use; the advertisement for a logging service is the package's own filter).
- Interrupts: a Ctrl-C is said as such, without Lightning's ``Received SIGTERM: 15``
  (:func:`report_interrupts`); a resume, without its warning that ``checkpoints/`` is not empty.
- Where: W&B and MLflow loggers left at their defaults write into the run folder (:func:`loggers_in_run_folder`).
- Length: ``--max_iterations`` counts training iterations (:class:`~lit_treegrpo.callbacks.IterationLimit`),
  ``--trainer.max_steps`` Lightning's optimizer steps; the ``--help`` of both says which is which.
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.callbacks import ModelSummary, ProgressBar
from lightning.pytorch.callbacks.rich_model_summary import RichModelSummary
from lightning.pytorch.utilities import rank_zero_info

from ..callbacks import CompactModelSummary, IterationLimit, ProgressLines
from ..common.logs import drop_messages

#: the logger Lightning reports a SIGTERM on
SIGNAL_LOGGER = "lightning.pytorch.trainer.connectors.signal_connector"
MAX_ITERATIONS_HELP = (
    "Stop a fit after this many training iterations (one iteration = one rollout of the tree for a "
    "batch of prompts and its policy updates), a resumed run's included; replaces "
    "--trainer.max_steps, which counts Lightning's optimizer steps (minibatches x inner_epochs per "
    "iteration). Ignored by validate / test / predict / export."
)
MAX_STEPS_HELP = (
    "Lightning's optimizer steps, NOT training iterations: an iteration (one rollout and its updates) "
    "makes --model.minibatches x --model.inner_epochs of them (one per --model.edges_per_update kept "
    "edges, none for a refused update), so it equals iterations only with one step per iteration. "
    "Use --max_iterations to count iterations. -1: no limit."
)

#: start-up log lines to drop: (logger name, text the message contains); Lightning's advertisement
#: for its cloud logger is dropped by the package itself, on import (``lit_treegrpo/__init__.py``)
QUIET_LOGS = (
    ("lightning.pytorch.utilities.rank_zero", "Trainer already configured with model summary callbacks"),
    ("lightning.fabric.utilities.rank_zero", "Trainer already configured with model summary callbacks"),
    ("transformers.utils.import_utils", "requires torchvision (not installed); falling back to"),
)


def quiet_startup() -> None:
    """Install the log filters of :data:`QUIET_LOGS` (once per process: called by ``cli.main`` and
    :class:`~lit_treegrpo.cli.app.TreeGRPOCLI`, which a notebook builds without it)."""
    drop_messages(QUIET_LOGS)


class InterruptNotSigterm(logging.Filter):
    """Drops Lightning's ``Received SIGTERM: 15`` when the signal was a Ctrl-C: the
    :class:`~lit_treegrpo.callbacks.CheckpointOnInterrupt` callbacks (``interrupts``) turn a first
    Ctrl-C into a SIGTERM to the process, Lightning's own graceful stop, and have already said
    "Ctrl-C: stopping after the current step ...". A real SIGTERM is still reported."""

    def __init__(self, interrupts: list[Any]) -> None:
        super().__init__()
        self.interrupts = interrupts

    def filter(self, record: logging.LogRecord) -> bool:
        if "Received SIGTERM" not in record.getMessage():
            return True
        return not any(getattr(cb, "_stopping", False) for cb in self.interrupts)


def report_interrupts(interrupts: list[Any]) -> None:
    """Install :class:`InterruptNotSigterm` for these callbacks on Lightning's signal logger (in
    place of one an earlier Trainer of this process installed)."""
    logger = logging.getLogger(SIGNAL_LOGGER)
    for old in [f for f in logger.filters if isinstance(f, InterruptNotSigterm)]:
        logger.removeFilter(old)
    logger.addFilter(InterruptNotSigterm(interrupts))


def quiet_known_warnings() -> None:
    """Silence, for the whole process, the warnings that say nothing a user can act on. Both
    Lightning warnings are by design here: adapters keep every submodule in eval mode (no dropout
    in the policy), and the prompt stream is a pure function of the step, with nothing for loader
    workers to do. The third is Lightning's own use of a torch API it has not caught up with. The
    fourth, that ``checkpoints/`` is not empty, is what a resume finds by design; a fit that would
    write over another run is refused before that (:mod:`lit_treegrpo.artifacts.run_folder`)."""
    warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode at the start of training")
    warnings.filterwarnings("ignore", message=r".*does not have many workers which may be a bottleneck")
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # the run folder's rules decide what a fit may find in checkpoints/ (a resume finds its own)
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    quiet_startup()
    quiet_event_writer_threads()


#: the module of TensorBoard's event writer thread (``_AsyncWriterThread``)
EVENT_WRITER_MODULE = "tensorboard.summary.writer.event_file_writer"


def quiet_event_writer_threads() -> None:
    """Drop, for the whole process, the traceback Python prints when TensorBoard's event writer thread fails to
    write (a full disk, a read-only folder): the library hands that ``OSError`` to the thread that writes or
    flushes next, where the run's logger says it in one line naming the folder
    (:class:`~lit_treegrpo.artifacts.run_folder.RunTensorBoardLogger`, which flushes before it closes). Every
    other thread's exception is printed as before."""
    previous = threading.excepthook
    if getattr(previous, "quiet_event_writers", False):
        return  # installed by an earlier command of this process

    def excepthook(args: Any) -> None:
        if isinstance(args.exc_value, OSError) and type(args.thread).__module__ == EVENT_WRITER_MODULE:
            return
        previous(args)

    excepthook.quiet_event_writers = True  # type: ignore[attr-defined]
    threading.excepthook = excepthook


def output_callbacks(
    config: dict[str, Any], callbacks: list[Any], configured: list[Any], is_terminal: bool | None = None
) -> list[Any]:
    """``callbacks`` plus :class:`ProgressLines` when stdout is not a terminal (Lightning's bar
    turned off in the trainer ``config``), unless the progress bar is off or one is configured."""
    terminal = sys.stdout.isatty() if is_terminal is None else is_terminal
    if config.get("enable_progress_bar") is False or terminal:
        return callbacks
    if any(isinstance(c, (ProgressBar, ProgressLines)) for c in configured + callbacks):
        return callbacks
    config["enable_progress_bar"] = False
    return [*callbacks, ProgressLines()]


def compact_summary(trainer: Any, configured: list[Any]) -> None:
    """Replace the ModelSummary that Lightning added by default (not one the config names) with
    :class:`CompactModelSummary`."""
    mine = {id(c) for c in configured}
    trainer.callbacks[:] = [
        CompactModelSummary() if type(c) in (ModelSummary, RichModelSummary) and id(c) not in mine else c
        for c in trainer.callbacks
    ]


def iteration_limit(config: dict[str, Any], callbacks: list[Any], max_iterations: int | None) -> list[Any]:
    """``callbacks`` plus :class:`IterationLimit` for ``--max_iterations``, with the trainer's
    ``max_steps`` (in ``config``) lifted so that it does not stop the run first."""
    if max_iterations is None:
        return callbacks
    limit = IterationLimit(max_iterations)  # raises for < 1
    steps = config.get("max_steps")
    if steps is not None and steps > 0:
        rank_zero_info(
            f"--max_iterations {max_iterations} counts training iterations; --trainer.max_steps {steps} "
            "(optimizer steps) does not apply"
        )
    config["max_steps"] = -1
    if config.get("max_epochs") is None:
        config["max_epochs"] = -1  # the limit is the iteration count; no "1000 epochs" default or warning
    return [*callbacks, limit]


def loggers_in_run_folder(loggers: Any, root: Path) -> None:
    """Loggers (the parsed ``--trainer.logger``) left at defaults that write into the working
    directory write into the run folder ``root`` instead: a ``WandbLogger``'s ``save_dir``, an
    ``MLFlowLogger``'s ``artifact_location`` (its images and tables, ``<root>/mlflow_artifacts``;
    the metrics go to its tracking store). Either run is named after the folder unless it is given
    a name (W&B's ``name``, MLflow's ``run_name``), not a random one."""
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        args = logger.get("init_args") if isinstance(logger, Namespace) else None
        if not isinstance(args, Namespace):
            continue
        kind = str(logger.get("class_path", "")).rsplit(".", 1)[-1]
        if kind == "WandbLogger":
            if args.get("save_dir") in (None, ".") and args.get("dir") is None:
                args["save_dir"] = str(root)
            if args.get("name") is None:
                args["name"] = root.name
        elif kind == "MLFlowLogger":
            if args.get("artifact_location") is None:
                args["artifact_location"] = str((root / "mlflow_artifacts").resolve())
            if args.get("run_name") is None:
                args["run_name"] = root.name
