"""EMA: closed-form averages, the update schedule, bitwise swaps, checkpoint handling."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lit_treegrpo.callbacks import EMA

from .helpers import StandIn, same, tiny_adapter


def holder(*params: nn.Parameter, iteration: int = 0) -> SimpleNamespace:
    """The part of the module EMA reads: ``trainable_parameters()`` (and ``iteration``)."""
    return SimpleNamespace(trainable_parameters=lambda: list(params), iteration=iteration)


def test_hand_numbers_with_half_decay() -> None:
    # decay 1/2: copy 4 -> 4; then s = (s + p) / 2: p=2 -> 3, p=0 -> 1.5, p=1 -> 1.25 (exact in binary)
    p = nn.Parameter(torch.tensor([4.0]))
    ema, m = EMA(decay=0.5), holder(p)
    seen = []
    for value in (4.0, 2.0, 0.0, 1.0):
        p.data.fill_(value)
        ema.update(m)
        seen.append(ema.shadows[0].item())
    assert seen == [4.0, 3.0, 1.5, 1.25]
    assert ema.num_updates == 4


def test_closed_form_after_k_updates() -> None:
    # after copying p0 and k updates with p: shadow = d^k * p0 + (1 - d^k) * p
    d, k = 0.9, 7
    p0 = torch.tensor([[1.0, -2.0], [0.5, 3.0]])
    p = nn.Parameter(p0.clone().to(torch.bfloat16))  # a bf16 parameter: the shadow stays float32
    ema, m = EMA(decay=d), holder(p)
    ema.update(m)
    p.data.fill_(0.25)
    for _ in range(k):
        ema.update(m)
    expected = d**k * p0.double() + (1 - d**k) * 0.25
    assert ema.shadows[0].dtype == torch.float32
    torch.testing.assert_close(ema.shadows[0].double(), expected, rtol=1e-6, atol=1e-7)


def test_should_update_table() -> None:
    ema = EMA(start_step=3, every_n_steps=2)
    assert [ema.should_update(n) for n in range(1, 9)] == [False, False, False, True, False, True, False, True]
    assert all(EMA().should_update(n) for n in range(1, 5))


@pytest.mark.parametrize("bump", ["in_training_step", "after_callbacks"])
def test_hooks_update_after_the_steps_the_schedule_names(bump: str) -> None:
    # the module may bump `iteration` inside training_step (between the hooks) or in its own
    # on_train_batch_end (after the callbacks'): EMA counts the same completed steps either way
    p = nn.Parameter(torch.zeros(1))
    ema, m = EMA(decay=0.5, start_step=2, every_n_steps=2), holder(p)
    for step in range(6):
        ema.on_train_batch_start(None, m, None, step)
        p.data.fill_(float(step + 1))  # the optimizer step of this training step
        if bump == "in_training_step":
            m.iteration += 1
        ema.on_train_batch_end(None, m, {}, None, step)
        if bump == "after_callbacks":
            m.iteration += 1
    # updates after 2, 4, 6 completed steps: copy 2, then (2 + 4) / 2 = 3, then (3 + 6) / 2 = 4.5
    assert ema.num_updates == 3
    assert ema.shadows[0].item() == 4.5


def perturbed_adapter_holder(seed: int = 0):
    adapter = tiny_adapter()
    gen = torch.Generator().manual_seed(seed)
    for p in adapter.trainable_parameters():
        p.data.normal_(generator=gen)
    return SimpleNamespace(adapter=adapter, trainable_parameters=adapter.trainable_parameters)


def test_swapped_puts_the_average_in_and_restores_bitwise() -> None:
    m = perturbed_adapter_holder()
    params = m.adapter.trainable_parameters()
    ema = EMA(decay=0.7)
    with ema.swapped(m):  # no update yet: the average is the training weights, nothing moves
        pass
    ema.update(m)
    gen = torch.Generator().manual_seed(1)
    for p in params:
        p.data.add_(torch.randn(p.shape, generator=gen))
    ema.update(m)
    training = [p.detach().clone() for p in params]
    with ema.swapped(m):
        assert same(params, ema.shadows)
        assert not any(torch.equal(p, t) for p, t in zip(params, training, strict=True))
        with ema.swapped(m):  # nested: a no-op
            assert same(params, ema.shadows)
        assert same(params, ema.shadows)
    assert same(params, training)
    with pytest.raises(RuntimeError, match="inside"), ema.swapped(m):
        raise RuntimeError("inside")
    assert same(params, training)


def test_checkpoint_written_while_swapped_holds_the_training_weights() -> None:
    module = StandIn()
    gen = torch.Generator().manual_seed(0)
    params = module.adapter.trainable_parameters()
    ema = EMA(decay=0.5)
    ema.update(module)
    for p in params:
        p.data.add_(torch.randn(p.shape, generator=gen))
    training = [p.detach().clone() for p in params]
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    with ema.swapped(module):
        checkpoint = {"state_dict": module.state_dict()}  # its tensors alias the live (averaged) weights
        ema.on_save_checkpoint(None, module, checkpoint)
    assert same([checkpoint["state_dict"][n] for n in names], training)
    assert same(params, training)


def test_state_dict_round_trip_and_mismatch_errors() -> None:
    a, b = nn.Parameter(torch.ones(2, 3)), nn.Parameter(torch.full((4,), 2.0))
    ema = EMA(decay=0.5)
    ema.update(holder(a, b))
    state = ema.state_dict()
    restored = EMA(decay=0.5)
    restored.load_state_dict(state)
    restored.on_train_start(None, holder(a, b))
    assert restored.num_updates == 1
    assert same(restored.shadows, ema.shadows)

    too_few = EMA(decay=0.5)
    too_few.load_state_dict(state)
    with pytest.raises(ValueError, match="EMA state has 2 tensors but the model has 1 trainable parameters"):
        too_few.on_train_start(None, holder(a))
    wrong_shape = EMA(decay=0.5)
    wrong_shape.load_state_dict(state)
    refused = pytest.raises(ValueError, match=r"tensor 1 has shape \(4,\) but trainable parameter 1 has \(5,\)")
    with refused, wrong_shape.swapped(holder(a, nn.Parameter(torch.zeros(5)))):
        pass


def test_changed_options_warn_on_load() -> None:
    ema = EMA(decay=0.5)
    ema.update(holder(nn.Parameter(torch.ones(1))))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        EMA(decay=0.5).load_state_dict(ema.state_dict())
    with pytest.warns(UserWarning, match="EMA options differ"):
        EMA(decay=0.9).load_state_dict(ema.state_dict())


@pytest.mark.parametrize(
    ("options", "name"),
    [
        (dict(decay=1.0), "EMA.decay"),
        (dict(decay=-0.1), "EMA.decay"),
        (dict(start_step=-1), "EMA.start_step"),
        (dict(every_n_steps=0), "EMA.every_n_steps"),
        (dict(apply_on=("validation", "test")), "EMA.apply_on"),
        (dict(apply_on="validation"), "EMA.apply_on"),
    ],
)
def test_invalid_options_are_named(options: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        EMA(**options)
