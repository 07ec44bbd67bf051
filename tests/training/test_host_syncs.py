"""No host syncs in the denoising loop or the training pass: every ``.item()``, ``int()``,
``bool()`` of a tensor dispatches ``aten._local_scalar_dense``, and an op whose output size
depends on the values (``torch.unique``, ``nonzero``, boolean masks) reads that size back; on an
accelerator either makes the host wait for the device's queue to drain. One training iteration of
the tiny SD3 model runs under a dispatch mode that counts them and records who asked.

The budget, per iteration: none in the rollout (the tree's denoising steps, schedule tables on the
latents' device), none per training micro-batch (log-prob recomputation, loss, backward), one per
optimizer step (were its losses and its gradient finite: the refusal needs the answer on the host),
and at most :data:`PER_ITERATION` for the checks of the whole iteration (rewards finite and in
range, the advantages' tree bookkeeping, the fault tally, the on-policy check, dropped prompts).
The optimizer's own step counters are excluded: AdamW keeps them on the host unless ``fused`` or
``capturable``, so reading them waits for nothing."""

from __future__ import annotations

import collections
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lit_treegrpo.core import TreeSpec
from tests.training.test_module import fit, module

PER_ITERATION = 18  # besides one per optimizer step; counted on this test's tree, measured: 18
#: ops that wait for the device: a scalar read back, or an output sized by the values
SYNCING = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten._unique2.default,
    torch.ops.aten.unique_dim.default,
    torch.ops.aten.unique_consecutive.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
}
PACKAGE = str(Path(__file__).resolve().parents[2] / "lit_treegrpo")


class CountSyncs(TorchDispatchMode):
    """Counts ``aten._local_scalar_dense`` by the innermost frames of the project that asked."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []  # per call: the project's frames, innermost first ("file:function")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNCING:
            stack = traceback.extract_stack()
            if not any("/torch/optim/" in f.filename for f in stack):
                ours = [f for f in reversed(stack) if f.filename.startswith(PACKAGE)]
                self.calls.append([f"{Path(f.filename).name}:{f.name}" for f in ours])
        return func(*args, **(kwargs or {}))


def test_one_iteration_waits_on_the_device_only_where_stated(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = module(tree=TreeSpec(branch_steps=(0, 1), branching=2), minibatches=2)
    counter = CountSyncs()
    train = type(model).training_step

    def counted(self, batch, batch_idx):
        if self.iteration != 1:  # the second iteration: past the first-call checks of the fit
            return train(self, batch, batch_idx)
        with counter:
            return train(self, batch, batch_idx)

    model.training_step = counted.__get__(model)
    fit(model, 4, tmp_path)
    where = collections.Counter(frames[0] for frames in counter.calls)
    loops = ("rollout.py:rollout", "rollout.py:recompute", "flow.py", "sd3.py", "base.py:predict", "loss.py")
    in_loops = [f for f in counter.calls if any(n.startswith(loops) for n in f)]
    assert in_loops == [], in_loops  # the denoising steps and the micro-batches' losses
    assert where["algorithm.py:step_problem"] == 2  # one per optimizer step (minibatches 2)
    others = sum(n for name, n in where.items() if name != "algorithm.py:step_problem")
    assert others <= PER_ITERATION, where
