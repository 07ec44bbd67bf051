"""What :class:`~lit_treegrpo.training.module.TreeGRPOModule` writes into a checkpoint and does with
one it resumes from: :class:`CheckpointState`, mixed into the module (its methods are the module's
Lightning hooks).

A checkpoint holds the trainable weights only, and a ``lit_treegrpo`` entry: the iteration, the
fingerprint of what shaped the weights (:func:`~lit_treegrpo.training.resume.fingerprint`), the
fault counters, the counted compute and the settings a resume may change. A resumed fit is refused
when the fingerprint differs (:func:`~lit_treegrpo.training.resume.check_resumable`); the restored
optimizer and scheduler get this run's options back, and what changed is said in one line
(:mod:`lit_treegrpo.training.resume`). Tensors an earlier version trained that could never get a
gradient (:func:`drop_never_trained`) are left out of a checkpoint as it loads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any

from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info

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


class CheckpointState:
    """The module's checkpoint hooks (see the module docstring); a base class of ``TreeGRPOModule``."""

    def setup(self, stage: str) -> None:
        self._resumed = None  # set again by on_load_checkpoint when this fit resumes

    def on_train_start(self) -> None:
        """A resumed fit: Lightning has restored the checkpoint's optimizer and scheduler state by
        now; this run's options replace what the restore brought back, said in one line. Then the
        other parts' ``on_train_start``."""
        resumed, self._resumed = self._resumed, None
        if resumed is not None and self._configured is not None:
            self._apply_resumed_options(resumed)
        super().on_train_start()  # the other parts' hooks (Evaluation's validation at iteration 0)

    def _apply_resumed_options(self, resumed: dict[str, Any]) -> None:
        saved_optimizer, mine = resumed["fingerprint"].get("optimizer"), self._optimizer_name()
        if saved_optimizer is not None and saved_optimizer != mine:
            raise refusal("--model.optimizer", resumed["where"], saved_optimizer, mine)
        configs = self.trainer.lr_scheduler_configs
        changes = apply_optimizer_options(
            self.trainer.optimizers[0],
            configs[0].scheduler if configs else None,
            self._configured,
            resumed["settings"].get("lr_scheduler"),
            resumed["schedulers"] > 0,
        )
        changes += changed_settings(resumed["settings"], self._settings())
        if changes:
            rank_zero_info(f"resumed with {', '.join(changes)}")

    def _keep_foreign_scheduler_state_out(self) -> None:
        """Once both this run's scheduler and the checkpoint's are known (configure_optimizers
        comes after on_load_checkpoint, or before it under a sharded strategy), and before
        Lightning restores the scheduler: another class's state is not loaded into this one."""
        if self._resumed is not None and self._configured is not None:
            self._configured.replace_foreign_state(
                self._resumed["settings"].get("lr_scheduler"), self._resumed["scheduler_states"]
            )

    def _trainable_names(self) -> list[str]:
        return [n for n, p in self.named_parameters() if p.requires_grad]

    def _never_trained(self, name: str) -> bool:
        """Whether ``name`` is a weight of a module the adapter leaves untrained because its output is
        never used (:meth:`~lit_treegrpo.models.base.DiffusionAdapter.unused_modules`)."""
        where = {id(m): n for n, m in self.named_modules()}
        for model in self.adapter.trained_denoisers().values():
            for module in unused_submodules(model, self.adapter.unused_modules(model)):
                if name.startswith(f"{where[id(model)]}.{module}."):
                    return True
        return False

    def _fingerprint(self) -> dict[str, Any]:
        """What a resumed fit must share with the run that wrote the checkpoint (resume.FIELDS)."""
        shapes = {n: tuple(p.shape) for n, p in self.named_parameters() if p.requires_grad}
        reward, reward_kwargs = self._reward_record
        recorded: dict[str, Any] = {
            "lora": self.adapter.lora,
            "adapter_options": init_options(self.adapter, skip=ADAPTER_MEMORY_OPTIONS),
            "reward": reward,
            "reward_kwargs": reward_kwargs,
            "advantage": self.advantage,
            "loss": class_record(self.loss_fn),
            "seed": self.seed,
        }
        if self.adapter_config is not None:
            recorded["adapter_config"] = self.adapter_config
        if self._optimizer_name() is not None:
            recorded["optimizer"] = self._optimizer_name()
        return fingerprint(type(self.adapter).__name__, self.adapter.num_steps, self.tree, shapes, **recorded)

    def _optimizer_name(self) -> str | None:
        optimizers = self._trainer.optimizers if self._trainer is not None else []
        return type(optimizers[0]).__name__ if optimizers else None

    def _settings(self) -> dict[str, Any]:
        """The options a resume may change (resume.SETTINGS_OPTIONS), recorded so that it says
        which it changed."""
        datamodule = self._datamodule()
        settings: dict[str, Any] = {
            "minibatches": self.minibatches,
            "edges_per_update": self.edges_per_update,
            "accumulate": self.accumulate,
            "inner_epochs": self.inner_epochs,
            "grad_clip": self.grad_clip,
            "val_seed": self.val_seed,
            "val_samples": self.val_samples,
            "rollout": asdict(self.rollout_limits),
            "faults": asdict(self.faults),
            "memory_guard": asdict(self.memory_guard),
            "compute_cost": asdict(self.compute_cost),
            "lr_scheduler": self._configured.scheduler if self._configured is not None else None,
        }
        if datamodule is not None and hasattr(datamodule, "per_rank_batch_size") and self._trainer is not None:
            settings["global_batch_size"] = datamodule.per_rank_batch_size() * self.trainer.world_size
        return settings

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainable = set(self._trainable_names())
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}
        checkpoint["lit_treegrpo"] = {
            "iteration": self.iteration,
            "fingerprint": self._fingerprint(),
            "faults": self.fault_ledger.state_dict(),
            "compute": self.compute_spent.as_dict(),
            "settings": self._settings(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get("lit_treegrpo")
        if saved is None:
            raise ValueError("this checkpoint was not written by TreeGRPOModule (no 'lit_treegrpo' entry)")
        fitting = self._trainer is not None and self._trainer.state.fn == TrainerFn.FITTING
        path = self._trainer.ckpt_path if self._trainer is not None else None
        where = f"the checkpoint {path}" if path else "the checkpoint"
        dropped = drop_never_trained(checkpoint, self._never_trained, self._trainable_names())
        if dropped:
            rank_zero_info(
                f"{where} holds {len(dropped)} tensors of layers whose output the model never uses (e.g. "
                f"{dropped[0]}), which could get no gradient and are no longer trained; left out"
            )
        # what shaped the weights is compared for a resumed fit only: validate / test / predict /
        # export may evaluate them with another reward. (A sharded strategy loads the weights
        # itself and hands over no "state_dict".)
        check_resumable(
            saved["fingerprint"], self._fingerprint(), checkpoint.get("state_dict"), fitting=fitting, where=where
        )
        if fitting:
            self._resumed = {
                "where": where,
                "fingerprint": saved["fingerprint"],
                "settings": saved.get("settings") or {},
                "schedulers": len(checkpoint.get("lr_schedulers") or []),
                "scheduler_states": checkpoint.get("lr_schedulers"),
            }
            self._keep_foreign_scheduler_state_out()
        self.iteration = int(saved["iteration"])
        self.fault_ledger.load_state_dict(saved.get("faults", {}))
        # a checkpoint from before compute was counted starts the count at its iteration from 0
        self.compute_spent = Compute(**saved.get("compute", {}))
        self._sync_data_stream()  # sharded strategies restore after on_fit_start


def drop_never_trained(
    checkpoint: dict[str, Any], never_trained: Callable[[str], bool], mine: Iterable[str]
) -> list[str]:
    """Drop from a checkpoint the trainable tensors this run does not train because they could never
    get a gradient (``never_trained``: the LoRA of a layer whose output the model never uses, which
    earlier versions attached), with their optimizer state, so that the checkpoint resumes; the
    model's output does not depend on them. Returns the names dropped: none where their optimizer
    slots cannot be told (one parameter group in the weights' order, the weights in the checkpoint)."""
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
