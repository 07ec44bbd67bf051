"""The on-policy check: the first micro-batch's |ratio - 1| before any update, logged and warned about."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch

from lit_treegrpo.core import TreeSpec
from lit_treegrpo.models.tiny import TinySD3Adapter
from lit_treegrpo.rewards import Brightness
from lit_treegrpo.training.health import off_policy
from lit_treegrpo.training.module import TreeGRPOModule
from tests.training.test_module import fit

SPEC = TreeSpec(3, branch_steps=(0, 1), branching=2)


class _Deviations(L.Callback):
    def __init__(self) -> None:
        self.seen: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.seen.append(float(trainer.callback_metrics["health/ratio_dev_at_start"]))


def _recomputes_with_another_guidance(model: TreeGRPOModule) -> TreeGRPOModule:
    """A planted train/sample mismatch: the training pass runs CFG 5.0 on a tree sampled at 4.5."""
    update = model.algorithm.update

    def mismatched(*args, **kwargs):
        sampled, model.adapter.guidance_scale = model.adapter.guidance_scale, 5.0
        try:
            return update(*args, **kwargs)
        finally:
            model.adapter.guidance_scale = sampled

    model.algorithm.update = mismatched
    return model


def _module(**kwargs) -> TreeGRPOModule:
    # CFG on, two minibatches: the check reads the first micro-batch only, before the first update
    return TreeGRPOModule(TinySD3Adapter(num_steps=3, guidance_scale=4.5), Brightness(), SPEC, minibatches=2, **kwargs)


def test_the_ratios_are_exactly_one_before_the_first_update_in_float32(tmp_path) -> None:
    deviations = _Deviations()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*importance ratios already differ")
        fit(_module(), 6, tmp_path, callbacks=[deviations])  # 3 iterations of 2 optimizer steps
    assert deviations.seen == [0.0, 0.0, 0.0]


def test_a_different_guidance_in_the_training_pass_is_warned_about_once(tmp_path) -> None:
    deviations = _Deviations()
    with pytest.warns(
        UserWarning, match=r"iteration 0: before any update the importance ratios already differ"
    ) as caught:
        fit(_recomputes_with_another_guidance(_module()), 4, tmp_path, callbacks=[deviations])
    # far above the float32 tolerance it warns above, 1e-5 (measured 1.3e-3 and 8.4e-4 on the tiny SD3.5)
    assert all(d > 50 * 1e-5 for d in deviations.seen) and len(deviations.seen) == 2
    messages = [str(w.message) for w in caught if "importance ratios" in str(w.message)]
    assert len(messages) == 1 and "guidance scale (CFG)" in messages[0] and "tolerance 1e-05 for float32" in messages[0]


def test_the_tolerance_follows_the_dtype() -> None:
    assert off_policy(1e-5, torch.float32, 3) is None and off_policy(1e-3, torch.bfloat16, 3) is None
    assert off_policy(2e-5, torch.float32, 3) is not None
    message = off_policy(2e-3, torch.bfloat16, 3)
    assert (
        message is not None
        and message.startswith("iteration 3: ")
        and "0.002 (tolerance 0.001 for bfloat16)" in message
    )


def test_tree_health_by_hand() -> None:
    from lit_treegrpo.training.health import tree_health

    # prompt 0: rewards 1, 3 -> std 1; prompt 1: 2, 2 (zero spread); prompt 2: 5, NaN -> std 0 (one finite)
    rewards = torch.tensor([1.0, 3.0, 2.0, 2.0, 5.0, float("nan")])
    leaf_prompt = torch.tensor([0, 0, 1, 1, 2, 2])
    advantages = torch.tensor([0.5, -1.0, 2.0, 0.0, -3.0])
    edge_depth = torch.tensor([0, 0, 1, 1, 2])
    got = {k: float(v) for k, v in tree_health(rewards, leaf_prompt, 3, advantages, edge_depth).items()}
    assert got == {
        "health/reward_spread": pytest.approx((1.0 + 0.0 + 0.0) / 3),
        "health/zero_spread_frac": pytest.approx(2 / 3),
        "health/adv_abs_depth0": pytest.approx(0.75),
        "health/adv_abs_depth1": pytest.approx(1.0),
        "health/adv_abs_depth2": pytest.approx(3.0),
    }
    # a prompt with no finite reward does not count in either mean
    nan = torch.tensor([1.0, 3.0, float("nan"), float("nan")])
    got = tree_health(nan, torch.tensor([0, 0, 1, 1]), 2, advantages[:1], edge_depth[:1])
    assert float(got["health/reward_spread"]) == pytest.approx(1.0) and float(got["health/zero_spread_frac"]) == 0.0


def test_the_step_logs_the_health_metrics(tmp_path) -> None:
    trainer = fit(_module(), 2, tmp_path)
    logged = trainer.callback_metrics
    for name in (
        "reward_spread",
        "zero_spread_frac",
        "adv_abs_depth0",
        "adv_abs_depth1",
        "samples_per_s",
        "units_per_s",
    ):
        assert torch.isfinite(logged[f"health/{name}"]), name
    assert float(logged["health/samples_per_s"]) > 0 and 0.0 <= float(logged["health/zero_spread_frac"]) <= 1.0
    for name in ("clip_frac_low", "clip_frac_high", "ratio_std"):
        assert torch.isfinite(logged[f"train/{name}"]), name
    assert float(logged["train/grad_norm"]) > 0.0


def test_grad_norm_by_hand() -> None:
    from lit_treegrpo.training.health import grad_norm

    a, b, c = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0, 12.0])  # c has none
    assert float(grad_norm([a, b, c])) == pytest.approx(13.0)  # sqrt(9 + 16 + 144)
    assert float(grad_norm([c])) == 0.0
    # what clipping measures: clip_grad_norm_ returns the same norm before it clips
    assert float(torch.nn.utils.clip_grad_norm_([a, b], max_norm=1.0)) == pytest.approx(13.0)
