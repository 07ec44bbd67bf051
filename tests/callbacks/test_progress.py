"""ProgressLines: the plain progress lines of a fit whose stdout is not a terminal."""

from __future__ import annotations

import io

from lit_treegrpo.callbacks import ProgressLines
from tests.training.test_module import fit, module


def _lines(tmp_path, steps: int, **options) -> list[str]:
    stream = io.StringIO()
    fit(module(**options), steps, tmp_path, callbacks=[ProgressLines(every_n_iterations=1, stream=stream)])
    return stream.getvalue().splitlines()


def test_a_fixed_number_of_optimizer_steps_per_iteration_gives_the_total_in_iterations(tmp_path) -> None:
    # 6 optimizer steps at 2 minibatches per iteration: the fit ends at iteration 3
    lines = _lines(tmp_path, 6, minibatches=2)
    assert lines[0] == "training from iteration 0 to iteration 3"
    assert [line.split("  ")[0] for line in lines[1:4]] == ["iteration 1/3", "iteration 2/3", "iteration 3/3"]
    assert lines[-1].startswith("finished at iteration 3: 3 iterations in ")


def test_a_varying_number_of_optimizer_steps_gives_the_total_in_optimizer_steps(tmp_path) -> None:
    # one optimizer step per 5 kept edges: how many an iteration takes depends on the tree
    lines = _lines(tmp_path, 4, edges_per_update=5)
    assert lines[0] == "training from iteration 0 to optimizer step 4"
    assert lines[1].startswith("iteration 1  reward ")


def test_validations_are_not_counted_as_training_time(monkeypatch) -> None:
    # the base model's validation runs before the first iteration: 30 s of it must not make the
    # first iteration's 2 s look like 32 s, neither in s/it nor in the ETA
    from types import SimpleNamespace

    import torch

    from lit_treegrpo.callbacks import progress

    clock = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    stream = io.StringIO()
    lines = ProgressLines(every_n_iterations=1, stream=stream)
    metrics = {"val/reward": torch.tensor(0.5), "reward": torch.tensor(0.6)}
    trainer = SimpleNamespace(callbacks=[], max_steps=10, global_step=0, is_global_zero=True, sanity_checking=False,
                              callback_metrics=metrics)  # fmt: skip
    model = SimpleNamespace(iteration=0, optimizer_steps_per_iteration=1)
    lines.on_train_start(trainer, model)
    lines.on_validation_start(trainer, model)
    clock[0] = 30.0
    lines.on_validation_end(trainer, model)
    clock[0], model.iteration, trainer.global_step = 32.0, 1, 1
    lines.on_train_batch_end(trainer, model, None, None, 0)
    assert stream.getvalue().splitlines() == [
        "training from iteration 0 to iteration 10",
        "iteration 0/10  held-out reward 0.5000  (validation 30.0 s)",
        "iteration 1/10  reward 0.6000  2.00 s/it  ETA 18s",
    ]
