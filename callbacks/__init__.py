"""Lightning callbacks of lit_treegrpo, installed as ``lit_treegrpo.callbacks``.

May import: :mod:`lit_treegrpo.core`, :mod:`lit_treegrpo.artifacts` (the export), :mod:`lit_treegrpo.common`
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
