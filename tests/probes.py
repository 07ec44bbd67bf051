"""Callbacks and rewards that let subprocess tests observe or disturb a run: per-rank parameters,
gates that hold a training step or an evaluation batch at a known point until the test has
signalled the process, a reward that fails on purpose, and a recorder of what a module logs."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lit_treegrpo.rewards import RewardModel


class SaveRankParameters(pl.Callback):
    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        params = {n: p.detach().cpu() for n, p in pl_module.named_parameters() if p.requires_grad}
        torch.save(params, self.folder / f"rank{trainer.global_rank}.pt")


class GateInStep(pl.Callback):
    """Holds training step ``iteration`` inside its first model call of ``phase`` (``rollout``:
    the tree's first denoising step; ``training``: the first log-prob recomputation with grad):
    touches ``<folder>/inside``, then waits until ``<folder>/go`` exists. A test sends its signal
    between the two, so the signal is known to arrive during that phase. Once per folder: a
    resumed run (``inside`` already there) passes straight through."""

    def __init__(self, folder: str, iteration: int = 3, phase: str = "rollout", timeout_s: float = 300.0) -> None:
        if phase not in ("rollout", "training"):
            raise ValueError(f"phase must be 'rollout' or 'training', got {phase!r}")
        self.folder = Path(folder)
        self.iteration = iteration
        self.phase = phase
        self.timeout_s = timeout_s

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        inside = self.folder / "inside"
        if pl_module.iteration != self.iteration or inside.exists():
            return
        adapter = pl_module.adapter
        predict = adapter.predict
        held = []

        def gated(x, step_index, cond):
            # the rollout passes an int step; training recomputes with a [B] tensor under grad
            in_phase = isinstance(step_index, int) if self.phase == "rollout" else torch.is_grad_enabled()
            if in_phase and not held:
                held.append(True)
                self.folder.mkdir(parents=True, exist_ok=True)
                inside.touch()
                deadline = time.monotonic() + self.timeout_s
                while not (self.folder / "go").exists():
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"GateInStep: nobody created {self.folder / 'go'}")
                    time.sleep(0.01)
            return predict(x, step_index, cond)

        adapter.predict = gated

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if "predict" in vars(pl_module.adapter):
            del pl_module.adapter.predict  # the adapter's own method again


class SignalInEval(pl.Callback):
    """Sends this process SIGTERM at the start of evaluation / predict batch ``batch``, as a
    ``kill`` arriving there would (Lightning's handler only records it)."""

    def __init__(self, batch: int = 0) -> None:
        self.batch = batch

    def _maybe_signal(self, batch_idx: int) -> None:
        if batch_idx == self.batch:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._maybe_signal(batch_idx)

    def on_test_batch_start(
        self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._maybe_signal(batch_idx)

    def on_predict_batch_start(
        self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._maybe_signal(batch_idx)


class FlakyReward(RewardModel):
    """Mean brightness, failing on purpose on the listed reward calls (counted from 0 in this
    process): ``raise_on`` raises ``RuntimeError``, ``nan_on`` gives NaN to the leaves of the
    batch's first prompt. ``rank``: only on that data-parallel rank (``None``: on every rank)."""

    name = "flaky"

    def __init__(self, raise_on: list[int] = (), nan_on: list[int] = (), rank: int | None = None) -> None:
        super().__init__()
        self.raise_on = set(raise_on)
        self.nan_on = set(nan_on)
        self.rank = rank
        self.calls = 0
        self.freeze()

    def score_batch(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        call, self.calls = self.calls, self.calls + 1
        scores = images.mean(dim=(1, 2, 3))  # [B]
        if self.rank is not None and int(os.environ.get("LOCAL_RANK", "0")) != self.rank:
            return scores
        if call in self.raise_on:
            raise RuntimeError(f"reward service unavailable (call {call})")
        if call in self.nan_on:
            first = torch.tensor([p == prompts[0] for p in prompts], device=scores.device)  # [B]
            scores = torch.where(first, torch.full_like(scores, float("nan")), scores)
        return scores


def logged_metrics(model: pl.LightningModule) -> list[dict[str, float]]:
    """From now on, every ``log_dict`` call of ``model`` as a dict of its scalars (floats): what a
    training step logs, in order."""
    logged: list[dict[str, float]] = []
    log_dict = model.log_dict

    def keep(metrics, *args, **kwargs):
        logged.append({k: float(v) for k, v in metrics.items() if isinstance(v, (float, torch.Tensor))})
        return log_dict(metrics, *args, **kwargs)

    model.log_dict = keep
    return logged


class CountGradientSyncs(pl.Callback):
    """Counts this rank's gradient collectives per training iteration beside its optimizer steps: FSDP2's
    reduce-scatters (``torch.distributed.reduce_scatter_tensor``, wrapped) or DDP's bucket all-reduces (a comm
    hook that counts, then all-reduces as DDP's default does). Also writes the memory guard's gradient figure
    beside the bytes of gradient this rank holds, and the trained tensors' dtypes. ``defer: false`` makes every
    micro-batch sync (FSDP2: the memory guard's choice when the unsharded gradients do not fit; DDP: Lightning's
    no_sync skipped): the version to compare with. Writes ``<folder>/rank<r>.json`` at the end of training."""

    def __init__(self, folder: str, defer: bool = True) -> None:
        self.folder, self.defer = Path(folder), defer
        self.calls, self.per_iteration, self.steps_before = 0, [], 0

    def setup(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        import torch.distributed as dist

        for name in ("reduce_scatter_tensor", "reduce_scatter_single"):  # FSDP2 calls the latter in torch >= 2.12
            if hasattr(dist, name):
                setattr(dist, name, self._counted(getattr(dist, name)))
        if not self.defer:
            memory = pl_module.algorithm.memory
            decide = memory._decide_gradient_sync

            def never(*args: Any, **kwargs: Any) -> Any:
                estimate = decide(*args, **kwargs)
                memory.defer_sync = False
                return estimate

            memory._decide_gradient_sync = never

    def _counted(self, collective: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return collective(*args, **kwargs)

        return counted

    def on_train_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel

        model = trainer.strategy.model
        if isinstance(model, DistributedDataParallel):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            # a lambda: DDP refuses a hook whose bucket annotation is not dist.GradBucket itself (a string here)
            model.register_comm_hook(None, lambda state, bucket: self._counted(allreduce_hook)(state, bucket))
            if not self.defer:  # DDP's no_sync skipped: every micro-batch all-reduces
                import contextlib

                trainer.strategy.block_backward_sync = contextlib.nullcontext
        self.steps_before = trainer.global_step

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        self.per_iteration.append([self.calls, trainer.global_step - self.steps_before])
        self.calls, self.steps_before = 0, trainer.global_step

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        import json

        from torch.distributed.fsdp import FSDPModule

        for module in pl_module.modules():  # FSDP2 leaves the root gathered (bf16) after its last forward
            if isinstance(module, FSDPModule):
                module.reshard()
        params = pl_module.adapter.trainable_parameters()
        memory = pl_module.algorithm.memory
        record = {
            "per_iteration": self.per_iteration,
            "defer_sync": memory.defer_sync,
            "guard_gradients": memory.memory.fixed["gradients"] if memory.memory is not None else None,
            "held_gradient_bytes": sum(
                (p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size() for p in params
            ),
            "global_gradient_bytes": sum(p.numel() * p.element_size() for p in params),
            "dtypes": sorted({str(p.dtype) for p in params}),
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))
