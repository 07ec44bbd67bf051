"""What a new user meets on the command line: Lightning's own --optimizer / --lr_scheduler refused
in one line naming the module's option; a Ctrl-C said as such, not as SIGTERM; a resume without
Lightning's warning about its checkpoint folder; no Trainer the project builds advertising a
logging service."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.cli.helpers import one_error_line

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny.yaml"
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


@pytest.mark.parametrize(
    ("args", "option", "fix"),
    [
        (["--optimizer", "SGD"], "--optimizer", "--model.optimizer"),
        (["--optimizer.lr", "0.1"], "--optimizer.lr", "--model.optimizer"),
        (["--lr_scheduler", "StepLR"], "--lr_scheduler", "--model.lr_scheduler"),
        (["--config", "OPTIMIZER_FILE"], "--optimizer.class_path", "--model.optimizer"),
    ],
)
def test_lightnings_optimizer_options_are_refused_naming_the_modules(
    tmp_path: Path, capsys, monkeypatch, no_model, args: list[str], option: str, fix: str
) -> None:
    (tmp_path / "optimizer.yaml").write_text("optimizer:\n  class_path: torch.optim.SGD\n")
    args = [str(tmp_path / "optimizer.yaml") if a == "OPTIMIZER_FILE" else a for a in args]
    line = one_error_line(capsys, monkeypatch, "fit", "--config", str(TINY), *args, "--trainer.default_root_dir",
                  str(tmp_path / "run"))  # fmt: skip
    assert line.startswith(f"error: {option}") and "not an option of this command line" in line, line
    assert "the module builds its" in line and f"from {fix} (e.g. {fix} torch.optim." in line, line


def test_fit_help_lists_no_optimizer_option_beside_the_modules(capsys) -> None:
    from lit_treegrpo.cli import main

    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = capsys.readouterr().out
    assert "--model.optimizer OPTIMIZER" in text
    assert "  --optimizer " not in text and "  --lr_scheduler " not in text


def _signal_records(message: str) -> list[str]:
    """What Lightning's signal logger lets through when it logs ``message``."""
    from lit_treegrpo.cli.run_output import SIGNAL_LOGGER

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger, keep = logging.getLogger(SIGNAL_LOGGER), Keep()
    logger.addHandler(keep)
    level, logger.level = logger.level, logging.INFO
    try:
        logger.info(message)
    finally:
        logger.removeHandler(keep)
        logger.setLevel(level)
    return seen


def test_a_ctrl_c_is_not_reported_as_a_sigterm_and_a_real_sigterm_is() -> None:
    from lit_treegrpo.callbacks import CheckpointOnInterrupt
    from lit_treegrpo.cli.run_output import report_interrupts

    interrupt = CheckpointOnInterrupt()
    report_interrupts([interrupt])
    # a SIGTERM from outside (a pre-empted node, kill): Lightning's line stays
    assert _signal_records("[rank: 0] Received SIGTERM: 15") == ["[rank: 0] Received SIGTERM: 15"]
    # a first Ctrl-C: the callback said "Ctrl-C: stopping ..." and sent the SIGTERM itself
    interrupt._stopping = True  # what its SIGINT handler sets before it signals the process
    assert _signal_records("[rank: 0] Received SIGTERM: 15") == []
    assert _signal_records("Requeued SLURM job 1") == ["Requeued SLURM job 1"]  # nothing else is dropped


def test_a_resume_prints_no_warning_about_the_checkpoint_folder(tmp_path: Path) -> None:
    from lit_treegrpo.cli import main

    run = ["fit", "--config", str(TINY), *QUIET, "--trainer.limit_val_batches", "0",
           "--trainer.default_root_dir", str(tmp_path)]  # fmt: skip
    main([*run, "--trainer.max_steps", "1"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main([*run, "--trainer.max_steps", "2", "--ckpt_path", "last"])
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "exists and is not empty" in m], messages
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize("import_package", [True, False], ids=["with the package", "Lightning alone"])
def test_no_trainer_built_after_importing_the_package_advertises_a_logging_service(import_package: bool) -> None:
    code = (
        ("import lit_treegrpo\n" if import_package else "") + "import logging, lightning.pytorch as pl\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, accelerator='cpu')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    out = done.stdout + done.stderr
    assert ("litlogger" in out) is not import_package, out  # Lightning alone prints it: the filter is what stops it
    assert "GPU available" in out  # the other lines of that logger are kept
