"""Rule 6 (docs/failure_modes.md): advice names only what it has checked, and the option that fixes
the problem for the command that was run (a corrupt checkpoint's neighbours: tests/cli/test_cli.py
and tests/artifacts/test_checkpoint.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_cli import QUIET, TINY, _main_error

REPO = Path(__file__).resolve().parents[2]
CHECKPOINT = REPO / "tests" / "checkpoints" / "tiny_sd3_step2.ckpt"  # TinySD3Adapter's
SD15 = ["--model.adapter", "lit_treegrpo.models.tiny.TinySD15Adapter", "--model.adapter.init_args.num_steps", "4"]


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
def test_loading_a_checkpoint_into_another_adapter_gives_that_commands_fix_not_resume_advice(
    tmp_path: Path, capsys, monkeypatch, no_model, command: str
) -> None:
    line = _main_error(monkeypatch, capsys, command, "--config", str(TINY), *QUIET, *SD15, "--ckpt_path", str(CHECKPOINT),
                       "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert line.startswith(
        f"error: --model.adapter: the checkpoint {CHECKPOINT} was trained with TinySD3Adapter, this run has "
        "TinySD15Adapter; give --model.adapter TinySD3Adapter as the run did"
    ), line
    assert "resume" not in line and "--overwrite" not in line
    assert not any(tmp_path.iterdir())  # before any model loads, nothing written


def test_a_resumed_fit_keeps_the_resume_advice(tmp_path: Path, capsys, monkeypatch, no_model) -> None:
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, *SD15, "--ckpt_path", str(CHECKPOINT),
                       "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert (
        "resume with TinySD3Adapter, or start a new run (--overwrite true or another --trainer.default_root_dir)"
        in line
    )


@pytest.mark.parametrize(
    ("model", "adapter"),
    [(["--config", str(REPO / "configs" / "sd15.yaml")], "SD15Adapter"), (SD15[:2], "TinySD15Adapter")],
)
def test_a_flow_matching_preset_on_sd15_says_it_needs_a_flow_matching_adapter(
    tmp_path: Path, capsys, monkeypatch, no_model, model: list[str], adapter: str
) -> None:
    preset = REPO / "configs" / "methods" / "dancegrpo.yaml"
    # its weights in place and a reward without an extra (a missing model, then a missing extra, are
    # reported first: tests/cli/test_first_checks.py)
    (tmp_path / "sd15").mkdir()
    (tmp_path / "sd15" / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline"}')
    weights = ["--model.adapter.init_args.pretrained", str(tmp_path / "sd15"), "--model.reward", "brightness"]
    weights = weights if "sd15.yaml" in str(model) else []
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *model, *weights, "--config", str(preset),
                       *QUIET, "--trainer.default_root_dir", str(tmp_path / "run"))  # fmt: skip
    assert line.startswith(
        f"error: --model.adapter.init_args.dynamics: {adapter} takes no option 'dynamics'; {preset} sets it, and "
        "needs a flow-matching adapter (one that takes it: SD3Adapter, FluxAdapter"
    ), line
    assert "give one as --model.adapter, or leave dynamics out" in line


def test_a_misspelt_adapter_option_still_gets_its_did_you_mean(tmp_path: Path, capsys, monkeypatch, no_model) -> None:
    line = _main_error(monkeypatch, capsys, "fit", "--config", str(TINY), *QUIET, *SD15[:2], "--model.adapter.init_args.num_step",
                       "4", "--trainer.default_root_dir", str(tmp_path))  # fmt: skip
    assert "TinySD15Adapter takes no option 'num_step'; did you mean num_steps?" in line, line
