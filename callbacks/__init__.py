"""Lightning callbacks of lit_treegrpo, installed as ``lit_treegrpo.callbacks``.

- :class:`PruningSchedule`: BranchGRPO's width pruning for a fraction of training and sliding
  depth window, DanceGRPO's step fraction: hands the pure schedule (``core.PruningSchedule``) to the
  module, which evaluates it each iteration; ``model.pruning`` is never overwritten.
- :class:`EMA`: moving average of the trainable (LoRA) parameters only, swapped in for validation
  (and test / predict from a checkpoint) and sample grids.
- :class:`SampleGridLogger`: fixed prompts x seeds, deterministic sampling, one TensorBoard grid
  every N steps (and a PNG), captioned with the prompts and each image's reward.
- :class:`TreeView`: one fixed prompt's rollout tree (leaves by branch, rewards, advantages, pruned
  edges) drawn every N steps, to TensorBoard and ``samples/tree_*.png``.
- :class:`RewardMetrics`: reward mean / std / max / min and per component, per step, epoch and
  validation, synchronised across ranks; best / worst prompts; within-prompt image diversity.

- :class:`ProgressLines`: plain progress lines (iteration, reward, held-out reward, s/it, ETA) for a
  log file; the CLI uses it instead of the bar when stdout is not a terminal.
  :class:`CompactModelSummary`: the start-up parameter counts without Lightning's always-zero FLOPs.
- :class:`ExportOnTrainEnd`: the ``export`` command's output (LoRA or merged weights, EMA, card)
  written when a fit ends.
- :class:`IterationLimit`: stop a fit after N training iterations (``--max_iterations``);
  :func:`run_iterations` is the run length in iterations for the callbacks that need it.

- :class:`CheckpointOnInterrupt`: SIGTERM or a first Ctrl-C stops a fit after the step in flight
  and writes ``last.ckpt``; validate / test / predict stop before their next batch and write
  nothing (the CLI adds it to every trainer).
- :class:`KeepLastCheckpoint`: ``last.ckpt`` holds a fit's final state however it ends, and a
  moved or copied run folder resumes into its own ``last.ckpt`` (the CLI adds it beside every
  ``ModelCheckpoint``).

Every callback is resumable through ``state_dict`` / ``load_state_dict``. The folder sits at the
repository top level (the design card) and pyproject's ``package-dir`` maps it into the package;
always import it as ``lit_treegrpo.callbacks``.

May import: :mod:`lit_treegrpo.core`, :mod:`lit_treegrpo.runs` (the export), :mod:`lit_treegrpo.common`
(the prompt checks), torch and Lightning;
never the module (the callbacks reach it through the ``pl_module`` Lightning hands them) or the
command line, which installs them.
"""

from .ema import EMA
from .export import ExportOnTrainEnd
from .interrupt import CheckpointOnInterrupt
from .iterations import IterationLimit, run_iterations
from .last_checkpoint import KeepLastCheckpoint
from .progress import CompactModelSummary, ProgressLines
from .pruning import PruningSchedule
from .reward_metrics import RewardMetrics, RewardStats, SampleDiversity
from .sample_grid import SampleGridLogger, make_grid
from .tree_view import TreeView

__all__ = [
    "EMA",
    "CheckpointOnInterrupt",
    "CompactModelSummary",
    "ExportOnTrainEnd",
    "IterationLimit",
    "KeepLastCheckpoint",
    "ProgressLines",
    "PruningSchedule",
    "RewardMetrics",
    "RewardStats",
    "SampleDiversity",
    "SampleGridLogger",
    "TreeView",
    "make_grid",
    "run_iterations",
]
