"""Every logger keeps the fit's configuration, not only TensorBoard's folder.

:class:`~lit_treegrpo.artifacts.run_folder.RunConfigRecord` writes the record (``config.yaml``, then
``config-2.yaml`` ... for resumed fits) once the first training step has completed. Lightning puts it
in the first logger's folder, and a logger without a local folder (MLflow with a database or server
store) gets none. :class:`LoggedConfigRecord` adds:

- the record's folder: the first logger's own run folder when it is TensorBoard's or CSV's (as
  before: ``<root>/tensorboard/``), else the run folder ``--trainer.default_root_dir`` itself, so
  that every fit leaves its record on disk whatever the logger;
- the configuration handed to every logger but the run's TensorBoard (whose folder holds the
  record): as hyper-parameters (CSV's ``hparams.yaml``, W&B's run config, MLflow's params, one per
  option, flattened to ``trainer/callbacks/0/class_path`` ... so that no value exceeds MLflow's
  250 characters), and to MLflow also the record file itself, as an artefact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from ..artifacts.run_folder import RunConfigRecord, RunTensorBoardLogger


def flat_config(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested configuration (mappings and lists) as one level of ``a/b/0/c`` keys; an empty
    mapping or list stays a value of its own, so that every option is there."""
    if isinstance(value, dict) and value:
        items: Any = value.items()
    elif isinstance(value, list) and value:
        items = enumerate(value)
    else:
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, item in items:
        flat.update(flat_config(item, f"{prefix}/{key}" if prefix else str(key)))
    return flat


class LoggedConfigRecord(RunConfigRecord):
    """The run's config record, in a folder of the run whatever the logger, and handed to every
    logger (see the module docstring)."""

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.state.fn == TrainerFn.FITTING and self.save_to_log_dir and self._folder is None:
            first = trainer.loggers[0] if trainer.loggers else None
            own_folder = isinstance(first, (TensorBoardLogger, CSVLogger))
            # log_dir is a collective call, so every rank makes it
            self._folder = trainer.log_dir if own_folder else trainer.strategy.broadcast(trainer.default_root_dir)

    @override
    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        config = yaml.safe_load(self.parser.dump(self.config, skip_none=False))
        for logger in trainer.loggers:
            if isinstance(logger, RunTensorBoardLogger):
                continue  # its folder holds the record itself
            if isinstance(logger, MLFlowLogger):
                logger.log_hyperparams(flat_config(config))
                if self.written_to is not None:
                    logger.experiment.log_artifact(logger.run_id, str(Path(self.written_to)))
            else:
                logger.log_hyperparams(config)
