"""The work estimate (``--model.work_limit``) checked before any sample is drawn, and a stop request (SIGTERM, or the
Ctrl-C that CheckpointOnInterrupt turns into one) that ends a rollout, a sampling pass or an update within a model
call instead of at the end of the iteration (issue "Found by a fuzzer")."""

from __future__ import annotations

import logging
import os
import signal

import lightning as L
import pytest
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_treegrpo.core import TreeSpec
from lit_treegrpo.data import PromptDataModule
from lit_treegrpo.training.work import (
    WorkLimit,
    WorkLimitError,
    check_iteration_work,
    check_sample_size,
    check_steps,
    check_validation_work,
)
from tests.training.test_module import SPEC, _Counting, fit, module

# SPEC: 3 steps, splits into 2 at steps 0 and 1: 1 + 2 + 4 = 7 nodes evaluated per rollout, and the training pass
# recomputes the 1 + 2 parents of the recorded edges (steps 0 and 1) once per inner epoch


def test_an_iteration_costs_its_rollout_and_update_epochs_by_hand() -> None:
    assert SPEC.nfe() == 7 and SPEC.train_nfe() == 3
    # 2 prompts x 7 + 2 prompts x 3 parents x 2 epochs
    assert check_iteration_work(SPEC, 2, 2, WorkLimit(max_evaluations=26)) == 26
    with pytest.raises(WorkLimitError) as refused:
        check_iteration_work(SPEC, 2, 2, WorkLimit(max_evaluations=25))
    message = str(refused.value)
    assert "rollout 14 + update 12 (2 inner epoch(s)) would cost 26 denoiser evaluations" in message
    assert "more than --model.work_limit.max_evaluations 25" in message
    assert "--model.inner_epochs" in message and "raise --model.work_limit.max_evaluations knowingly" in message


def test_a_tree_whose_roots_alone_exceed_the_bound_is_refused_before_its_nodes_are_counted() -> None:
    spec = TreeSpec(1000, branch_steps=(0,), branching=2, num_trees=8)
    with pytest.raises(WorkLimitError, match=r"2 prompt\(s\) x 8 tree\(s\) x 1,000 steps, before branching"):
        check_iteration_work(spec, 2, 1, WorkLimit(max_evaluations=15_999))
    with pytest.raises(WorkLimitError, match=r"^--model.tree.num_steps 1,000,000,000,000,000,000: one trajectory"):
        check_steps("--model.tree.num_steps", 10**18, WorkLimit())
    check_steps("--model.tree.num_steps", 1_000_000, WorkLimit())  # the bound itself is allowed


def test_a_validation_pass_costs_prompts_times_samples_times_steps() -> None:
    # the main job: 36 held-out prompts x 4 samples x 10 steps
    assert check_validation_work(10, 36, 4, WorkLimit(max_evaluations=1440)) == 1440
    with pytest.raises(WorkLimitError, match=r"36 prompt\(s\) x --model.val_samples 4 x 10 steps\) would cost 1,440"):
        check_validation_work(10, 36, 4, WorkLimit(max_evaluations=1439))


def test_a_sample_over_the_pixel_bound_is_refused_naming_the_resolution() -> None:
    assert check_sample_size(8192, 1, WorkLimit()) == 8192 * 8192  # the default bound is 8192 x 8192
    with pytest.raises(WorkLimitError, match=r"^--model.adapter.init_args.resolution 8,200: one sample"):
        check_sample_size(8200, 1, WorkLimit())
    with pytest.raises(WorkLimitError, match="x 81 frames is 84,934,656 pixels"):
        check_sample_size(1024, 81, WorkLimit())


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_work_limit_values_are_whole_numbers_of_at_least_one(bad) -> None:
    with pytest.raises(ValueError, match="work_limit.max_evaluations must be a whole number >= 1"):
        WorkLimit(max_evaluations=bad)


def _count_model_calls(model) -> list[bool]:
    """The adapter's model calls from now on, each recorded as whether a SIGTERM had already arrived."""
    calls: list[bool] = []
    predict = model.adapter.predict

    def counted(x, t, cond):
        calls.append(model.trainer.received_sigterm)
        return predict(x, t, cond)

    model.adapter.predict = counted
    return calls


def test_a_module_built_in_python_checks_the_work_before_any_model_call(tmp_path) -> None:
    model = module(val_samples=10**6)
    calls = _count_model_calls(model)
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)  # fmt: skip
    with pytest.raises(WorkLimitError, match=r"\(2 prompt\(s\) x --model.val_samples 1,000,000 x 3 steps\)"):
        trainer.fit(model, PromptDataModule("shapes", batch_size=2, val_size=2))
    assert calls == [] and model.iteration == 0


def test_a_sigterm_during_a_rollout_ends_it_before_the_next_model_call(tmp_path) -> None:
    model = module()
    steps: list[float] = []
    model.optimizer_factory = lambda params: _Counting(params, steps)
    calls = _count_model_calls(model)
    predict = model.adapter.predict

    def signalled(x, t, cond):  # iteration 1's first model call (step 0 of its tree) receives the signal
        if model.iteration == 1 and isinstance(t, int) and t == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        return predict(x, t, cond)

    model.adapter.predict = signalled
    with pytest.raises(SIGTERMException):
        fit(model, 10, tmp_path)
    # the call that received it finished; none came after; the iteration neither trained nor counted
    assert calls.count(True) == 1 and calls[-1] is True
    assert model.iteration == 1 and len(steps) == 1


def test_a_sigterm_during_an_update_keeps_the_optimizer_steps_taken_and_skips_the_rest(tmp_path, caplog) -> None:
    model = module(minibatches=2, inner_epochs=2)  # 4 optimizer steps per iteration
    steps: list[float] = []

    class SignalOnStep(_Counting):
        def step(self, closure=None):
            if len(steps) == 5:  # iteration 1's second step
                os.kill(os.getpid(), signal.SIGTERM)
            return super().step(closure)

    model.optimizer_factory = lambda params: SignalOnStep(params, steps)
    with caplog.at_level(logging.INFO), pytest.raises(SIGTERMException):
        fit(model, 20, tmp_path)
    # iteration 1 stopped after its second step, and still ended as an iteration (its weights are whole)
    assert len(steps) == 4 + 2 and model.iteration == 2
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Stopped iteration")]
    assert said == [
        "Stopped iteration 1's update after 2 of its 4 optimizer steps; the checkpoint keeps those steps, and a "
        "resumed run goes on with iteration 2 (it no longer matches an uninterrupted run from here)"
    ]


def test_without_a_stop_every_phase_runs_whole_and_nothing_is_said(tmp_path, caplog) -> None:
    model = module(minibatches=2, inner_epochs=2)
    steps: list[float] = []
    model.optimizer_factory = lambda params: _Counting(params, steps)
    with caplog.at_level(logging.INFO):
        fit(model, 8, tmp_path)
    assert len(steps) == 8 and model.iteration == 2
    assert not [r for r in caplog.records if r.getMessage().startswith("Stopped iteration")]
