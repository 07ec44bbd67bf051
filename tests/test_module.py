"""TreeGRPOModule inside a real Trainer on the tiny SD3 model: optimisation bookkeeping and faults."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_treegrpo.core import ClippedPolicyLoss, PruningConfig, TreeSpec
from lit_treegrpo.data import PromptDataModule
from lit_treegrpo.models.tiny import TinySD3Adapter
from lit_treegrpo.module import AdvantageSettings, TreeGRPOModule
from lit_treegrpo.rewards import Brightness, RewardModel

T = 3
SPEC = TreeSpec(T, branch_steps=(0, 1), branching=2)


def module(**kwargs) -> TreeGRPOModule:
    kwargs.setdefault("reward", Brightness())
    kwargs.setdefault("tree", SPEC)
    return TreeGRPOModule(TinySD3Adapter(num_steps=T, guidance_scale=1.0), **kwargs)


def fit(model: TreeGRPOModule, steps: int, tmp_path, **trainer_kwargs) -> L.Trainer:
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        **trainer_kwargs,
    )
    trainer.fit(model, PromptDataModule("shapes", batch_size=2, val_size=0, val_fraction=0.0))
    return trainer


def test_optimizer_steps_per_iteration_and_scheduler(tmp_path) -> None:
    model = module(
        minibatches=2,
        accumulate=2,
        inner_epochs=2,
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
    )
    steps = []
    model.optimizer_factory = lambda params: _Counting(params, steps)
    trainer = fit(model, 8, tmp_path)
    # 2 minibatches x 2 inner epochs = 4 optimizer steps per iteration; max_steps counts them
    assert model.iteration == 2 and trainer.global_step == 8 and len(steps) == 8
    # the scheduler steps once per iteration: lr 1e-3 -> 5e-4 -> 2.5e-4
    assert steps == [1e-3] * 4 + [5e-4] * 4
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(2.5e-4)


class _Counting(torch.optim.SGD):
    def __init__(self, params, log: list) -> None:
        super().__init__(params, lr=1e-3)
        self.log = log

    def step(self, closure=None):
        self.log.append(self.param_groups[0]["lr"])
        return super().step(closure)


def test_pruning_and_kl_paths_train(tmp_path) -> None:
    model = module(
        pruning=PruningConfig(width="parent_top1"),
        loss=ClippedPolicyLoss(kl_beta=0.1),
        advantage=AdvantageSettings(method="branch_fusion", beta=1.0, clip=3.0),
    )
    before = [p.detach().clone() for p in model.adapter.trainable_parameters()]
    trainer = fit(model, 2, tmp_path)
    metrics = trainer.callback_metrics
    # parent_top1 at the last split keeps 2 + 2 of the 2 + 4 edges of each prompt
    assert metrics["train/edges_kept"] == 8 and metrics["train/edges"] == 12
    assert torch.isfinite(metrics["train/kl"])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.adapter.trainable_parameters()))


def test_shared_noise_gives_every_root_of_a_prompt_the_same_start() -> None:
    model = module(tree=TreeSpec(T, sde_steps=(0, 1), num_trees=3), shared_noise=True)
    gens = model._generators(0, 0, 2)
    noise = model._root_noise(gens, 3)
    assert noise.shape[0] == 6
    assert torch.equal(noise[0], noise[1]) and torch.equal(noise[1], noise[2])
    assert not torch.equal(noise[0], noise[3])


class _NaNOnce(RewardModel):
    name = "nan_once"

    def __init__(self) -> None:
        super().__init__()
        self.freeze()

    def score_batch(self, images, prompts):
        scores = images.mean(dim=(1, 2, 3))
        scores[1] = float("nan")
        return scores


def test_a_nan_reward_stops_training_naming_the_reward_and_prompt(tmp_path) -> None:
    model = module(reward=_NaNOnce())
    before = [p.detach().clone() for p in model.adapter.trainable_parameters()]
    with pytest.raises(ValueError, match="nan_once") as err:
        fit(model, 2, tmp_path)
    assert "a " in str(err.value)  # the offending prompt text is shown
    assert all(torch.equal(a, b) for a, b in zip(before, model.adapter.trainable_parameters()))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(tree=TreeSpec(5)), "tree.num_steps=5 but the adapter samples with num_steps=3"),
        (dict(minibatches=0), "minibatches must be >= 1"),
        (dict(grad_clip=0.0), "grad_clip must be > 0"),
        (dict(reward={}), "mapping is empty"),
        (dict(reward="brightness", reward_kwargs={"hps": {}}), "reward_kwargs names"),
    ],
)
def test_bad_module_options_are_named(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        module(**kwargs)


def test_bad_advantage_settings_are_named() -> None:
    with pytest.raises(ValueError, match="advantage.method"):
        AdvantageSettings(method="median")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="advantage.clip"):
        AdvantageSettings(clip=0.0)


def test_multi_reward_logs_components(tmp_path) -> None:
    model = module(reward={"brightness": 0.7, "jpeg_compressibility": 0.3})
    scores = model._score(torch.rand(4, 3, 32, 32), ["a", "a", "b", "b"])
    assert set(scores[1]) == {"brightness", "jpeg_compressibility"}
    assert scores[0].shape == (4,) and scores[0].dtype == torch.float32


class _NaNGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


def test_a_non_finite_gradient_is_never_stepped_on(tmp_path) -> None:
    model = module()
    predict = model.adapter.predict

    def poisoned(x, step_index, cond):
        out = predict(x, step_index, cond)
        return _NaNGradient.apply(out) if torch.is_grad_enabled() else out

    model.adapter.predict = poisoned
    before = [p.detach().clone() for p in model.adapter.trainable_parameters()]
    with pytest.raises(FloatingPointError, match="non-finite gradient at iteration 0"):
        fit(model, 2, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(before, model.adapter.trainable_parameters()))
