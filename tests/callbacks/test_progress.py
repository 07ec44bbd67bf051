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
