"""The resume rules (docs/configs.md, "Resume rules"): a resumed fit applies the options it may
change and says so, and refuses, in one line naming the option and the checkpoint's value, those
that shaped the weights."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from lit_treegrpo.artifacts.run_folder import event_folder
from lit_treegrpo.core import TreeSpec
from lit_treegrpo.data import PromptDataModule
from lit_treegrpo.models.lora import LoraSettings
from lit_treegrpo.models.tiny import TinySD3Adapter
from lit_treegrpo.rewards import Brightness
from lit_treegrpo.training.module import TreeGRPOModule
from lit_treegrpo.training.resume import ConfiguredOptimizer, apply_optimizer_options, check_resumable
from tests.cli.test_cli import QUIET, TINY, _main_error, snapshot
from tests.probes import FlakyReward

NEW_RUN = "start a new run (--overwrite true or another --trainer.default_root_dir)"
BASE = ["fit", "--config", str(TINY), *QUIET, "--trainer.limit_val_batches", "0"]


def _fit(root: Path, *args: str) -> None:
    from lit_treegrpo.cli import main

    main([*BASE, "--trainer.default_root_dir", str(root), *args])


@pytest.fixture(scope="module")
def one_step(tmp_path_factory) -> Path:
    """A run folder of configs/tiny.yaml after one training step (lr 0.01, LoRA rank 32,
    brightness), shared by the tests that are refused and so write nothing (each checks it)."""
    root = tmp_path_factory.mktemp("one_step")
    _fit(root, "--trainer.max_steps", "1")
    return root


def _forbid_models(monkeypatch) -> None:
    """From here on, building a tiny model fails the test: a refusal must come before any loads."""
    from lit_treegrpo.models import tiny

    def never(*args, **kwargs):
        raise AssertionError("a model was built before the resume was refused")

    monkeypatch.setattr(tiny, "tiny_sd3_pipeline", never)
    monkeypatch.setattr(tiny, "tiny_sd15_pipeline", never)


def test_a_resume_applies_the_options_it_may_change_and_says_so(tmp_path: Path, caplog) -> None:
    # (its own run: a run folder copied elsewhere would resume into last-v1.ckpt, Lightning's
    # ModelCheckpoint not reloading its state for another folder)
    root = tmp_path
    _fit(root, "--trainer.max_steps", "1")
    ckpt = root / "checkpoints" / "last.ckpt"
    assert [g["lr"] for g in torch.load(ckpt, weights_only=True)["optimizer_states"][0]["param_groups"]] == [0.01]
    with caplog.at_level(logging.INFO):
        # 1 optimizer step done; 2 more = one iteration of 2 minibatches. The adapter's memory
        # knobs may change too (said nowhere: they change nothing the run computes)
        _fit(root, "--trainer.max_steps", "3", "--ckpt_path", "last", "--model.optimizer.init_args.lr", "0.5",
             "--model.minibatches", "2", "--model.adapter.init_args.decode_batch_size", "1",
             "--model.adapter.init_args.gradient_checkpointing", "true")  # fmt: skip
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resumed with")]
    assert said == [
        "resumed with lr 0.5 (the checkpoint trained at 0.01), --model.minibatches 2 (the checkpoint trained with 1)"
    ]
    after = torch.load(ckpt, weights_only=True)
    assert after["global_step"] == 3 and after["lit_treegrpo"]["iteration"] == 2
    # Lightning restored the checkpoint's param groups (lr 0.01); the run trained, and saved, at 0.5
    assert [g["lr"] for g in after["optimizer_states"][0]["param_groups"]] == [0.5]
    # and the resumed fit's config record says what it ran with
    record = yaml.safe_load((root / "tensorboard" / "config-2.yaml").read_text())
    assert record["model"]["optimizer"]["init_args"]["lr"] == 0.5 and record["model"]["minibatches"] == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ["--model.adapter.init_args.lora.rank", "8"],
            "--model.adapter.init_args.lora.rank: the checkpoint {ckpt} was trained with 32, this run has 8; resume with 32",
        ),
        (
            ["--model.reward", "jpeg_compressibility"],
            "--model.reward: the checkpoint {ckpt} was trained with brightness, this run has jpeg_compressibility; resume with brightness",
        ),
        (
            ["--model.reward", "{brightness: 1.0, jpeg_compressibility: 0.5}"],
            "--model.reward: the checkpoint {ckpt} was trained with brightness, this run has {brightness: 1.0, jpeg_compressibility: 0.5}",
        ),
        (
            ["--model.adapter.init_args.guidance_scale", "2.0"],
            "--model.adapter.init_args.guidance_scale: the checkpoint {ckpt} was trained with 1.0, this run has 2.0",
        ),
        (
            ["--model.advantage.method", "logprob_softmax"],
            "--model.advantage.method: the checkpoint {ckpt} was trained with mean, this run has logprob_softmax",
        ),
        (
            ["--model.loss", "lit_treegrpo.core.ClippedPolicyLoss", "--model.loss.init_args.clip_range", "0.01"],
            "--model.loss.init_args.clip_range: the checkpoint {ckpt} was trained with 0.0001, this run has 0.01",
        ),
        (["--model.seed", "7"], "--model.seed: the checkpoint {ckpt} was trained with 0, this run has 7"),
        (
            ["--model.optimizer", "torch.optim.SGD"],
            "--model.optimizer: the checkpoint {ckpt} was trained with AdamW, this run has SGD",
        ),
    ],
    ids=["lora_rank", "reward", "reward_mix", "guidance", "advantage", "loss", "seed", "optimizer_class"],
)
def test_a_resume_that_changes_what_shaped_the_weights_is_refused_before_the_model_loads(
    one_step: Path, capsys, monkeypatch, change: list[str], message: str
) -> None:
    root = one_step
    before = snapshot(root)
    _forbid_models(monkeypatch)
    line = _main_error(monkeypatch, capsys, *BASE, "--trainer.max_steps", "2", "--ckpt_path", "last", *change,
                       "--trainer.default_root_dir", str(root))  # fmt: skip
    assert line.startswith("error: " + message.replace("{ckpt}", str(root / "checkpoints" / "last.ckpt"))), line
    assert f", or {NEW_RUN}  (set LIT_TREEGRPO_DEBUG=1" in line, line
    assert snapshot(root) == before  # no config record, event file or lock


# ------------------------------------------------------------------------ without the CLI
def _data() -> PromptDataModule:
    return PromptDataModule("shapes", batch_size=2, val_size=2)


def _trainer(root: Path, steps: int, **kwargs) -> L.Trainer:
    kwargs.setdefault("limit_val_batches", 0)
    return L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        **kwargs,
    )


def _module(**kwargs) -> TreeGRPOModule:
    adapter = TinySD3Adapter(num_steps=3, guidance_scale=1.0, lora=kwargs.pop("lora", LoraSettings()))
    kwargs.setdefault("reward", Brightness())
    return TreeGRPOModule(adapter, tree=TreeSpec(3, branch_steps=(0, 1), branching=2), **kwargs)


def test_an_old_checkpoint_resumed_with_another_lora_rank_is_refused_by_name(tmp_path: Path) -> None:
    # tests/checkpoints/tiny_sd3_step2.ckpt predates the recorded LoRA settings and shapes: the
    # rank is read off its lora_A / lora_B tensors, before load_state_dict's size-mismatch traceback
    from tests.checkpoints import make_tiny_checkpoint as made

    committed = Path(made.__file__).with_name(made.NAME)
    model = made.model()
    model.adapter = TinySD3Adapter(num_steps=3, guidance_scale=1.0, lora=LoraSettings(rank=8, alpha=16.0))
    with pytest.raises(ValueError) as err:
        made.trainer(tmp_path, 4, enable_checkpointing=False).fit(model, made.data(), ckpt_path=committed)
    assert str(err.value) == (
        f"--model.adapter.init_args.lora.rank: the checkpoint {committed} was trained with 32, "
        f"this run has 8; resume with 32, or {NEW_RUN}"
    )
    assert model.iteration == 0


def test_another_reward_is_refused_for_a_resumed_fit_and_allowed_for_validate(tmp_path: Path) -> None:
    checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    _trainer(tmp_path, 1, callbacks=[checkpoint]).fit(_module(), _data())
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    other = _module(reward=FlakyReward())
    with pytest.raises(ValueError) as err:
        _trainer(tmp_path, 2, enable_checkpointing=False).fit(other, _data(), ckpt_path=ckpt)
    assert str(err.value) == (
        f"--model.reward: the checkpoint {ckpt} was trained with Brightness, this run has "
        f"FlakyReward; resume with Brightness, or {NEW_RUN}"
    )
    # evaluating the trained weights with another reward is no resume
    _trainer(tmp_path, 1, enable_checkpointing=False, limit_val_batches=1).validate(other, _data(), ckpt_path=ckpt)
    assert other.iteration == 1


def test_a_new_lr_under_a_scheduler_becomes_its_base_lr(tmp_path: Path) -> None:
    # LambdaLR computes lr = base_lr * f(epoch): restored as saved, its base_lrs would bring the
    # checkpoint's lr back at the next scheduler step
    def halving(optimizer):
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 0.5**epoch)

    checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    first = _module(optimizer=lambda p: torch.optim.SGD(p, lr=0.01), lr_scheduler=halving)
    _trainer(tmp_path, 2, callbacks=[checkpoint]).fit(first, _data())
    resumed = _module(optimizer=lambda p: torch.optim.SGD(p, lr=0.5), lr_scheduler=halving)
    _trainer(tmp_path, 3, callbacks=[checkpoint]).fit(resumed, _data(), ckpt_path=tmp_path / "ckpt" / "last.ckpt")
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    group = saved["optimizer_states"][0]["param_groups"][0]
    assert group["lr"] == pytest.approx(0.5 * 0.5**3) and group["initial_lr"] == 0.5
    assert saved["lr_schedulers"][0]["base_lrs"] == [0.5] and saved["lr_schedulers"][0]["last_epoch"] == 3


def _restored(old_scheduler, new_optimizer_lr: float, new_scheduler, steps: int = 3):
    """A resume in miniature: a run of ``steps`` scheduler steps at lr 0.1 saved; a new run's
    optimizer (``new_optimizer_lr``, momentum 0.9) and scheduler built, and the saved state loaded
    over them as Lightning does, once the module kept another scheduler class's state out."""
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scheduler = old_scheduler(optimizer) if old_scheduler else None
    for _ in range(steps):
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    saved_class = type(scheduler).__name__ if scheduler is not None else None
    saved_optimizer, saved_schedulers = (
        optimizer.state_dict(),
        [scheduler.state_dict()] if scheduler is not None else [],
    )
    optimizer = torch.optim.SGD([param], lr=new_optimizer_lr, momentum=0.9)
    mine = ConfiguredOptimizer.record(optimizer)
    scheduler = new_scheduler(optimizer) if new_scheduler else None
    if scheduler is not None:
        mine.add_scheduler(scheduler)
    mine.replace_foreign_state(saved_class, saved_schedulers)
    optimizer.load_state_dict(saved_optimizer)
    for state in saved_schedulers[: 1 if scheduler is not None else 0]:
        scheduler.load_state_dict(state)
    return optimizer, scheduler, mine, saved_class


def test_a_restored_scheduler_keeps_its_position_and_takes_this_runs_settings() -> None:
    def old(o):
        return torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)

    def new(o):
        return torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.1)

    optimizer, scheduler, mine, saved = _restored(old, 1.0, new)
    changes = apply_optimizer_options(optimizer, scheduler, mine, saved, True)
    assert changes == [
        "momentum 0.9 (the checkpoint trained with 0)",
        "lr 1.0 (the checkpoint trained at 0.1)",
        "StepLR gamma 0.1 (the checkpoint trained with 0.5)",
    ]
    # 3 steps of step_size 2: one halving, 0.1 -> 0.05, scaled to the new base: 0.5
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5) and optimizer.param_groups[0]["momentum"] == 0.9
    assert scheduler.last_epoch == 3 and scheduler.gamma == 0.1 and scheduler.base_lrs == [1.0]
    optimizer.step()
    scheduler.step()  # epoch 4: the new gamma
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


def test_a_scheduler_of_another_class_or_none_starts_at_the_resume() -> None:
    def step(o):
        return torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5)

    def lam(o):
        return torch.optim.lr_scheduler.LambdaLR(o, lambda epoch: 0.1 * (epoch + 1))

    # StepLR's state would not even load into a LambdaLR (KeyError 'lr_lambdas'): kept out
    optimizer, scheduler, mine, saved = _restored(step, 1.0, lam)
    changes = apply_optimizer_options(optimizer, scheduler, mine, saved, True)
    assert "lr scheduler LambdaLR from this resume on (the checkpoint had StepLR)" in changes
    assert scheduler.last_epoch == 0 and not hasattr(scheduler, "gamma")  # no trace of StepLR's state
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)  # LambdaLR's first value: 1.0 x 0.1
    # a scheduler the checkpoint had not
    optimizer, scheduler, mine, saved = _restored(None, 1.0, lam)
    assert "lr scheduler LambdaLR from this resume on (the checkpoint had none)" in apply_optimizer_options(
        optimizer, scheduler, mine, saved, False
    )
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
    # no scheduler now: the configured lr, constant
    optimizer, scheduler, mine, saved = _restored(step, 1.0, None)
    changes = apply_optimizer_options(optimizer, None, mine, saved, True)
    assert "no lr scheduler (the checkpoint had StepLR): the lr stays at its value" in changes
    assert optimizer.param_groups[0]["lr"] == 1.0 and "initial_lr" not in optimizer.param_groups[0]


def test_fields_a_checkpoint_predates_are_not_compared() -> None:
    saved = {"adapter": "A", "num_steps": 3, "tree": {"num_steps": 3, "branch_steps": [0]}, "trainable": ["w"]}
    mine = {**saved, "shapes": {"w": [2]}, "reward": "hps", "reward_kwargs": {}, "seed": 1, "lora": None}
    check_resumable(saved, mine, {"w": torch.zeros(2)})
    with pytest.raises(
        ValueError,
        match=r"^--model.adapter: the trainable tensor w has shape \[3\] in the checkpoint and \[2\] in this run",
    ):
        check_resumable(saved, mine, {"w": torch.zeros(3)})  # the state dict still tells the shapes
    kwargs = {**saved, "reward": "hps", "reward_kwargs": {"hps": {"version": "v2.0"}}}
    with pytest.raises(
        ValueError,
        match=r"^--model.reward_kwargs: the checkpoint was trained with \{hps: \{version: v2.0\}\}, this run has \{\}",
    ):
        check_resumable(kwargs, mine, None)
    check_resumable(kwargs, mine, None, fitting=False)  # validate / test / predict / export


def _val_steps(root: Path) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(event_folder(root / "tensorboard")), size_guidance={"scalars": 0})
    events.Reload()
    return [e.step for e in events.Scalars("val/reward")] if "val/reward" in events.Tags()["scalars"] else []


def test_the_base_model_is_validated_once_at_the_start_of_a_run_not_of_a_resume(tmp_path: Path) -> None:
    """``--model.validate_at_start`` (default true): a fit from iteration 0 scores the base model
    first, so every ``val/*`` curve starts at it; a resume does not; and it changes no weight."""
    val = ("--trainer.limit_val_batches", "1", "--trainer.val_check_interval", "2")
    _fit(tmp_path / "run", "--trainer.max_steps", "2", *val)
    assert _val_steps(tmp_path / "run") == [0, 2]  # the base model, then after 2 iterations
    _fit(tmp_path / "run", "--trainer.max_steps", "4", "--ckpt_path", "last", *val)
    assert _val_steps(tmp_path / "run") == [0, 2, 4]  # the resume starts at iteration 2: no second "0"
    _fit(tmp_path / "off", "--trainer.max_steps", "2", "--model.validate_at_start", "false", *val)
    assert _val_steps(tmp_path / "off") == [2]
    # scoring the base model draws from no random stream the training uses: the same weights
    _fit(tmp_path / "on", "--trainer.max_steps", "2", *val)
    a, b = (
        torch.load(tmp_path / r / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"] for r in ("on", "off")
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _with_never_trained(groups: int = 1) -> dict:
    """A checkpoint of trainable tensors a, b, c (in the module's order), b never trained, with an
    optimizer state for a and b."""
    params = [[0, 1, 2]] if groups == 1 else [[0, 1], [2]]
    return {
        "state_dict": {"a": torch.zeros(1), "b": torch.ones(1), "c": torch.zeros(2)},
        "optimizer_states": [
            {"state": {0: {"step": 1}, 1: {"step": 1}}, "param_groups": [{"params": p, "lr": 0.1} for p in params]}
        ],
        "lit_treegrpo": {"fingerprint": {"trainable": ["a", "b", "c"], "shapes": {"a": [1], "b": [1], "c": [2]}}},
    }


def test_a_tensor_that_could_never_be_trained_is_dropped_with_its_optimizer_state() -> None:
    from lit_treegrpo.training.checkpoints import drop_never_trained

    checkpoint = _with_never_trained()
    assert drop_never_trained(checkpoint, lambda name: name == "b", ["a", "c"]) == ["b"]
    assert list(checkpoint["state_dict"]) == ["a", "c"]
    assert checkpoint["optimizer_states"][0] == {"state": {0: {"step": 1}}, "param_groups": [{"params": [0, 2], "lr": 0.1}]}  # fmt: skip
    assert checkpoint["lit_treegrpo"]["fingerprint"] == {"trainable": ["a", "c"], "shapes": {"a": [1], "c": [2]}}
    # torch maps the saved slots 0, 2 onto this run's two parameters in order: a's state stays a's
    a, c = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([a, c], lr=0.1)
    optimizer.load_state_dict(checkpoint["optimizer_states"][0])
    assert optimizer.state[a] == {"step": 1} and c not in optimizer.state


def test_nothing_is_dropped_when_it_is_not_never_trained_or_its_slot_cannot_be_told() -> None:
    from lit_treegrpo.training.checkpoints import drop_never_trained

    for checkpoint, never in (
        (_with_never_trained(), lambda name: False),
        (_with_never_trained(2), lambda n: n == "b"),
    ):
        assert drop_never_trained(checkpoint, never, ["a", "c"]) == []
        assert list(checkpoint["state_dict"]) == ["a", "b", "c"]
        assert [g["params"] for g in checkpoint["optimizer_states"][0]["param_groups"]] in ([[0, 1, 2]], [[0, 1], [2]])
        assert checkpoint["lit_treegrpo"]["fingerprint"]["trainable"] == ["a", "b", "c"]  # refused by the usual check
