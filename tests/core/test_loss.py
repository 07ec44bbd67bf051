"""ClippedPolicyLoss regimes with hand-derived numbers."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from lit_treegrpo.core.compute import Compute
from lit_treegrpo.core.loss import ClippedPolicyLoss, check_kl_reference, edge_loss
from lit_treegrpo.core.rollout import recompute_log_probs, rollout
from lit_treegrpo.core.spec import TreeSpec

from .helpers import ToyFlow


def lp_for(ratios: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (with grad) and old log-probs whose ratios are ``ratios``."""
    old = torch.tensor([-1.0] * len(ratios))
    lp = (old + torch.tensor([math.log(r) for r in ratios])).requires_grad_(True)
    return lp, old


def test_three_regimes_hand_numbers() -> None:
    loss_fn = ClippedPolicyLoss(clip_range=0.2, adv_clip=5.0)
    # edge 0: ratio 1.1 inside [0.8, 1.2], A=2  -> max(-2*1.1, -2*1.1) = -2.2 (unclipped)
    # edge 1: ratio 1.5 > 1.2,            A=2  -> max(-3.0, -2*1.2) = -2.4 (clipped high)
    # edge 2: ratio 0.5 < 0.8,            A=-1 -> max(0.5, 0.8)     =  0.8 (clipped low)
    # edge 3: ratio 0.5 < 0.8,            A=1  -> max(-0.5, -0.8)   = -0.5 (pessimistic: unclipped)
    lp, old = lp_for([1.1, 1.5, 0.5, 0.5])
    adv = torch.tensor([2.0, 2.0, -1.0, 1.0])
    out = loss_fn(lp, old, adv)
    torch.testing.assert_close(out.loss, torch.tensor((-2.2 - 2.4 + 0.8 - 0.5) / 4), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.ratio_mean, torch.tensor((1.1 + 1.5 + 0.5 + 0.5) / 4), atol=1e-6, rtol=0)
    assert out.clip_frac.item() == pytest.approx(3 / 4)
    expected_kl = 0.5 * sum(math.log(r) ** 2 for r in [1.1, 1.5, 0.5, 0.5]) / 4
    assert out.approx_kl.item() == pytest.approx(expected_kl, rel=1e-5)
    assert out.ratio_dev_max.item() == pytest.approx(0.5, abs=1e-6)  # |0.5 - 1| and |1.5 - 1|
    # clipped low: edges 2 and 3 (0.5 < 0.8); high: edge 1 (1.5 > 1.2)
    assert out.clip_frac_low.item() == pytest.approx(2 / 4) and out.clip_frac_high.item() == pytest.approx(1 / 4)
    mean = (1.1 + 1.5 + 0.5 + 0.5) / 4
    expected_std = math.sqrt(sum((r - mean) ** 2 for r in [1.1, 1.5, 0.5, 0.5]) / 4)
    assert out.ratio_std.item() == pytest.approx(expected_std, rel=1e-5)
    out.loss.backward()
    # d/dlp of -A*ratio = -A*ratio / 4 where unclipped; 0 where the clipped branch is active
    torch.testing.assert_close(lp.grad, torch.tensor([-2.0 * 1.1 / 4, 0.0, 0.0, -1.0 * 0.5 / 4]), atol=1e-6, rtol=0)


def test_on_policy_first_pass() -> None:
    loss_fn = ClippedPolicyLoss()  # clip 1e-4 as the papers
    old = torch.tensor([-3.2, -1.7, -0.4])
    lp = old.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 0.25])
    out = loss_fn(lp, old, adv)
    assert out.ratio_mean.item() == 1.0 and out.clip_frac.item() == 0.0 and out.approx_kl.item() == 0.0
    torch.testing.assert_close(out.loss, -adv.mean(), atol=1e-7, rtol=0)
    out.loss.backward()
    # gradient descent raises the log-prob of positive-advantage edges and lowers the others
    assert lp.grad[0] < 0 and lp.grad[1] > 0 and lp.grad[2] < 0


def test_advantage_clip_and_asymmetric_clip() -> None:
    loss_fn = ClippedPolicyLoss(clip_range=0.1, clip_range_high=0.3, adv_clip=5.0)
    lp, old = lp_for([1.25, 1.4, 0.85])
    adv = torch.tensor([10.0, 1.0, -1.0])
    # edge 0: A clamped to 5, ratio 1.25 <= 1.3 -> -6.25; edge 1: 1.4 > 1.3 -> max(-1.4, -1.3) = -1.3
    # edge 2: 0.85 < 0.9, A=-1 -> max(0.85, 0.9) = 0.9
    out = loss_fn(lp, old, adv)
    torch.testing.assert_close(out.loss, torch.tensor((-6.25 - 1.3 + 0.9) / 3), atol=1e-6, rtol=0)
    assert out.clip_frac.item() == pytest.approx(2 / 3)


def test_aggregation_over_children_of_a_parent() -> None:
    lp, old = lp_for([1.0, 1.0, 1.0, 1.0])
    adv = torch.tensor([1.0, 2.0, 3.0, 4.0])
    group = torch.tensor([7, 7, 7, 2])  # parent 7 has three children, parent 2 one
    # per-edge losses -A: -1, -2, -3 | -4
    summed = ClippedPolicyLoss(aggregation="sum")(lp, old, adv, group=group).loss
    torch.testing.assert_close(summed, torch.tensor((-6.0 - 4.0) / 2), atol=1e-6, rtol=0)
    mean = ClippedPolicyLoss(aggregation="mean")(lp, old, adv, group=group).loss
    torch.testing.assert_close(mean, torch.tensor((-2.0 - 4.0) / 2), atol=1e-6, rtol=0)
    plain = ClippedPolicyLoss(aggregation="sum")(lp, old, adv).loss
    torch.testing.assert_close(plain, torch.tensor(-2.5), atol=1e-6, rtol=0)
    # "edge" (BranchGRPO's code): every edge alike, whatever its parent: (-1 - 2 - 3 - 4) / 4
    by_edge = ClippedPolicyLoss(aggregation="edge")(lp, old, adv, group=group).loss
    torch.testing.assert_close(by_edge, torch.tensor(-2.5), atol=1e-6, rtol=0)


def test_kl_to_reference_mean() -> None:
    loss_fn = ClippedPolicyLoss(kl_beta=0.5)
    lp, old = lp_for([1.0, 1.0])
    adv = torch.zeros(2)
    mean = torch.zeros(2, 1, 2, 2)
    ref = torch.zeros(2, 1, 2, 2)
    ref[0] = 0.2  # every element off by 0.2: mean sq 0.04
    std = torch.tensor([0.1, 0.5]).reshape(2, 1, 1, 1)
    # kl_0 = 0.04 / (2 * 0.01) = 2.0; kl_1 = 0 -> mean 1.0; loss = 0 + 0.5 * 1.0
    out = loss_fn(lp, old, adv, mean=mean, ref_mean=ref, std=std)
    torch.testing.assert_close(out.kl, torch.tensor(1.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.loss, torch.tensor(0.5), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="kl_beta > 0 needs"):
        loss_fn(lp, old, adv)


def test_flow_grpo_kl_form_divides_by_g_squared() -> None:
    # Flow-GRPO: mean((mu - mu_ref)^2) / (2 g^2) with std = g sqrt(|dt|), i.e. the exact KL * |dt|.
    # Edge 0: sq 0.04, std 0.1, |dt| 0.25 -> g^2 = 0.01 / 0.25 = 0.04, kl = 0.04 / 0.08 = 0.5
    # (exact: 2.0); edge 1: kl 0. Mean 0.25; loss = 0.5 * 0.25.
    lp, old = lp_for([1.0, 1.0])
    mean, ref = torch.zeros(2, 1, 2, 2), torch.zeros(2, 1, 2, 2)
    ref[0] = 0.2
    std = torch.tensor([0.1, 0.5]).reshape(2, 1, 1, 1)
    loss_fn = ClippedPolicyLoss(kl_beta=0.5, kl_form="flow_grpo")
    out = loss_fn(lp, old, torch.zeros(2), mean=mean, ref_mean=ref, std=std, step_size=torch.tensor([0.25, 0.1]))
    torch.testing.assert_close(out.kl, torch.tensor(0.25), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.loss, torch.tensor(0.125), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match=r"kl_form='flow_grpo' needs step_size of shape \[2\]"):
        loss_fn(lp, old, torch.zeros(2), mean=mean, ref_mean=ref, std=std)
    with pytest.raises(ValueError, match="loss.kl_form must be 'exact' or 'flow_grpo'"):
        ClippedPolicyLoss(kl_form="mse")  # type: ignore[arg-type]


def test_stats_are_detached() -> None:
    lp, old = lp_for([1.0, 1.2])
    out = ClippedPolicyLoss()(lp, old, torch.ones(2))
    assert out.loss.requires_grad
    assert not any(t.requires_grad for t in out[1:])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(clip_range=0.0), "clip_range"),
        (dict(clip_range_high=-1.0), "clip_range_high"),
        (dict(adv_clip=0.0), "adv_clip"),
        (dict(kl_beta=-0.1), "kl_beta"),
        (dict(aggregation="max"), "aggregation"),
    ],
)
def test_constructor_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClippedPolicyLoss(**kwargs)


def test_shape_validation() -> None:
    with pytest.raises(ValueError, match="advantages has shape"):
        ClippedPolicyLoss()(torch.zeros(3), torch.zeros(3), torch.zeros(2))


def test_edge_loss_recomputes_the_edges_and_counts_the_reference_forwards() -> None:
    # k=2 at steps 0 and 1 of T=4: 2 + 4 recorded edges per prompt; take the two children of one parent
    spec = TreeSpec(4, branch_steps=(0, 1), branching=2)
    model, gen = ToyFlow(4), torch.Generator().manual_seed(0)
    cond = torch.tensor([0.0, 0.5])  # [P]
    tree = rollout(model.predict, model.step, spec, cond, torch.randn((2, 2, 3, 3), generator=gen), generator=gen)
    advantages = torch.linspace(-1.0, 1.0, tree.num_edges)  # [E]
    kids = (tree.edge_source == tree.edge_source[-1]).nonzero().squeeze(1)  # [2]
    model.calls.clear()
    out, forwards = edge_loss(ClippedPolicyLoss(), model.predict, model.step, tree, kids, cond, advantages)
    # the sampling policy itself: ratio exactly 1, so each edge's loss is -A; aggregation "sum" over
    # the one group (the parent), mean over groups: -(A_1 + A_2). One forward serves both children.
    assert forwards == Compute(trained=1) and model.calls == [1] and kids.numel() == 2
    assert out.ratio_mean == 1.0 and out.kl == 0.0
    torch.testing.assert_close(out.loss, -advantages[kids].sum(), rtol=0, atol=1e-6)

    @contextlib.contextmanager
    def reference():  # another model: v = 0.3 x + cond
        a, model.a = model.a, 0.3
        try:
            yield
        finally:
            model.a = a

    kl_loss = ClippedPolicyLoss(kl_beta=0.5)
    model.calls.clear()
    out, forwards = edge_loss(kl_loss, model.predict, model.step, tree, kids, cond, advantages, reference=reference)
    # the reference's forward counts, apart from the trained one
    assert forwards == Compute(trained=1, reference=1) and model.calls == [1, 1] and model.a == 0.1
    new = recompute_log_probs(model.predict, model.step, tree, kids, cond)
    with reference():
        ref = recompute_log_probs(model.predict, model.step, tree, kids, cond)
    expected = kl_loss(
        new.step.log_prob,
        tree.edge_old_log_prob[kids],
        advantages[kids],
        group=new.group,
        mean=new.step.mean,
        ref_mean=ref.step.mean,
        std=new.step.std,
    )
    assert out.kl > 0 and torch.equal(out.loss, expected.loss) and torch.equal(out.kl, expected.kl)
    with pytest.raises(ValueError, match="kl_beta > 0 needs the reference model"):
        edge_loss(kl_loss, model.predict, model.step, tree, kids, cond, advantages)


def test_kl_beta_needs_lora_is_stated_once_naming_the_option_and_the_fix() -> None:
    check_kl_reference(0.0, has_lora=False)
    check_kl_reference(0.1, has_lora=True)
    with pytest.raises(
        ValueError, match=r"^--model.loss.kl_beta > 0 needs the adapter's lora \(the KL reference is the model "
    ):
        check_kl_reference(0.1, has_lora=False, prefix="--model.")
    with pytest.raises(ValueError) as err:
        check_kl_reference(0.1, has_lora=False, prefix="--model.")
    assert "\n" not in str(err.value)
    assert str(err.value).endswith("set --model.adapter.init_args.lora or --model.loss.kl_beta 0")


@pytest.mark.parametrize("aggregation", ["sum", "mean"])
def test_group_aggregation_equals_brute_force_over_any_group_ids(aggregation: str) -> None:
    # unsorted, gapped ids (node indices of parents): the per-group sums or means, averaged over
    # the groups present, computed edge by edge in Python
    g = torch.Generator().manual_seed(3)
    for trial in range(20):
        B = int(torch.randint(1, 30, (1,), generator=g))
        group = torch.randint(0, 1000, (B,), generator=g) if trial % 2 else torch.randint(0, 4, (B,), generator=g)
        per_edge = torch.randn(B, generator=g, dtype=torch.float64)
        buckets: dict[int, list[float]] = {}
        for gid, value in zip(group.tolist(), per_edge.tolist()):
            buckets.setdefault(gid, []).append(value)
        reduce = sum if aggregation == "sum" else (lambda v: sum(v) / len(v))
        expected = sum(reduce(v) for v in buckets.values()) / len(buckets)
        got = ClippedPolicyLoss(aggregation=aggregation)._aggregate(per_edge, group)
        assert abs(got.item() - expected) < 1e-12, (trial, got.item(), expected)
