"""What :class:`~lit_treegrpo.training.module.TreeGRPOModule` writes into a checkpoint and does with one it resumes
from."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any

from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info

from ..common.lightning_private import attached_trainer
from ..core.compute import Compute
from ..models.lora import unused_submodules
from .resume import (
    ADAPTER_MEMORY_OPTIONS,
    apply_optimizer_options,
    changed_settings,
    check_resumable,
    class_record,
    fingerprint,
    init_options,
    refusal,
)


def save_state(module: Any, checkpoint: dict[str, Any]) -> None:
    """Keep only the trainable weights, and add the ``lit_treegrpo`` entry."""
    trainable = set(_trainable_names(module))
    checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}
    checkpoint["lit_treegrpo"] = {
        "iteration": module.iteration,
        "fingerprint": run_fingerprint(module),
        "faults": module.algorithm.faults.state_dict(),
        "compute": module.compute_spent.as_dict(),
        "settings": settings(module),
    }


def load_state(module: Any, checkpoint: dict[str, Any]) -> None:
    """Refuse a checkpoint whose fingerprint this fit may not resume, drop the tensors of layers the model never uses,
    restore the iteration, fault counters and compute, and keep what a resumed fit's ``on_train_start`` needs."""
    saved = checkpoint.get("lit_treegrpo")
    if saved is None:
        raise ValueError("this checkpoint was not written by TreeGRPOModule (no 'lit_treegrpo' entry)")
    trainer = attached_trainer(module)
    fitting = trainer is not None and trainer.state.fn == TrainerFn.FITTING
    path = trainer.ckpt_path if trainer is not None else None
    where = f"the checkpoint {path}" if path else "the checkpoint"
    dropped = drop_never_trained(checkpoint, lambda name: _never_trained(module, name), _trainable_names(module))
    if dropped:
        rank_zero_info(
            f"{where} holds {len(dropped)} tensors of layers whose output the model never uses (e.g. "
            f"{dropped[0]}), which could get no gradient and are no longer trained; left out"
        )
    # what shaped the weights is compared for a resumed fit only: validate / test / predict / export
    # may evaluate them with another reward (a sharded strategy hands over no "state_dict")
    check_resumable(
        saved["fingerprint"], run_fingerprint(module), checkpoint.get("state_dict"), fitting=fitting, where=where
    )
    if fitting:
        module._resumed = {
            "where": where,
            "fingerprint": saved["fingerprint"],
            "settings": saved.get("settings") or {},
            "schedulers": len(checkpoint.get("lr_schedulers") or []),
            "scheduler_states": checkpoint.get("lr_schedulers"),
        }
        keep_foreign_scheduler_state_out(module)
    module.iteration = int(saved["iteration"])
    module.algorithm.faults.load_state_dict(saved.get("faults", {}))
    # a checkpoint from before compute was counted starts the count at its iteration from 0
    module.compute_spent = Compute(**saved.get("compute", {}))


def apply_resumed_options(module: Any, resumed: dict[str, Any]) -> None:
    """A resumed fit, once Lightning restored the optimizer and scheduler: this run's options
    replace the restored ones, said in one line."""
    saved_optimizer, mine = resumed["fingerprint"].get("optimizer"), _optimizer_name(module)
    if saved_optimizer is not None and saved_optimizer != mine:
        raise refusal("--model.optimizer", resumed["where"], saved_optimizer, mine)
    configs = module.trainer.lr_scheduler_configs
    changes = apply_optimizer_options(
        module.trainer.optimizers[0],
        configs[0].scheduler if configs else None,
        module._configured,
        resumed["settings"].get("lr_scheduler"),
        resumed["schedulers"] > 0,
    )
    changes += changed_settings(resumed["settings"], settings(module))
    if changes:
        rank_zero_info(f"resumed with {', '.join(changes)}")


def keep_foreign_scheduler_state_out(module: Any) -> None:
    """Once this run's scheduler and the checkpoint's are both known, and before Lightning restores
    the scheduler: another class's state is not loaded into this one."""
    if module._resumed is not None and module._configured is not None:
        module._configured.replace_foreign_state(
            module._resumed["settings"].get("lr_scheduler"), module._resumed["scheduler_states"]
        )


def run_fingerprint(module: Any) -> dict[str, Any]:
    """What a resumed fit must share with the run that wrote the checkpoint (resume.FIELDS)."""
    shapes = {n: tuple(p.shape) for n, p in module.named_parameters() if p.requires_grad}
    reward, reward_kwargs = module._reward_record
    recorded: dict[str, Any] = {
        "lora": module.adapter.lora,
        "adapter_options": init_options(module.adapter, skip=ADAPTER_MEMORY_OPTIONS),
        "reward": reward,
        "reward_kwargs": reward_kwargs,
        "advantage": module.advantage,
        "loss": class_record(module.loss_fn),
        "seed": module.seed,
    }
    if module.adapter_config is not None:
        recorded["adapter_config"] = module.adapter_config
    if _optimizer_name(module) is not None:
        recorded["optimizer"] = _optimizer_name(module)
    return fingerprint(type(module.adapter).__name__, module.adapter.num_steps, module.tree, shapes, **recorded)


def settings(module: Any) -> dict[str, Any]:
    """The options a resume may change (resume.SETTINGS_OPTIONS), recorded so that it says which changed."""
    found: dict[str, Any] = {
        **asdict(module.update_settings),
        "val_samples": module.val_samples,
        "rollout": asdict(module.algorithm.rollout_limits),
        "faults": asdict(module.faults),
        "memory_guard": asdict(module.memory_guard),
        "work_limit": asdict(module.work_limit),
        "compute_cost": asdict(module.compute_cost),
        "lr_scheduler": module._configured.scheduler if module._configured is not None else None,
    }
    datamodule = module._datamodule()
    if datamodule is not None:
        found["global_batch_size"] = datamodule.per_rank_batch_size() * module.trainer.world_size
    return found


def _optimizer_name(module: Any) -> str | None:
    trainer = attached_trainer(module)
    optimizers = trainer.optimizers if trainer is not None else []
    return type(optimizers[0]).__name__ if optimizers else None


def _trainable_names(module: Any) -> list[str]:
    return [n for n, p in module.named_parameters() if p.requires_grad]


def _never_trained(module: Any, name: str) -> bool:
    """Whether ``name`` is a weight of a module the adapter leaves untrained because its output is
    never used (:meth:`~lit_treegrpo.models.base.DiffusionAdapter.unused_modules`)."""
    where = {id(m): n for n, m in module.named_modules()}
    adapter = module.adapter
    for model in adapter.trained_denoisers().values():
        for part in unused_submodules(model, adapter.unused_modules(model)):
            if name.startswith(f"{where[id(model)]}.{part}."):
                return True
    return False


def drop_never_trained(
    checkpoint: dict[str, Any], never_trained: Callable[[str], bool], mine: Iterable[str]
) -> list[str]:
    """Drop from a checkpoint the trainable tensors this run does not train because they could never get a gradient
    (the LoRA of a layer whose output is never used, which earlier versions attached), with their optimizer state,
    so that it resumes."""
    saved = (checkpoint.get("lit_treegrpo") or {}).get("fingerprint") or {}
    weights = checkpoint.get("state_dict")
    if weights is None or "trainable" not in saved:
        return []
    mine = set(mine)
    dropped = [name for name in saved["trainable"] if name not in mine and never_trained(name)]
    order = [name for name in weights if name in set(saved["trainable"])]  # the optimizer's order: the module's
    optimizers = checkpoint.get("optimizer_states") or []
    if not dropped or sorted(order) != sorted(saved["trainable"]):
        return []
    if any(len(o["param_groups"]) != 1 or len(o["param_groups"][0]["params"]) != len(order) for o in optimizers):
        return []
    slots = [order.index(name) for name in dropped]
    for optimizer in optimizers:
        group = optimizer["param_groups"][0]
        ids = {group["params"][slot] for slot in slots}
        group["params"] = [i for i in group["params"] if i not in ids]
        for i in ids:
            optimizer["state"].pop(i, None)
    for name in dropped:
        del weights[name]
        saved.get("shapes", {}).pop(name, None)
    saved["trainable"] = [name for name in saved["trainable"] if name not in dropped]
    return dropped
