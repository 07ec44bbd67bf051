"""Resume rules (docs/configs.md#what-a-resume-may-change): options that shape the weights are
refused in one line naming the option and the checkpoint's value; the optimizer's and scheduler's
options are applied over the restored states and announced."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_treegrpo.resume import configured_options, retune
from tests.test_cli import _log_to_this_stderr

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "tiny.yaml"
FIT = ["fit", "--config", str(TINY), "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary",
       "false", "--trainer.limit_val_batches", "0", "--trainer.logger", "false"]  # fmt: skip


def _fit(root: Path, steps: int, *args: str) -> None:
    from lit_treegrpo.cli import main

    main([*FIT, "--trainer.max_steps", str(steps), "--trainer.default_root_dir", str(root), *args])


def _last(root: Path) -> dict:
    return torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def test_a_resume_applies_a_new_learning_rate_and_says_so(tmp_path: Path, caplog) -> None:
    _fit(tmp_path, 1)
    assert {g["lr"] for g in _last(tmp_path)["optimizer_states"][0]["param_groups"]} == {0.01}
    caplog.clear()
    with caplog.at_level("INFO"):
        _fit(tmp_path, 2, "--ckpt_path", "last", "--model.optimizer.init_args.lr", "0.5",
             "--model.optimizer.init_args.weight_decay", "0.1")  # fmt: skip
    said = [r.getMessage() for r in caplog.records if "the optimizer resumes with this run's options" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "--model.optimizer.init_args.lr 0.01 -> 0.5" in said[0]
    assert "--model.optimizer.init_args.weight_decay 0.0 -> 0.1" in said[0]
    saved = _last(tmp_path)
    assert saved["lit_treegrpo"]["iteration"] == 2
    groups = saved["optimizer_states"][0]["param_groups"]
    assert {g["lr"] for g in groups} == {0.5} and {g["weight_decay"] for g in groups} == {0.1}
    # the run's config record says what the optimizer ran with
    assert "lr: 0.5" in (tmp_path / "config-2.yaml").read_text()


def test_a_resume_announces_each_changed_option_in_one_line(tmp_path: Path, caplog) -> None:
    _fit(tmp_path, 1)
    caplog.clear()
    with caplog.at_level("INFO"):
        _fit(tmp_path, 2, "--ckpt_path", "last", "--data.batch_size", "1")
    said = [r.getMessage() for r in caplog.records if "resumed with changed options" in r.getMessage()]
    assert said == ["resumed with changed options: --data.batch_size 2 -> 1; --trainer.max_steps 1 -> 2"], caplog.text
    assert "the optimizer resumes" not in caplog.text  # its options did not change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--model.adapter.init_args.lora.rank", "8"],
         "error: --model.adapter.init_args.lora.rank: the checkpoint was trained with 32, this run has 8; resume with 32"),
        (["--model.adapter.init_args.lora.alpha", "16"],
         "error: --model.adapter.init_args.lora.alpha: the checkpoint was trained with 64.0, this run has 16.0"),
        (["--model.reward", "jpeg_compressibility"],
         "error: --model.reward / --model.reward_kwargs: the checkpoint was trained with {'reward': 'brightness'"),
    ],
)  # fmt: skip
def test_a_resume_that_changes_what_the_weights_are_is_refused_naming_the_option(
    tmp_path: Path, capsys, monkeypatch, change: list[str], message: str
) -> None:
    from lit_treegrpo.cli import DEBUG_ENV

    monkeypatch.delenv(DEBUG_ENV, raising=False)
    _log_to_this_stderr(monkeypatch)
    _fit(tmp_path, 1)
    before = _last(tmp_path)["lit_treegrpo"]["iteration"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        _fit(tmp_path, 2, "--ckpt_path", "last", *change)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith(message), err
    assert "Traceback" not in err and "size mismatch" not in err
    assert "start a new run instead" in lines[-1]
    assert _last(tmp_path)["lit_treegrpo"]["iteration"] == before  # nothing trained, nothing written


def test_retune_keeps_a_scheduled_rate_at_its_place_in_the_schedule() -> None:
    """A run with a scheduler: the new base rate replaces the old in the scheduler's state, and the
    group's current rate is scaled by new / old base (hand-computed: 0.01 -> 0.02 at factor 0.5)."""
    param = torch.nn.Parameter(torch.zeros(2))
    old = torch.optim.AdamW([param], lr=0.01)
    old_scheduler = torch.optim.lr_scheduler.StepLR(old, step_size=1, gamma=0.5)
    old.step()
    old_scheduler.step()  # lr 0.005
    checkpoint = {"optimizer_states": [old.state_dict()], "lr_schedulers": [old_scheduler.state_dict()]}

    def make_optimizer(params):
        return torch.optim.AdamW(params, lr=0.02)

    def make_scheduler(optimizer):
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)

    changes = retune(checkpoint, *configured_options(make_optimizer, make_scheduler))
    assert changes == ["--model.optimizer.init_args.lr 0.01 -> 0.02", "--model.lr_scheduler.init_args.step_size 1 -> 3"]
    new = torch.optim.AdamW([param], lr=0.02)
    scheduler = torch.optim.lr_scheduler.StepLR(new, step_size=3, gamma=0.5)
    new.load_state_dict(checkpoint["optimizer_states"][0])
    scheduler.load_state_dict(checkpoint["lr_schedulers"][0])
    assert new.param_groups[0]["lr"] == pytest.approx(0.01)  # 0.005 x 0.02 / 0.01
    assert scheduler.base_lrs == [0.02] and scheduler.step_size == 3 and scheduler.last_epoch == 1
    for _ in range(2):
        new.step()
        scheduler.step()
    # StepLR is chainable: at epoch 3 it halves the rate the group has (0.01), as it would have
    # halved the old schedule's; nothing restores the checkpoint's base rate
    assert new.param_groups[0]["lr"] == pytest.approx(0.005)


def test_retune_of_unchanged_options_changes_nothing() -> None:
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.AdamW([param], lr=0.01, weight_decay=0.0)
    checkpoint = {"optimizer_states": [optimizer.state_dict()], "lr_schedulers": []}
    before = repr(checkpoint)
    changes = retune(checkpoint, *configured_options(lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.0), None))
    assert changes == [] and repr(checkpoint) == before
