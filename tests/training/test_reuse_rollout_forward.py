"""``--model.reuse_rollout_forward``: the update trains on the rollout's own forwards of the
stochastic steps instead of recomputing them; with one minibatch and one inner epoch that is the
same update (the weights have not moved since sampling), one forward per trained parent cheaper."""

from __future__ import annotations

import pytest
import torch

from lit_treegrpo.core import ClippedPolicyLoss, TreeSpec
from lit_treegrpo.models.tiny import TinySD3Adapter
from lit_treegrpo.rewards import Brightness
from lit_treegrpo.training.memory_guard import MemoryGuard
from lit_treegrpo.training.module import TreeGRPOModule
from tests.probes import logged_metrics
from tests.training.test_module import fit


def _trained(tmp_path, reuse: bool, steps: int = 3) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    # plain SGD: the weights move by exactly the gradients (Adam's normalisation would magnify the
    # float rounding of near-zero gradient elements into whole steps)
    model = TreeGRPOModule(TinySD3Adapter(num_steps=3), reward=Brightness(), tree=TreeSpec(branch_steps=(0, 1), branching=2),
                           reuse_rollout_forward=reuse, optimizer=lambda p: torch.optim.SGD(p, lr=1.0))  # fmt: skip
    logged = logged_metrics(model)
    fit(model, steps, tmp_path / str(reuse))
    weights = {k: v.detach().clone() for k, v in model.adapter.denoiser.named_parameters() if v.requires_grad}
    return weights, logged


def test_training_on_the_rollouts_forward_is_the_recomputing_update(tmp_path) -> None:
    recomputed, logged_a = _trained(tmp_path, reuse=False)
    reused, logged_b = _trained(tmp_path, reuse=True)
    assert recomputed.keys() == reused.keys()
    moved = max((recomputed[k] - TinySD3Adapter(num_steps=3).denoiser.state_dict()[k]).abs().max() for k in recomputed)
    assert moved > 1e-4  # the updates did move the weights
    for name in recomputed:  # three updates on the same edges; the forwards batched otherwise (rounding)
        torch.testing.assert_close(reused[name], recomputed[name], rtol=0, atol=1e-7)
    losses = [[m["loss"] for m in logged if "loss" in m] for logged in (logged_a, logged_b)]
    assert len(losses[0]) == 3 and losses[0] == pytest.approx(losses[1], abs=1e-7)
    ratios = [m["health/ratio_dev_at_start"] for m in logged_b if "health/ratio_dev_at_start" in m]
    assert ratios == [0.0, 0.0, 0.0]


def test_it_is_refused_where_it_would_not_be_exact() -> None:
    def build(**kwargs):
        return TreeGRPOModule(TinySD3Adapter(num_steps=3), reward=Brightness(),
                              tree=TreeSpec(branch_steps=(0, 1), branching=2), reuse_rollout_forward=True, **kwargs)  # fmt: skip

    for kwargs, named in [
        (dict(minibatches=2), "--model.minibatches 2 (needs 1)"),
        (dict(inner_epochs=2), "--model.inner_epochs 2"),
        (dict(loss=ClippedPolicyLoss(kl_beta=0.04)), "kl_beta 0.04"),
        (dict(memory_guard=MemoryGuard(max_train_parents=2)), "max_train_parents 2"),
    ]:
        with pytest.raises(ValueError, match="reuse_rollout_forward true trains on the rollout's forwards") as err:
            build(**kwargs)
        assert named in str(err.value)


def test_more_than_one_process_is_refused() -> None:
    from lit_treegrpo.training.settings import check_reuse

    check_reuse()  # the exact case passes
    with pytest.raises(ValueError, match=r"rollout's forwards, .*: 2 processes \(one only\); or set it to false"):
        check_reuse(processes=2)
