"""Exponential moving average of the trainable (LoRA) parameters, swapped in for evaluation."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn
from typing_extensions import override

from lit_treegrpo.core.choices import choices, listing

ApplyOn = Literal["validation", "sample_grid"]
APPLY_ON: tuple[ApplyOn, ...] = choices(ApplyOn)


class EMA(Callback):
    """EMA of ``pl_module.trainable_parameters()`` (a ``PolicyModule``).

    Args:
        decay: weight of the old average in each update, in [0, 1).
        start_step: first number of completed training steps at which the average updates; the
            first update copies the weights.
        every_n_steps: update after every ``every_n_steps``-th training step.
        apply_on: where the averaged weights replace the training weights: ``"validation"``
            (swapped in from ``on_validation_start`` to ``on_validation_end``, and likewise for the
            ``test`` and ``predict`` commands) and ``"sample_grid"``
            (:class:`~lit_treegrpo.callbacks.SampleGridLogger` samples with them).
    """

    def __init__(
        self,
        decay: float = 0.999,
        start_step: int = 0,
        every_n_steps: int = 1,
        apply_on: Sequence[ApplyOn] = APPLY_ON,
    ) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA.decay must be in [0, 1), got {decay}")
        if start_step < 0:
            raise ValueError(f"EMA.start_step must be >= 0, got {start_step}")
        if every_n_steps < 1:
            raise ValueError(f"EMA.every_n_steps must be >= 1, got {every_n_steps}")
        if isinstance(apply_on, str):
            raise ValueError(f"EMA.apply_on must be a list of names, got the string {apply_on!r}")
        unknown = [a for a in apply_on if a not in APPLY_ON]
        if unknown:
            raise ValueError(f"EMA.apply_on accepts {listing(APPLY_ON)}; got {unknown}")
        self.decay = float(decay)
        self.start_step = start_step
        self.every_n_steps = every_n_steps
        self.apply_on = tuple(apply_on)
        self.num_updates = 0
        self.shadows: list[Tensor] = []  # float32, one per trainable parameter, on its device
        self._loaded: list[Tensor] | None = None  # shadows from a checkpoint, checked on first use
        self._stash: list[Tensor] | None = None  # training weights while the average is swapped in
        self._step_index: int | None = None  # pl_module.iteration before the running step
        self._for_validation = False  # the swap in force was made by on_validation_start

    # ------------------------------------------------------------------------ extension point
    def should_update(self, completed_steps: int) -> bool:
        """Whether to update after ``completed_steps`` training steps have completed."""
        return completed_steps >= self.start_step and completed_steps % self.every_n_steps == 0

    # ------------------------------------------------------------------------ the average
    @staticmethod
    def _params(pl_module: pl.LightningModule) -> list[nn.Parameter]:
        return list(pl_module.trainable_parameters())

    def _check_loaded(self, params: list[nn.Parameter]) -> None:
        """Adopt shadows restored by :meth:`load_state_dict` once the parameters are known."""
        if self._loaded is None:
            return
        loaded, self._loaded = self._loaded, None
        if len(loaded) != len(params):
            raise ValueError(
                f"EMA state has {len(loaded)} tensors but the model has {len(params)} trainable "
                "parameters; resume with the adapter / LoRA settings the checkpoint was trained with"
            )
        for i, (s, p) in enumerate(zip(loaded, params, strict=True)):
            if s.shape != p.shape:
                raise ValueError(
                    f"EMA state tensor {i} has shape {tuple(s.shape)} but trainable parameter {i} has "
                    f"{tuple(p.shape)}; resume with the adapter / LoRA settings of the checkpoint"
                )
        self.shadows = [s.to(device=p.device, dtype=torch.float32) for s, p in zip(loaded, params, strict=True)]

    @torch.no_grad()
    def update(self, pl_module: pl.LightningModule) -> None:
        """One EMA update from the current training weights (the first one copies them)."""
        if self._stash is not None:
            raise RuntimeError("EMA.update called while the averaged weights are swapped in")
        params = self._params(pl_module)
        self._check_loaded(params)
        if self.num_updates == 0:
            self.shadows = [p.detach().to(torch.float32, copy=True) for p in params]
        else:
            for s, p in zip(self.shadows, params, strict=True):
                s.mul_(self.decay).add_(p.detach().to(torch.float32), alpha=1.0 - self.decay)
        self.num_updates += 1

    @contextlib.contextmanager
    def swapped(self, pl_module: pl.LightningModule) -> Iterator[None]:
        """Run the block with the averaged weights in the trainable parameters; the training weights are restored
        bitwise afterwards, also on an exception."""
        if self._stash is not None or not self._swap_in(pl_module):
            yield
            return
        try:
            yield
        finally:
            if self._stash is not None:
                self._swap_out(pl_module)

    @torch.no_grad()
    def _swap_in(self, pl_module: pl.LightningModule) -> bool:
        params = self._params(pl_module)
        self._check_loaded(params)
        if self.num_updates == 0:
            return False
        self._stash = [p.detach().clone() for p in params]
        for s, p in zip(self.shadows, params, strict=True):
            p.copy_(s)  # casts to the parameter's dtype
        return True

    @torch.no_grad()
    def _swap_out(self, pl_module: pl.LightningModule) -> None:
        assert self._stash is not None
        for saved, p in zip(self._stash, self._params(pl_module), strict=True):
            p.copy_(saved)
        self._stash = None

    # ------------------------------------------------------------------------ hooks
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check_loaded(self._params(pl_module))  # a mismatching checkpoint fails here

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step_index = pl_module.iteration

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        assert self._step_index is not None
        # counted from the start of the step, whether the module bumps its counter in
        # training_step or in its own on_train_batch_end (which runs after the callbacks')
        if self.should_update(self._step_index + 1):
            self.update(pl_module)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if "validation" in self.apply_on and self._stash is None:
            self._for_validation = self._swap_in(pl_module)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._for_validation:
            self._for_validation = False
            self._swap_out(pl_module)

    # test and predict run from a checkpoint only (never inside a fit): as validation
    @override
    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.on_validation_start(trainer, pl_module)

    @override
    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.on_validation_end(trainer, pl_module)

    @override
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.on_validation_start(trainer, pl_module)

    @override
    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.on_validation_end(trainer, pl_module)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self._stash is not None:
            self._for_validation = False
            self._swap_out(pl_module)

    # ------------------------------------------------------------------------ checkpoints
    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """A checkpoint written while the average is swapped in (e.g. from a validation hook)
        must hold the training weights: put the stashed ones in place of the live tensors."""
        if self._stash is None:
            return
        names = {id(p): n for n, p in pl_module.named_parameters()}
        state = checkpoint["state_dict"]
        for saved, p in zip(self._stash, self._params(pl_module), strict=True):
            name = names[id(p)]
            if name not in state:
                raise KeyError(
                    f"EMA: checkpoint written while the averaged weights are swapped in, but the "
                    f"trainable parameter {name!r} is not in checkpoint['state_dict'] under its name"
                )
            state[name] = saved.clone()

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self.state_key not in checkpoint.get("callbacks", {}):
            rank_zero_warn(
                "EMA: the checkpoint holds no EMA state; the average restarts with the next update "
                "(a copy of the current weights)"
            )

    @override
    def state_dict(self) -> dict[str, Any]:
        shadows = self.shadows if self._loaded is None else self._loaded
        return {
            "shadows": list(shadows),
            "num_updates": self.num_updates,
            "options": {"decay": self.decay, "start_step": self.start_step, "every_n_steps": self.every_n_steps},
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict["options"]
        mine = {"decay": self.decay, "start_step": self.start_step, "every_n_steps": self.every_n_steps}
        if saved != mine:
            rank_zero_warn(f"EMA options differ from the checkpoint's ({saved} -> {mine}); the new ones apply")
        self.num_updates = int(state_dict["num_updates"])
        self.shadows = []
        # the module may not be on its final device yet: adopt the tensors on first use
        self._loaded = [t.detach().to(torch.float32) for t in state_dict["shadows"]] if self.num_updates else None
