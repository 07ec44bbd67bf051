"""TreeGRPOModule inside a real Trainer on the tiny SD3 model: optimisation bookkeeping and faults."""

from __future__ import annotations

import contextlib
from pathlib import Path

import lightning as L
import pytest
import torch

from lit_treegrpo.core import ClippedPolicyLoss, PruningConfig, RolloutLimits, TreeSpec
from lit_treegrpo.core.memory import cond_row_bytes, rollout_memory
from lit_treegrpo.core.rollout import root_noise
from lit_treegrpo.data import PromptDataModule
from lit_treegrpo.data.prompt_stream import PromptBatch
from lit_treegrpo.models.tiny import TinySD3Adapter
from lit_treegrpo.rewards import Brightness, RewardModel
from lit_treegrpo.training import checkpoints
from lit_treegrpo.training.faults import FaultLimitError, FaultPolicy, FaultWarning
from lit_treegrpo.training.memory_guard import MemoryCheck, MemoryGuard, RolloutMemoryError, TrainingMemoryError
from lit_treegrpo.training.module import TreeGRPOModule
from lit_treegrpo.training.settings import AdvantageSettings
from tests.probes import FlakyReward

T = 3
SPEC = TreeSpec(T, branch_steps=(0, 1), branching=2)


def module(**kwargs) -> TreeGRPOModule:
    kwargs.setdefault("reward", Brightness())
    kwargs.setdefault("tree", SPEC)
    return TreeGRPOModule(TinySD3Adapter(num_steps=T, guidance_scale=1.0), **kwargs)


def guarded(model: TreeGRPOModule, guard: MemoryGuard = MemoryGuard(), **given) -> TreeGRPOModule:
    """``model`` with a memory guard told the memory (``available_bytes``) or a cap on the parents
    per training forward (``max_train_parents``), which no option sets."""
    model.algorithm.memory = MemoryCheck(guard, **given)
    return model


def fit(model: TreeGRPOModule, steps: int, tmp_path, batch_size: int = 2, **trainer_kwargs) -> L.Trainer:
    """``model`` fitted for ``steps`` on the Shapes prompts by a quiet CPU trainer."""
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
    trainer.fit(model, PromptDataModule("shapes", batch_size=batch_size, val_size=0, val_fraction=0.0))
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


def test_edges_per_update_sets_the_optimizer_steps_from_the_kept_edges(tmp_path) -> None:
    # SPEC: 2 + 4 = 6 edges per prompt, 2 prompts -> 12 edges; one step per 5 edges -> ceil(12 / 5) = 3
    model = module(edges_per_update=5)
    steps = []
    model.optimizer_factory = lambda params: _Counting(params, steps)
    trainer = fit(model, 6, tmp_path)
    assert model.iteration == 2 and trainer.global_step == 6 and len(steps) == 6
    with pytest.raises(ValueError, match="edges_per_update=5 sets the number of optimizer steps"):
        module(edges_per_update=5, minibatches=2)
    with pytest.raises(ValueError, match="edges_per_update must be >= 1"):
        module(edges_per_update=0)


def test_flow_grpo_kl_trains_on_a_flow_adapter_and_is_refused_elsewhere(tmp_path) -> None:
    from lit_treegrpo.models.tiny import TinySD15Adapter

    model = module(
        loss=ClippedPolicyLoss(kl_beta=0.1, kl_form="flow_grpo"), advantage=AdvantageSettings(std_scope="global")
    )
    trainer = fit(model, 2, tmp_path)
    assert torch.isfinite(trainer.callback_metrics["train/kl"])
    # |dt| of each step is the sigma table's difference
    sig = model.adapter.sigmas()
    torch.testing.assert_close(model.adapter.step_size(torch.tensor([0, 2])), sig[[0, 2]] - sig[[1, 3]])
    with pytest.raises(ValueError, match="kl_form flow_grpo needs a flow-matching adapter"):
        TreeGRPOModule(
            TinySD15Adapter(num_steps=T), Brightness(), SPEC, loss=ClippedPolicyLoss(kl_beta=0.1, kl_form="flow_grpo")
        )
    # the rule is core.loss.check_kl_reference's; the module, the CLI and the adapter all ask it
    with pytest.raises(ValueError, match=r"^loss.kl_beta > 0 needs the adapter's lora .*; set adapter.init_args.lora"):
        TreeGRPOModule(TinySD15Adapter(num_steps=T, lora=None), Brightness(), SPEC, loss=ClippedPolicyLoss(kl_beta=0.1))


class _Counting(torch.optim.SGD):
    def __init__(self, params, log: list) -> None:
        super().__init__(params, lr=1e-3)
        self.log = log

    def step(self, closure=None):
        self.log.append(self.param_groups[0]["lr"])
        return super().step(closure)


def test_pruning_and_kl_paths_train(tmp_path) -> None:
    from lit_treegrpo.callbacks import PruningSchedule

    model = module(
        loss=ClippedPolicyLoss(kl_beta=0.1),
        advantage=AdvantageSettings(method="branch_fusion", beta=1.0, clip=3.0),
    )
    before = [p.detach().clone() for p in model.adapter.trainable_parameters()]
    trainer = fit(model, 2, tmp_path, callbacks=[PruningSchedule(width="parent_top1")])
    metrics = trainer.callback_metrics
    # parent_top1 at the last split keeps 2 + 2 of the 2 + 4 edges of each prompt
    assert metrics["train/edges_kept"] == 8 and metrics["train/edges"] == 12
    assert torch.isfinite(metrics["train/kl"])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.adapter.trainable_parameters()))


def test_shared_noise_gives_every_root_of_a_prompt_the_same_start() -> None:
    model = module(tree=TreeSpec(T, sde_steps=(0, 1), num_trees=3, shared_noise=True))
    gens = model.algorithm.generators(0, 0, 2)
    noise = root_noise(model.adapter.initial_noise, gens, model.tree)
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
        (dict(tree=TreeSpec(5)), "tree.num_steps=5 but the adapter samples with num_steps=3; leave tree.num_steps out"),
        (dict(minibatches=0), "minibatches must be >= 1"),
        (dict(grad_clip=0.0), "grad_clip must be > 0"),
        (dict(reward={}), "mapping is empty"),
        (dict(reward="brightness", reward_kwargs={"hps": {}}), "reward_kwargs names"),
    ],
)
def test_bad_module_options_are_named(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        module(**kwargs)


def test_the_tree_takes_the_adapters_num_steps() -> None:
    model = module(tree=TreeSpec(branch_steps=SPEC.branch_steps, branching=SPEC.branching))
    assert model.tree == SPEC.with_num_steps(T) and model.tree.num_steps == model.adapter.num_steps == T


def test_bad_advantage_settings_are_named() -> None:
    with pytest.raises(ValueError, match="advantage.method"):
        AdvantageSettings(method="median")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="advantage.clip"):
        AdvantageSettings(clip=0.0)
    with pytest.raises(ValueError, match="advantage.std_scope must be 'group' or 'global'"):
        AdvantageSettings(std_scope="batch")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="advantage.std_scope 'global' does not apply to branch_fusion"):
        AdvantageSettings(method="branch_fusion", std_scope="global")


def test_multi_reward_logs_components(tmp_path) -> None:
    model = module(reward={"brightness": 0.7, "jpeg_compressibility": 0.3})
    scores = model.algorithm.score(torch.rand(4, 3, 32, 32), ["a", "a", "b", "b"])
    assert set(scores[1]) == {"brightness", "jpeg_compressibility"}
    assert scores[0].shape == (4,) and scores[0].dtype == torch.float32


class _NaNGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


def poison_gradients(model: TreeGRPOModule) -> None:
    """Make every backward through the model's predictions NaN (the rollout, without grad, stays finite)."""
    predict = model.adapter.predict

    def poisoned(x, step_index, cond):
        out = predict(x, step_index, cond)
        return _NaNGradient.apply(out) if torch.is_grad_enabled() else out

    model.adapter.predict = poisoned


def test_a_non_finite_gradient_is_never_stepped_on(tmp_path) -> None:
    model = module()
    poison_gradients(model)
    before = [p.detach().clone() for p in model.adapter.trainable_parameters()]
    with pytest.raises(FloatingPointError, match="non-finite gradient at iteration 0"):
        fit(model, 2, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(before, model.adapter.trainable_parameters()))


# ---------------------------------------------------------------------------------------------
# faults: NaN / inf rewards, failing reward calls, non-finite losses and gradients
# ---------------------------------------------------------------------------------------------

SKIP = FaultPolicy(nonfinite="skip")


class _ParameterLog(L.Callback):
    """The trainable parameters after every training step."""

    def __init__(self) -> None:
        self.after: list[list[torch.Tensor]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.after.append([p.detach().clone() for p in pl_module.adapter.trainable_parameters()])


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_skip_drops_the_prompt_with_a_nan_reward_and_trains_the_others(tmp_path) -> None:
    model = module(reward=FlakyReward(nan_on=[0, 1]), faults=SKIP)
    before = [p.detach().clone() for p in model.adapter.trainable_parameters()]
    with pytest.warns(FaultWarning, match=r"iteration 0: non-finite rewards for 1 of 2 prompts \['a "):
        trainer = fit(model, 2, tmp_path)
    metrics = trainer.callback_metrics
    # SPEC grows 2 + 4 = 6 edges per prompt; the NaN prompt's 6 get no gradient, the other's 6 train
    assert metrics["train/edges_kept"] == 6 and metrics["train/edges"] == 12
    assert metrics["faults/skipped_groups"] == 2 and metrics["faults/skipped_steps"] == 0
    assert model.fault_counts == {
        "skipped_groups": 2,
        "skipped_steps": 0,
        "skipped_updates": 0,
        "consecutive": 0,
        "zero_std_groups": 0,
    }
    assert trainer.global_step == 2 and model.iteration == 2  # both steps updated
    assert not _same(before, list(model.adapter.trainable_parameters()))
    assert all(torch.isfinite(p).all() for p in model.adapter.trainable_parameters())


def test_a_dropped_prompt_leaves_the_other_prompts_advantages_unchanged() -> None:
    # per-prompt normalisation: replacing prompt 0's rewards changes nothing for prompt 1
    model = module(faults=SKIP)
    gens = model.algorithm.generators(0, 0, 2)
    cond = model.adapter.encode_prompts(["a red circle", "a blue square"])
    from lit_treegrpo.core import rollout, tree_advantages

    tree = rollout(
        model.adapter.predict,
        model.adapter.step,
        SPEC,
        cond,
        root_noise(model.adapter.initial_noise, gens, SPEC),
        generator=gens,
    )
    rewards = torch.rand(tree.num_leaves, generator=torch.Generator().manual_seed(0))
    stand_in = torch.where(tree.leaf_prompt == 0, torch.zeros_like(rewards), rewards)
    args = (tree.edge_parent, tree.leaf_edge, tree.leaf_prompt)
    for method in ("mean", "logprob_softmax", "branch_fusion"):
        full = tree_advantages(rewards, *args, method=method, edge_old_log_prob=tree.edge_old_log_prob)
        dropped = tree_advantages(stand_in, *args, method=method, edge_old_log_prob=tree.edge_old_log_prob)
        other = tree.edge_prompt == 1
        assert torch.equal(full[other], dropped[other]), method


def test_skip_skips_the_step_whose_reward_raises_and_counts_it(tmp_path) -> None:
    model = module(reward=FlakyReward(raise_on=[1]), faults=SKIP)
    log = _ParameterLog()
    with pytest.warns(
        FaultWarning,
        match=r"iteration 1: the reward raised RuntimeError: reward service unavailable \(call 1\); skipping",
    ):
        trainer = fit(model, 3, tmp_path, callbacks=[log])
    # 3 optimizer steps took 4 rollouts: iteration 1 made no update
    assert trainer.global_step == 3 and model.iteration == 4
    assert _same(log.after[1], log.after[0]) and not _same(log.after[2], log.after[1])
    assert model.fault_counts["skipped_steps"] == 1 and model.fault_counts["consecutive"] == 0
    assert trainer.callback_metrics["faults/skipped_steps"] == 1


def test_under_error_a_raising_reward_propagates(tmp_path) -> None:
    model = module(reward=FlakyReward(raise_on=[0]))
    with pytest.raises(RuntimeError, match=r"reward service unavailable \(call 0\)"):
        fit(model, 2, tmp_path)


def test_skip_stops_after_max_consecutive_skips_naming_the_last_cause(tmp_path) -> None:
    model = module(
        reward=FlakyReward(nan_on=list(range(100))), faults=SKIP, tree=TreeSpec(T, branch_steps=(0, 1), branching=2)
    )
    before = [p.detach().clone() for p in model.adapter.trainable_parameters()]
    with pytest.warns(FaultWarning), pytest.raises(FaultLimitError) as err:
        # one prompt per batch: every prompt is NaN, so no step can train
        fit(model, 5, tmp_path, batch_size=1)
    assert str(err.value).startswith(
        "3 training steps in a row were skipped (at most 3), up to iteration 2; "
        "last cause: non-finite rewards for prompts ['a "
    )
    assert model.fault_counts["skipped_steps"] == 3 and model.fault_counts["skipped_groups"] == 3
    assert _same(before, list(model.adapter.trainable_parameters()))  # nothing was ever trained


def test_skip_never_steps_on_a_non_finite_gradient_and_stops_after_n(tmp_path) -> None:
    model = module(faults=SKIP)
    poison_gradients(model)
    before = [p.detach().clone() for p in model.adapter.trainable_parameters()]
    warned = pytest.warns(FaultWarning, match="non-finite gradient at iteration 0; optimizer step skipped")
    with warned, pytest.raises(FaultLimitError, match="last cause: non-finite gradient at iteration 2"):
        fit(model, 5, tmp_path)
    assert model.fault_counts["skipped_updates"] == 3 and model.fault_counts["skipped_steps"] == 3
    assert _same(before, list(model.adapter.trainable_parameters()))
    assert all(p.grad is None for p in model.adapter.trainable_parameters())  # zeroed, not kept


class _NaNLossAt(ClippedPolicyLoss):
    """The clipped loss, made NaN at the listed calls (one call per micro-batch)."""

    def __init__(self, at: set[int]) -> None:
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        call, self.calls = self.calls, self.calls + 1
        return out._replace(loss=out.loss * float("nan")) if call in self.at else out


def test_skip_skips_only_the_optimizer_step_whose_loss_is_not_finite(tmp_path) -> None:
    model = module(loss=_NaNLossAt({1}), faults=SKIP, minibatches=2)
    with pytest.warns(FaultWarning, match=r"non-finite loss nan at iteration 0, micro-batch 1; optimizer step skipped"):
        trainer = fit(model, 4, tmp_path)
    # 2 optimizer steps per rollout, the second of iteration 0 skipped: 1 + 2 + 2 after 3 rollouts
    # (Lightning checks max_steps between training steps)
    assert trainer.global_step == 5 and model.iteration == 3
    assert model.fault_counts["skipped_updates"] == 1 and model.fault_counts["skipped_steps"] == 0
    assert trainer.callback_metrics["faults/skipped_updates"] == 1  # logged
    assert all(torch.isfinite(p).all() for p in model.adapter.trainable_parameters())


def test_under_error_a_non_finite_loss_names_the_iteration_and_trains_nothing(tmp_path) -> None:
    model = module(loss=_NaNLossAt({0}))
    before = [p.detach().clone() for p in model.adapter.trainable_parameters()]
    with pytest.raises(
        FloatingPointError,
        match=r"non-finite loss nan at iteration 0, micro-batch 0; no optimizer step was taken \(set --model.faults.nonfinite skip",
    ):
        fit(model, 2, tmp_path)
    assert _same(before, list(model.adapter.trainable_parameters()))


class _Constant(RewardModel):
    name = "constant"

    def __init__(self) -> None:
        super().__init__()
        self.freeze()

    def score_batch(self, images, prompts):
        return torch.full((images.shape[0],), 0.1)


def test_all_equal_rewards_give_exactly_zero_advantages_and_are_counted(tmp_path) -> None:
    model = module(reward=_Constant())
    trainer = fit(model, 2, tmp_path)
    metrics = trainer.callback_metrics
    assert metrics["adv/abs_max"] == 0.0 and metrics["adv/std"] == 0.0  # exactly 0, not 1e-9
    assert metrics["faults/zero_std_groups"] == 4 and model.fault_counts["zero_std_groups"] == 4  # 2 prompts x 2 steps
    assert model.fault_counts["skipped_steps"] == 0  # not a fault: the step runs
    assert torch.isfinite(metrics["loss"])


def test_fault_counters_are_kept_in_checkpoints(tmp_path) -> None:
    model = module(reward=FlakyReward(nan_on=[0]), faults=SKIP)
    with pytest.warns(FaultWarning):
        fit(model, 1, tmp_path)
    checkpoint = {"state_dict": model.state_dict()}
    model.on_save_checkpoint(checkpoint)
    assert checkpoint["lit_treegrpo"]["faults"]["skipped_groups"] == 1
    fresh = module(reward=FlakyReward(), faults=SKIP)
    fresh.on_load_checkpoint(checkpoint)
    assert fresh.fault_counts == model.fault_counts and fresh.iteration == 1


def test_bad_fault_and_memory_options_are_named() -> None:
    with pytest.raises(ValueError, match="faults.nonfinite must be 'error' or 'skip'"):
        FaultPolicy(nonfinite="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"memory_guard.fraction must be in \(0, 1\]"):
        MemoryGuard(fraction=0.0)


# ---------------------------------------------------------------------------------------------
# memory guard
# ---------------------------------------------------------------------------------------------


def test_the_memory_guard_refuses_a_tree_that_cannot_fit_before_the_first_rollout(tmp_path) -> None:
    model = guarded(module(), available_bytes=1000)  # 1 kB
    calls = []
    predict = model.adapter.predict
    model.adapter.predict = lambda *a: calls.append(1) or predict(*a)
    with pytest.raises(RolloutMemoryError) as err:
        fit(model, 1, tmp_path)
    message = str(err.value)
    # the arithmetic is tested in tests/core/test_memory.py; here: the numbers reach the message
    estimate = rollout_memory(
        SPEC, 2, (4, 16, 16), torch.float32, cond_bytes=cond_row_bytes(model.adapter.encode_prompts(["a"]))
    )
    assert message.startswith(f"memory guard: one rollout needs about {estimate.describe()} for 2 prompts x 4 leaves")
    assert "on this rank, but 1 kB is available (as given; x 0.9 = 900 B)" in message
    assert "lower --data.batch_size, --model.rollout.max_batch" in message
    assert "--model.memory_guard.enabled false" in message
    assert calls == [] and model.iteration == 0  # no rollout ran


def test_the_memory_guard_can_be_disabled(tmp_path) -> None:
    model = guarded(module(memory_guard=MemoryGuard(enabled=False)), MemoryGuard(enabled=False), available_bytes=1000)
    fit(model, 1, tmp_path)
    assert model.iteration == 1


def test_the_memory_guard_measures_this_machine(tmp_path) -> None:
    model = module()
    fit(model, 1, tmp_path)  # the tiny tree fits in any machine's memory
    available, where = model.algorithm.memory.available(model.adapter.device, 1)
    assert available is not None and available > 0 and where.startswith("MemAvailable / 1 process")


# the training pass's guard. SPEC on 2 prompts: 1 + 2 = 3 parents per prompt, so one micro-batch
# (minibatches 1) of 6 parents, each with 2 children: 12 edges


def _count_forwards(model: TreeGRPOModule) -> list[tuple[int, bool]]:
    """(rows, with grad) of every model call from now on."""
    calls: list[tuple[int, bool]] = []
    predict = model.adapter.predict
    model.adapter.predict = lambda x, *a: calls.append((x.shape[0], torch.is_grad_enabled())) or predict(x, *a)
    return calls


class _RecordingSGD(torch.optim.SGD):
    """SGD (parameters move by lr x gradient, so they differ by the gradients' rounding) that keeps
    the gradients it stepped on."""

    def __init__(self, params, grads: list) -> None:
        super().__init__(params, lr=0.5)
        self.grads = grads

    def step(self, closure=None):
        self.grads.append(torch.cat([p.grad.flatten() for group in self.param_groups for p in group["params"]]))
        return super().step(closure)


@pytest.mark.parametrize(
    "settings",
    [
        dict(),
        dict(loss=ClippedPolicyLoss(aggregation="mean", kl_beta=0.1), accumulate=2),
        # parents of 2 children (the split) and of 1 (the SDE step) in one micro-batch: a part's share
        # is its edges', not its parents'
        dict(
            loss=ClippedPolicyLoss(aggregation="edge"), tree=TreeSpec(T, branch_steps=(0,), branching=2, sde_steps=(1,))
        ),
    ],
    ids=["sum", "mean_kl_accumulate", "edge"],
)
def test_a_micro_batch_split_by_the_training_guard_gives_the_same_update(tmp_path, settings) -> None:
    results = {}
    for cap in (None, 4, 1):
        grads: list = []
        model = module(optimizer=lambda p: _RecordingSGD(p, grads), **settings)  # noqa: B023 (called by this fit)
        guarded(model, max_train_parents=cap)
        calls = _count_forwards(model)
        trainer = fit(model, 1, tmp_path)
        trained = [rows for rows, grad in calls[1:] if grad]  # calls[0]: the guard's probe of one parent
        params = torch.cat([p.detach().flatten() for p in model.adapter.trainable_parameters()])
        results[cap] = trained, grads[0], params, trainer.callback_metrics
    micro = 6 // settings.get("accumulate", 1)  # parents per micro-batch
    assert results[None][0] == [micro] * settings.get("accumulate", 1)  # one forward per micro-batch
    assert results[4][0] == [3, 3]  # one micro-batch of 6: 2 forwards of 3; two of 3 (accumulate 2): they fit
    assert results[1][0] == [1] * 6
    _, grads, params, metrics = results[None]
    for cap in (4, 1):
        # float32 sums in another order (one batched backward vs. several accumulated ones). The
        # advantages of a prompt sum to 0, so many gradient elements are near-cancelling sums whose
        # rounding is relative to their terms, not to themselves: atol 1e-6 x the largest gradient
        # (about 8 float32 ulps of it); rtol 1e-5 for the others
        scale = float(grads.abs().max())
        torch.testing.assert_close(results[cap][1], grads, rtol=1e-5, atol=1e-6 * scale)
        torch.testing.assert_close(results[cap][2], params, rtol=1e-6, atol=0.5 * 1e-6 * scale)  # lr 0.5
        assert results[cap][3]["train/forwards"] == metrics["train/forwards"]  # the same forwards counted
        for name in ("train/policy_loss", "train/kl", "train/ratio_mean", "train/clip_frac"):
            torch.testing.assert_close(results[cap][3][name], metrics[name], rtol=1e-5, atol=1e-7)
    assert not torch.equal(params, torch.cat([p.detach().flatten() for p in module().adapter.trainable_parameters()]))


def test_the_training_guard_changes_nothing_while_every_micro_batch_fits(tmp_path) -> None:
    # the probe trains nothing and draws from no generator: guarded and unguarded runs are bitwise equal
    runs = []
    for guard in (MemoryGuard(), MemoryGuard(enabled=False)):
        model = module(memory_guard=guard, minibatches=2)
        calls = _count_forwards(model)
        fit(model, 2, tmp_path)
        runs.append(([c for c in calls if c[1]], [p.detach().clone() for p in model.adapter.trainable_parameters()]))
        assert model.algorithm.memory.chunks([3]) == [1]
    (guarded, params), (unguarded, params_off) = runs
    assert guarded == [(1, True)] + unguarded  # the probe's one parent, then the same forwards
    assert all(torch.equal(a, b) for a, b in zip(params, params_off))


def _training_estimate(tmp_path) -> tuple[int, int]:
    """(bytes of a training forward of one parent, of two) on this run, as the guard estimates them."""
    model = guarded(module(), available_bytes=10**9)
    fit(model, 1, tmp_path)
    return model.algorithm.memory.memory.total(1), model.algorithm.memory.memory.total(2)


def test_a_micro_batch_over_the_estimate_is_split_and_announced(tmp_path, caplog) -> None:
    import logging

    _, two = _training_estimate(tmp_path)
    model = guarded(module(), available_bytes=int((two + 1000) / 0.9))  # two parents fit, not three
    calls = _count_forwards(model)
    with caplog.at_level(logging.INFO):
        fit(model, 1, tmp_path)
    assert model.algorithm.memory.cap == 2 and model.iteration == 1
    assert [rows for rows, grad in calls[1:] if grad] == [2, 2, 2]
    announced = [r.getMessage() for r in caplog.records if "training micro-batch" in r.getMessage()]
    assert len(announced) == 1, announced
    assert announced[0].startswith("memory guard: a training micro-batch of 6 parents needs about ")
    assert announced[0].endswith(
        "runs as 3 forwards of at most 2 parent(s), gradients accumulated (the same update up to float rounding)"
    )


class _OneBatch:
    """Training data that is not a PromptDataModule: one batch of two prompts."""

    def __iter__(self):
        yield PromptBatch(["a red circle", "a blue square"], 0, [{}, {}])


@pytest.mark.parametrize("data", ["datamodule", "plain batches"])
def test_the_training_guard_refuses_a_parent_that_cannot_fit_before_the_first_rollout(tmp_path, data) -> None:
    one, _ = _training_estimate(tmp_path)
    rollout_needs = rollout_memory(
        SPEC, 2, (4, 16, 16), torch.float32, cond_bytes=cond_row_bytes(module().adapter.encode_prompts(["a"]))
    ).total
    assert rollout_needs < one - 1000  # a budget between the two: the rollout fits, the training does not
    model = guarded(module(), available_bytes=int((one - 1000) / 0.9))
    calls = _count_forwards(model)
    with pytest.raises(TrainingMemoryError) as err:
        if data == "datamodule":
            fit(model, 1, tmp_path)
        else:  # no PromptDataModule: the check waits for the first training step, still before its rollout
            L.Trainer(
                max_steps=1,
                accelerator="cpu",
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                default_root_dir=tmp_path,
            ).fit(model, train_dataloaders=_OneBatch())
    message = str(err.value)
    assert message.startswith("memory guard: the training pass cannot fit even one parent per forward: it needs about ")
    assert "(as given; x 0.9 = " in message
    assert "turn on --model.adapter.init_args.gradient_checkpointing (about " in message  # it would help here
    assert "train LoRA" not in message  # the tiny adapter trains LoRA already
    assert "lower --data.batch_size, the branching or num_trees" in message
    assert message.endswith("or set --model.memory_guard.enabled false to skip this check")
    assert [grad for _, grad in calls] == [True] and model.iteration == 0  # the probe alone: no rollout ran


def test_a_checkpoint_from_before_ode_tail_resumes_with_the_default() -> None:
    # a fingerprint without the later TreeSpec fields reads them at their defaults
    model = module()
    saved = checkpoints.run_fingerprint(model)
    del saved["tree"]["ode_tail"]
    state = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    model.on_load_checkpoint({"lit_treegrpo": {"iteration": 3, "fingerprint": saved}, "state_dict": state})
    assert model.iteration == 3
    saved["tree"]["branching"] = 3  # still another tree is refused, naming the option and the checkpoint's value
    with pytest.raises(  # loaded outside a fit (as export does): the fix is the run's value, not a resume
        ValueError,
        match=r"^--model.tree.branching: the checkpoint was trained with 3, this run has 2; give --model.tree.branching 3 as the run did",
    ):
        module().on_load_checkpoint({"lit_treegrpo": {"iteration": 3, "fingerprint": saved}, "state_dict": state})


def _old_format_with_local_numbers(tmp_path: Path) -> tuple[dict, Path]:
    """The committed pre-split checkpoint (its dict) and a copy of it whose weights are the same 2
    steps computed on this machine: the old file's format with numbers this CPU's kernels give.
    The committed weights are checked to be those up to kernel rounding (measured about 1e-4
    relative between an AVX2 and an AVX-512 machine after 2 steps; the bound leaves room)."""
    from tests.checkpoints import make_tiny_checkpoint as made

    old = torch.load(Path(made.__file__).with_name(made.NAME), map_location="cpu", weights_only=True)
    with _earlier_lora():
        first = made.model()
    made.trainer(tmp_path / "first", made.STEPS, enable_checkpointing=False).fit(first, made.data())
    here = {n: p.detach().clone() for n, p in first.named_parameters() if p.requires_grad}
    assert sorted(old["state_dict"]) == sorted(here)  # the same trainable tensors, by name
    for name, value in old["state_dict"].items():
        torch.testing.assert_close(value, here[name], rtol=1e-2, atol=1e-4)
    assert not here[NEVER_TRAINED[1]].any()  # the text query's LoRA got no gradient: B is still zero
    transplanted = tmp_path / "old_format_local_numbers.ckpt"
    torch.save({**old, "state_dict": here}, transplanted)
    return old, transplanted


#: the LoRA of the last block's text query: that block drops the text stream, so it can get no
#: gradient; the committed checkpoint's code attached it, this code does not (a resume leaves it out)
NEVER_TRAINED = [f"adapter.denoiser.transformer_blocks.1.attn.add_q_proj.lora_{ab}.default.weight" for ab in "AB"]


@contextlib.contextmanager
def _earlier_lora():
    """Adapters built inside attach SD3's LoRA as the committed checkpoint's code did, on the
    never-trained text query too (and so draw the same random LoRA initialisations)."""
    from lit_treegrpo.models.base import DiffusionAdapter
    from lit_treegrpo.models.sd3 import SD3Adapter

    current = SD3Adapter.unused_modules
    SD3Adapter.unused_modules = DiffusionAdapter.unused_modules
    try:
        yield
    finally:
        SD3Adapter.unused_modules = current


def _trained_now(model: TreeGRPOModule) -> list[torch.Tensor]:
    """The trainable weights, less those this code no longer trains (a model built with the earlier LoRA)."""
    return [p for n, p in model.named_parameters() if p.requires_grad and n not in NEVER_TRAINED]


def test_a_checkpoint_written_before_the_module_split_resumes(tmp_path) -> None:
    # tests/checkpoints/tiny_sd3_step2.ckpt: 2 steps (one prompt dropped for a NaN reward) written by
    # the code before module.py was split (make_tiny_checkpoint.py). Its *format* must resume: the
    # old file, with its old keys, fingerprint and counters, resumed to step 4, ends where an
    # uninterrupted run of this code ends, bitwise. Its *numbers* were computed on another CPU, so
    # the resume starts from the old file with this machine's numbers (_old_format_with_local_numbers).
    from tests.checkpoints import make_tiny_checkpoint as made

    # The uninterrupted run attaches the old LoRA set too, so that its first 2 steps are the file's;
    # the resumed one leaves the never-trained LoRA out, which changes nothing it computes.
    old, transplanted = _old_format_with_local_numbers(tmp_path)
    with _earlier_lora():
        full = made.model()
    resumed, log = made.model(), _ParameterLog()
    made.trainer(tmp_path / "full", 4, enable_checkpointing=False).fit(full, made.data())
    made.trainer(tmp_path / "resumed", 4, enable_checkpointing=False, callbacks=[log]).fit(
        resumed, made.data(), ckpt_path=transplanted
    )
    assert resumed.iteration == full.iteration == 4 and len(log.after) == 2  # steps 2 and 3 ran, resumed
    assert resumed.fault_counts == full.fault_counts and full.fault_counts["skipped_groups"] >= 1
    assert _same(list(resumed.adapter.trainable_parameters()), _trained_now(full))
    assert len(_trained_now(full)) == len(list(resumed.adapter.trainable_parameters()))
    # and this code writes the entry in the same format: the same keys, fingerprint and counters
    saved = old["lit_treegrpo"]
    mine = {"state_dict": full.state_dict()}
    full.on_save_checkpoint(mine)
    # (the compute counter and the settings came later; a checkpoint without them resumes with the
    # count at 0 and nothing to say about changed settings)
    assert list(saved) == ["iteration", "fingerprint", "faults"]
    assert list(mine["lit_treegrpo"]) == [*saved, "compute", "settings"]
    ours, theirs = mine["lit_treegrpo"]["fingerprint"], saved["fingerprint"]
    assert {k: ours[k] for k in theirs if k != "tree"} == {k: v for k, v in theirs.items() if k != "tree"}
    # the fields recorded since are compared only when both sides hold them: the old file resumed above
    assert set(ours) - set(theirs) == {
        "shapes",
        "lora",
        "adapter_options",
        "reward",
        "reward_kwargs",
        "advantage",
        "loss",
        "seed",
        "optimizer",
    }
    # the tree since lost its memory knobs (now RolloutLimits) and gained shared_noise (was a module
    # option) and split_noise_scale (at 1, the scale every run before it sampled with)
    migrated = {k: v for k, v in theirs["tree"].items() if k not in ("max_batch", "max_leaves")}
    assert ours["tree"] == {**migrated, "shared_noise": False, "split_noise_scale": 1.0}
    assert "max_batch" in theirs["tree"]
    assert list(mine["lit_treegrpo"]["faults"]) == list(saved["faults"])


def test_a_resume_with_a_smaller_max_batch_is_accepted_and_continues(tmp_path) -> None:
    # the memory guard's advice is "lower --model.rollout.max_batch": resuming with it must not be
    # refused, and chunking the model calls differently must not change what the run computes
    from dataclasses import replace

    from tests.checkpoints import make_tiny_checkpoint as made

    _, committed = _old_format_with_local_numbers(tmp_path)
    with _earlier_lora():
        full = made.model()
    resumed = made.model()
    resumed.algorithm.rollout_limits = RolloutLimits(max_batch=3)  # 2 prompts x 4 leaves: chunks of 3
    made.trainer(tmp_path / "full", 4, enable_checkpointing=False).fit(full, made.data())
    made.trainer(tmp_path / "resumed", 4, enable_checkpointing=False).fit(resumed, made.data(), ckpt_path=committed)
    assert resumed.iteration == full.iteration == 4
    # not bitwise: a matmul over 3 rows and one over 4 round differently in the last bits on CPU
    assert len(_trained_now(full)) == len(resumed.adapter.trainable_parameters())
    for a, b in zip(resumed.adapter.trainable_parameters(), _trained_now(full)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    shape_changed = made.model()
    shape_changed.algorithm.tree = replace(shape_changed.tree, branching=3)  # still refused
    with pytest.raises(
        ValueError, match=r"^--model.tree.branching: the checkpoint \S+ was trained with 2, this run has 3"
    ):
        made.trainer(tmp_path / "other", 4, enable_checkpointing=False).fit(
            shape_changed, made.data(), ckpt_path=committed
        )


def test_pruning_that_keeps_no_edge_is_warned_once(tmp_path) -> None:
    from lit_treegrpo.callbacks import PruningSchedule

    # SPEC's edges have depths 0 and 1; dropping the fixed depths [0, 2) leaves nothing to train
    fixed = PruningSchedule(depth_window=2, depth_start=0, depth_shift=0, depth_mode="drop")
    model = module()
    before = [p.detach().clone() for p in model.adapter.trainable_parameters()]
    with pytest.warns(UserWarning, match=r"pruning kept none of the 12 edges, so this step trains nothing") as caught:
        fit(model, 2, tmp_path, max_epochs=1, limit_train_batches=2, callbacks=[fixed])
    assert sum("pruning kept none" in str(w.message) for w in caught) == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.adapter.trainable_parameters()))


def test_the_pruning_schedule_callback_sets_the_pruning_in_force(tmp_path) -> None:
    from lit_treegrpo.callbacks import PruningSchedule

    def recording(model: TreeGRPOModule) -> list[PruningConfig]:
        seen: list[PruningConfig] = []
        grow = model.algorithm.grow
        model.algorithm.grow = lambda *a, **k: seen.append(k["pruning"]) or grow(*a, **k)  # type: ignore[method-assign]
        return seen

    model = module()
    seen = recording(model)
    schedule = PruningSchedule(depth_window=1, depth_every=1, depth_stop=1)
    fit(model, 3, tmp_path, max_epochs=1, limit_train_batches=3, callbacks=[schedule])
    assert [p.depth_window for p in seen] == [(0, 1), (1, 2), (1, 2)]  # the schedule's, per iteration
    assert model.pruning.depth_window == (1, 2)  # in force for the next iteration
    # without the callback every edge trains
    unpruned = module()
    seen = recording(unpruned)
    fit(unpruned, 1, tmp_path / "none", max_epochs=1, limit_train_batches=1)
    assert seen == [PruningConfig()]
    # two schedules are refused (by Lightning and, from the CLI, in one line first)
    with pytest.raises(Exception, match="PruningSchedule"):
        fit(module(), 1, tmp_path / "both", max_epochs=1, limit_train_batches=1, callbacks=[PruningSchedule()] * 2)
    with pytest.raises(TypeError, match="pruning"):
        module(pruning=PruningConfig(width="ratio"))  # not an option of the module


class _Metrics(L.Callback):
    """Every training step's logged compute metrics."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("compute/")})


def test_each_step_counts_its_sampling_trained_and_reference_forwards_and_their_compute_units(tmp_path) -> None:
    from lit_treegrpo.core import Compute, ComputeCost

    # SPEC per prompt: nfe 1 + 2 + 4 = 7 sampling forwards; trained forwards: the parents of its
    # 6 edges, 1 (step 0) + 2 (step 1) = 3; reward: 4 leaves. 2 prompts per step.
    tree, log = module(), _Metrics()
    fit(tree, 2, tmp_path / "tree", callbacks=[log])
    assert log.steps[0] == {
        "compute/sampling": 14.0,
        "compute/trained": 6.0,
        "compute/reference": 0.0,
        "compute/reward_images": 8.0,
        "compute/units": 14.0 + 3 * 6.0,
        "compute/units_total": 32.0,
    }
    assert log.steps[1]["compute/units_total"] == 64.0 and tree.compute_spent == Compute(28, 12, 0, 16)
    # flat G=3 with KL: every trained forward has a reference forward; another cost model weighs them
    flat = TreeSpec(T, sde_steps=(0, 1), num_trees=3)  # per prompt: 9 sampling, 6 trained
    kl = module(
        tree=flat, loss=ClippedPolicyLoss(kl_beta=0.1), compute_cost=ComputeCost(trained=2.0, reference=0.5, reward=1.0)
    )
    log = _Metrics()
    fit(kl, 1, tmp_path / "kl", callbacks=[log])
    assert log.steps[0]["compute/reference"] == log.steps[0]["compute/trained"] == 12.0
    assert log.steps[0]["compute/units"] == 18.0 + 2.0 * 12 + 0.5 * 12 + 1.0 * 6
    with pytest.raises(ValueError, match="compute_cost.trained must be a finite number >= 0"):
        ComputeCost(trained=-1.0)


def test_the_compute_spent_is_resumed_from_the_checkpoint(tmp_path) -> None:
    from tests.checkpoints import make_tiny_checkpoint as made

    full, first, resumed = made.model(), made.model(), made.model()
    made.trainer(tmp_path / "full", 3, enable_checkpointing=False).fit(full, made.data())
    checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    made.trainer(tmp_path / "first", 2, callbacks=[checkpoint]).fit(first, made.data())
    made.trainer(tmp_path / "resumed", 3, enable_checkpointing=False).fit(
        resumed, made.data(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt")
    )
    assert resumed.iteration == 3 and resumed.compute_spent == full.compute_spent != first.compute_spent
