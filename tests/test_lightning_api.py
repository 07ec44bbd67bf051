"""The private Lightning API this project overrides or reads, pinned here. The members the package
reads are named once, in lit_treegrpo/common/lightning_private.py (each function there names its
test below); the LightningCLI overrides live in cli/app.py and the TensorBoard logger's in
artifacts/run_folder.py, where a subclass needs them.

Lightning does not promise these across releases (pyproject caps ``lightning`` at the newest minor
version tested). Each test pins one of them: it exists in the installed Lightning with the
signature our code assumes, and Lightning itself still calls it where we rely on that, so an
upgrade that moves one fails here, naming it, instead of somewhere in a run (or silently: the FSDP
guard skips a missing ``_lazy_load``). Two private names of other packages that the same code uses
(argparse's ``_actions``, tensorboard's ``_get_file_writer``) are pinned at the end.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint, ModelSummary
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import ModelParallelStrategy, Strategy, fsdp

from lit_treegrpo.cli.app import TreeGRPOCLI


def _parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


# ------------------------------------------------------------------------ LightningCLI (cli/app.py)
#: the private LightningCLI methods TreeGRPOCLI overrides, with the parameters Lightning passes
CLI_OVERRIDES = {
    "_add_subcommands": ["self", "parser", "kwargs"],  # export's options from ExportCommand.export
    "_prepare_subcommand_parser": ["self", "klass", "subcommand", "kwargs"],  # --raw_weights, --overwrite
    "_parse_ckpt_path": ["self"],  # --ckpt_path read once, safely, before any model loads
    "_instantiate_trainer": ["self", "config", "callbacks"],  # fixed run folders, atomic checkpoints
    "_run_subcommand": ["self", "subcommand"],  # export; a SIGTERM during validate/test/predict
}


@pytest.mark.parametrize("name", sorted(CLI_OVERRIDES))
def test_the_private_lightning_cli_methods_we_override_exist_and_are_called(name: str) -> None:
    assert name in vars(TreeGRPOCLI), f"TreeGRPOCLI no longer overrides {name}: drop it from this list"
    original = getattr(LightningCLI, name, None)
    assert original is not None, f"LightningCLI.{name} is gone: TreeGRPOCLI.{name} is never called"
    assert _parameters(original) == CLI_OVERRIDES[name], f"LightningCLI.{name}{inspect.signature(original)}"
    assert _parameters(getattr(TreeGRPOCLI, name)) == CLI_OVERRIDES[name]
    # Lightning's own code still calls it (else the override would be dead code)
    assert f"self.{name}(" in inspect.getsource(LightningCLI), f"LightningCLI no longer calls self.{name}"


def test_lightning_cli_reads_the_subcommand_parsers_that_our_add_subcommands_fills() -> None:
    # TreeGRPOCLI._add_subcommands fills self._subcommand_parsers as Lightning's does, and
    # LightningCLI._parser (which the config saving and instantiation use) reads it back
    assert "self._subcommand_parsers[subcommand]" in inspect.getsource(LightningCLI._parser)
    assert "self._subcommand_parsers[name] = " in inspect.getsource(TreeGRPOCLI._add_subcommands)
    assert set(LightningCLI.subcommands()) == {"fit", "validate", "test", "predict"}


# ------------------------------------------------------------------------ checkpoints (artifacts/checkpoint.py)
def test_the_fsdp_strategy_still_unpickles_through_the_lazy_load_our_guard_replaces() -> None:
    # guard_strategy_load swaps fsdp._lazy_load for a weights_only read; it skips the swap when the
    # name is gone, so its disappearance would silently restore an unrestricted unpickler
    assert callable(getattr(fsdp, "_lazy_load", None)), "lightning.pytorch.strategies.fsdp._lazy_load is gone"
    assert _parameters(fsdp._lazy_load)[:1] == ["filename"]
    assert "_lazy_load(" in inspect.getsource(fsdp.FSDPStrategy.load_checkpoint)


def test_strategy_load_checkpoint_takes_weights_only() -> None:
    # guard_strategy_load wraps it as load_checkpoint(checkpoint_path, weights_only=None)
    assert _parameters(Strategy.load_checkpoint) == ["self", "checkpoint_path", "weights_only"]


def test_the_local_file_check_of_the_atomic_checkpoint_io_exists() -> None:
    from lightning.fabric.utilities.cloud_io import _is_local_file_protocol

    assert _parameters(_is_local_file_protocol) == ["path"]
    assert _is_local_file_protocol("/a/b.ckpt") and not _is_local_file_protocol("s3://bucket/b.ckpt")


# ------------------------------------------------------------------------ ModelCheckpoint (callbacks/last_checkpoint.py)
def test_the_model_checkpoint_members_keep_last_checkpoint_reads() -> None:
    callback = ModelCheckpoint(save_last=True)
    assert callback._last_checkpoint_saved == "" and callback._last_global_step_saved == 0
    assert _parameters(ModelCheckpoint._save_last_checkpoint) == ["self", "trainer", "monitor_candidates"]
    assert _parameters(ModelCheckpoint._monitor_candidates) == ["self", "trainer"]
    source = inspect.getsource(ModelCheckpoint)
    assert "self._last_checkpoint_saved = " in source and "self._last_global_step_saved = " in source


# ------------------------------------------------------------------------ the module and the loggers
def test_model_parallel_strategy_keeps_the_distributed_checkpoint_flag_the_module_reads() -> None:
    # TreeGRPOModule.configure_model refuses save_distributed_checkpoint=True through it
    assert ModelParallelStrategy(save_distributed_checkpoint=True)._save_distributed_checkpoint is True
    assert ModelParallelStrategy(save_distributed_checkpoint=False)._save_distributed_checkpoint is False


def test_validation_inside_a_fit_uses_the_loop_members_we_call() -> None:
    # lightning_private.validate_inside_fit does what the training epoch loop does around a validation
    from lightning.pytorch.loops import _TrainingEpochLoop
    from lightning.pytorch.trainer.connectors.logger_connector import _LoggerConnector

    assert "self.val_loop.run()" in inspect.getsource(_TrainingEpochLoop)
    assert "self._first_loop_iter" in inspect.getsource(_LoggerConnector)


def test_a_lightning_module_without_a_trainer_has_a_none_trainer_attribute() -> None:
    # the module reads self._trainer to tell "not attached" apart (self.trainer raises then)
    assert LightningModule()._trainer is None


def test_the_tensorboard_logger_members_our_deferred_logger_sets_and_reads(tmp_path: Path) -> None:
    # RunTensorBoardLogger.experiment fills _experiment and opens its writer with _fs and _kwargs
    logger = TensorBoardLogger(save_dir=str(tmp_path), name="tensorboard", version="", flush_secs=7)
    assert logger._experiment is None and logger._kwargs == {"flush_secs": 7}
    assert callable(logger._fs.makedirs)
    assert "self._experiment" in inspect.getsource(TensorBoardLogger.experiment.fget)


def test_the_model_summary_hook_compact_model_summary_overrides() -> None:
    from lit_treegrpo.callbacks import CompactModelSummary

    expected = [
        "summary_data",
        "total_parameters",
        "trainable_parameters",
        "model_size",
        "total_training_modes",
        "total_flops",
        "summarize_kwargs",
    ]
    assert _parameters(ModelSummary.summarize) == expected
    assert _parameters(CompactModelSummary.summarize)[:-1] == expected[:-1]


# ------------------------------------------------------------------------ other packages' private names
def test_argparse_actions_hold_the_options_the_cli_edits_and_lists() -> None:
    # add_arguments_to_parser rewrites --trainer.max_steps's help; one-line errors list every option
    parser = LightningArgumentParser()
    parser.add_argument("--max_iterations", type=int, default=None, help="help")
    action = next(a for a in parser._actions if a.dest == "max_iterations")
    assert action.option_strings == ["--max_iterations"] and action.help == "help"


def test_the_tensorboard_writer_gives_its_file_writer_for_gif_summaries(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path))
    try:
        assert callable(writer._get_file_writer().add_summary)
    finally:
        writer.close()


def test_jsonargparse_reports_errors_through_the_method_our_parser_overrides() -> None:
    # OneLineParser.error(message, ex) turns a parse error into one line
    from jsonargparse import ArgumentParser

    from lit_treegrpo.cli.user_errors import OneLineParser

    assert _parameters(ArgumentParser.error) == _parameters(OneLineParser.error) == ["self", "message", "ex"]
