"""Reward statistics of every training step, epoch and validation, synchronised across ranks."""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor
from torchmetrics import Metric
from typing_extensions import override

from lit_treegrpo.core.diversity import mean_pairwise_rms
from lit_treegrpo.core.samples import ScoredSamples

from ._media import MediaWriters

PromptStats = dict[str, list[float]]  # prompt -> [sum of rewards, number of leaves]


class RewardStats(Metric):
    """Mean, population std, max and min of all values seen (float64 sums, reduced by sum /
    max / min across processes)."""

    full_state_update = False
    higher_is_better = None
    is_differentiable = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("count", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total_sq", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("max_value", torch.full((), -math.inf, dtype=torch.float64), dist_reduce_fx="max")
        self.add_state("min_value", torch.full((), math.inf, dtype=torch.float64), dist_reduce_fx="min")

    def update(self, values: Tensor) -> None:
        v = values.detach().to(torch.float64).flatten()  # [N]
        if v.numel() == 0:
            return
        self.count += v.numel()
        self.total += v.sum()
        self.total_sq += (v * v).sum()
        self.max_value = torch.maximum(self.max_value, v.max())
        self.min_value = torch.minimum(self.min_value, v.min())

    def compute(self) -> dict[str, Tensor]:
        mean = self.total / self.count
        var = (self.total_sq / self.count - mean * mean).clamp(min=0.0)  # rounding can make it < 0
        return {"mean": mean, "std": var.sqrt(), "max": self.max_value, "min": self.min_value}


class SampleDiversity(Metric):
    """Within-prompt spread of images: for every prompt with two or more images, the mean pairwise
    RMS distance between them (pixels in [0, 1], images average-pooled to at most ``max_side``
    pixels a side first, so that texture does not dominate), averaged over prompts."""

    full_state_update = False
    higher_is_better = None
    is_differentiable = False

    def __init__(self, max_side: int = 64, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if max_side < 1:
            raise ValueError(f"SampleDiversity.max_side must be >= 1, got {max_side}")
        self.max_side = max_side
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("groups", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, images: Tensor, prompts: list[str]) -> None:
        x = images.detach().float()  # [N, 3, H, W], or videos [N, F, 3, H, W]
        x = x.reshape(x.shape[0], -1, *x.shape[-2:])  # frames stacked as channels: [N, F * 3, H, W]
        side = max(x.shape[-2:])
        if side > self.max_side:
            x = torch.nn.functional.adaptive_avg_pool2d(
                x, (self.max_side * x.shape[-2] // side, self.max_side * x.shape[-1] // side)
            )
        flat = x.flatten(1)  # [N, D]
        groups: dict[str, list[int]] = {}
        for i, p in enumerate(prompts):
            groups.setdefault(p, []).append(i)
        for rows in groups.values():
            n = len(rows)
            if n < 2:
                continue
            self.total += mean_pairwise_rms(flat[rows])  # [n, D] -> mean over ordered pairs i != j
            self.groups += 1

    def compute(self) -> Tensor:
        return self.total / self.groups if self.groups > 0 else torch.tensor(float("nan"), dtype=torch.float64)


def per_prompt_sums(rewards: Tensor, prompts: list[str]) -> PromptStats:
    """``{prompt: [sum of its leaves' rewards, number of leaves]}`` in first-seen order."""
    out: PromptStats = {}
    for r, p in zip(rewards.detach().double().cpu().tolist(), prompts, strict=True):
        entry = out.setdefault(p, [0.0, 0.0])
        entry[0] += r
        entry[1] += 1
    return out


def merge_sums(parts: list[PromptStats]) -> PromptStats:
    """Sum per-prompt ``[sum, count]`` entries of several ranks."""
    out: PromptStats = {}
    for part in parts:
        for p, (s, n) in part.items():
            entry = out.setdefault(p, [0.0, 0.0])
            entry[0] += s
            entry[1] += n
    return out


def format_table(rows: dict[str, tuple[float, ...]], columns: tuple[str, ...], k: int, title: str) -> str:
    """Markdown table of the ``k`` best and ``k`` worst rows by their first value (all rows, best
    first, when there are at most ``2 k``); ints print as ints, floats with 4 significant digits."""
    ranked = sorted(rows.items(), key=lambda item: item[1][0], reverse=True)
    header = "| rank | prompt | " + " | ".join(columns) + " |\n|---|---|" + "---|" * len(columns) + "\n"

    def lines(items: list[tuple[int, tuple[str, tuple[float, ...]]]]) -> str:
        return "".join(
            f"| {i + 1} | {_cell(p)} | " + " | ".join(_fmt(x) for x in values) + " |\n" for i, (p, values) in items
        )

    numbered = list(enumerate(ranked))
    if len(ranked) <= 2 * k:
        return f"{title}\n\n{header}{lines(numbered)}"
    return f"{title}\n\n**best {k}**\n\n{header}{lines(numbered[:k])}\n**worst {k}**\n\n{header}{lines(numbered[-k:])}"


#: best and worst prompts shown in the text tables
TABLE_SIZE = 5


class RewardMetrics(Callback):
    """Reward mean / std / max / min (and per component) per training step, epoch and validation.

    Args:
        prompt_key: what ranks prompts: ``"reward"`` (the total) or ``"reward/<component>"``.
        diversity: log the within-prompt spread of the images (``diversity``, ``val/diversity``)
            when the samples carry ``images``.
    """

    def __init__(
        self,
        prompt_key: str = "reward",
        diversity: bool = True,
    ) -> None:
        if prompt_key != "reward" and not prompt_key.startswith("reward/"):
            raise ValueError(f"RewardMetrics.prompt_key must be 'reward' or 'reward/<component>', got {prompt_key!r}")
        self.prompt_key = prompt_key
        self.diversity = diversity
        self._diversity: dict[str, SampleDiversity] = {}  # phase -> metric
        self.table: dict[str, list[float]] = {}  # prompt -> [sum, count, last step's mean]
        self._metrics: dict[tuple[str, str], RewardStats] = {}  # (phase, name) -> statistics
        self._val_prompts: list[PromptStats] = []
        self._step_index: int | None = None
        self._writers = MediaWriters("RewardMetrics")

    # ------------------------------------------------------------------------ helpers
    def _metric(self, phase: str, name: str, device: torch.device) -> RewardStats:
        key = (phase, name)
        if key not in self._metrics:
            self._metrics[key] = RewardStats().to(device)
        return self._metrics[key]

    @staticmethod
    def _samples(outputs: Any, where: str) -> ScoredSamples:
        """The step's :class:`ScoredSamples` in Lightning's ``outputs`` (refused when there are none)."""
        samples = ScoredSamples.of(outputs)
        if samples is None:
            raise ValueError(
                f"RewardMetrics needs the {where} to return lit_treegrpo.core.ScoredSamples (a training "
                f"step: its as_step_output()); got {type(outputs).__name__}"
            )
        return samples

    def _read(
        self, samples: ScoredSamples, where: str, allow_empty: bool = False
    ) -> tuple[dict[str, Tensor], list[str]]:
        """``({"reward": [L], "reward/<c>": [L], ...}, leaf prompts)`` of a step's samples, checked
        for shape and finiteness."""
        prompts = list(samples.prompts)
        if not prompts and not allow_empty:
            raise ValueError(f"{where}: no leaf images (no prompts), nothing to measure")
        values = {"reward": samples.rewards}
        values.update({f"reward/{k}": v for k, v in samples.reward_components.items()})
        if self.prompt_key not in values:
            raise ValueError(
                f"RewardMetrics.prompt_key={self.prompt_key!r} is not among this {where}'s rewards {sorted(values)}"
            )
        for name, v in values.items():
            if v.ndim != 1 or v.shape[0] != len(prompts):
                raise ValueError(f"{where}: {name} has shape {tuple(v.shape)} but there are {len(prompts)} prompts")
            bad = ~torch.isfinite(v)
            if bool(bad.any()):
                names = sorted({prompts[i] for i in bad.nonzero().flatten().tolist()})
                raise ValueError(
                    f"{where}: non-finite {name} ({int(bad.sum())} of {len(prompts)} leaves) for "
                    f"prompts {names[:10]}{' ...' if len(names) > 10 else ''}"
                )
        return values, prompts

    def _diversity_metric(self, phase: str, samples: ScoredSamples) -> SampleDiversity | None:
        """The phase's diversity metric, updated with the samples' images (``None``: not measured)."""
        if not self.diversity or samples.images is None:
            return None
        images = samples.images
        if phase not in self._diversity:
            self._diversity[phase] = SampleDiversity().to(images.device)
        metric = self._diversity[phase]
        metric.update(images, list(samples.prompts))
        return metric

    def _logged(self, values: dict[str, Tensor]) -> dict[str, Tensor]:
        return values

    @staticmethod
    def _gather(trainer: pl.Trainer, obj: PromptStats) -> list[PromptStats]:
        """Every rank's ``obj`` on every rank (strings cannot go through tensor collectives)."""
        if trainer.world_size == 1 or not torch.distributed.is_initialized():
            return [obj]
        parts: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(parts, obj)
        return parts

    @staticmethod
    def _log_stats(
        pl_module: pl.LightningModule, prefix: str, suffix: str, stats: dict[str, Tensor], **kw: Any
    ) -> None:
        """Log already reduced statistics (no further sync), ``reward/mean`` in the progress bar."""
        for stat, value in stats.items():
            name = f"{prefix}/{stat}{suffix}"
            pl_module.log(name, value.float(), prog_bar=name == "reward/mean", **kw)

    def _write_text(self, trainer: pl.Trainer, tag: str, text: str, step: int) -> None:
        if trainer.is_global_zero:
            for writer in self._writers(trainer):
                writer.text(tag, text, step)
                writer.flush()

    def _running_table_text(self) -> str:
        rows = {p: (s / n, last, int(n)) for p, (s, n, last) in self.table.items()}
        title = f"per-prompt {self.prompt_key}, mean over training so far ({len(rows)} prompts)"
        return format_table(rows, ("mean", "last step's mean", "leaves"), TABLE_SIZE, title)

    # ------------------------------------------------------------------------ training
    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step_index = pl_module.iteration

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # a step whose prompts the module's fault policy left out (faults.nonfinite=skip) has no
        # leaves here; it still takes part in the collectives, so that data-parallel ranks stay in step
        where = f"training step {self._step_index}"
        samples = self._samples(outputs, where)
        values, prompts = self._read(samples, where, allow_empty=True)
        for name, v in self._logged(values).items():
            step = self._metric("step", name, v.device)
            step.update(v)
            stats = step.compute()  # reduced over ranks
            step.reset()
            self._metric("epoch", name, v.device).update(v)
            if bool(torch.isfinite(stats["mean"])):  # no leaf on any rank: nothing to log
                self._log_stats(pl_module, name, "", stats, on_step=True, on_epoch=False)
        diversity = self._diversity_metric("train", samples)
        if diversity is not None:
            value = diversity.compute()  # reduced over ranks
            diversity.reset()
            if torch.isfinite(value):
                pl_module.log("diversity", value.float(), on_step=True, on_epoch=False)
        # the best / worst per-prompt mean reward of the step, and the running per-prompt table
        merged = merge_sums(self._gather(trainer, per_prompt_sums(values[self.prompt_key], prompts)))
        means = {p: s / n for p, (s, n) in merged.items()}
        if means:
            pl_module.log(f"{self.prompt_key}/prompt_best", max(means.values()), on_step=True, on_epoch=False)
            pl_module.log(f"{self.prompt_key}/prompt_worst", min(means.values()), on_step=True, on_epoch=False)
        for p, (s, n) in merged.items():
            entry = self.table.setdefault(p, [0.0, 0.0, 0.0])
            entry[0] += s
            entry[1] += n
            entry[2] = s / n

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for (phase, name), metric in self._metrics.items():
            if phase == "epoch" and metric.update_count > 0:
                self._log_stats(pl_module, name, "_epoch", metric.compute(), on_step=False, on_epoch=True)
                metric.reset()
        if self.table:
            self._write_text(trainer, "reward/prompts", self._running_table_text(), pl_module.iteration)

    # ------------------------------------------------------------------------ validation
    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        where = f"validation batch {batch_idx}"
        samples = self._samples(outputs, where)
        values, prompts = self._read(samples, where)
        for name, v in self._logged(values).items():
            self._metric("val", name, v.device).update(v)
        self._diversity_metric("val", samples)
        self._val_prompts.append(per_prompt_sums(values[self.prompt_key], prompts))

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        val_prompts, self._val_prompts = merge_sums(self._val_prompts), []
        # every evaluation run gets fresh metrics: Lightning's stand-alone validate() runs under
        # inference mode and a fit's validation does not, and inference-mode states cannot be
        # updated outside it
        diversity = self._diversity.pop("val", None)
        val_keys = [key for key in self._metrics if key[0] == "val"]
        metrics = {name: self._metrics.pop((phase, name)) for phase, name in val_keys}
        if trainer.sanity_checking:
            return
        if diversity is not None:
            value = diversity.compute()
            if torch.isfinite(value):  # one sample per prompt: nothing to measure
                pl_module.log("val/diversity", value.float(), on_step=False, on_epoch=True)
        for name, metric in metrics.items():
            if metric.update_count > 0:
                self._log_stats(pl_module, f"val/{name}", "", metric.compute(), on_step=False, on_epoch=True)
        merged = merge_sums(self._gather(trainer, val_prompts))
        if merged:
            means = {p: s / n for p, (s, n) in merged.items()}
            pl_module.log(f"val/{self.prompt_key}/prompt_best", max(means.values()), on_step=False, on_epoch=True)
            pl_module.log(f"val/{self.prompt_key}/prompt_worst", min(means.values()), on_step=False, on_epoch=True)
            rows = {p: (s / n, int(n)) for p, (s, n) in merged.items()}
            title = f"validation {self.prompt_key} per prompt ({len(rows)} prompts)"
            text = format_table(rows, ("mean", "images"), TABLE_SIZE, title)
            self._write_text(trainer, "val/reward/prompts", text, pl_module.iteration)
        if self.table:
            self._write_text(trainer, "reward/prompts", self._running_table_text(), pl_module.iteration)

    # ------------------------------------------------------------------------ resume
    @override
    def state_dict(self) -> dict[str, Any]:
        return {"prompt_key": self.prompt_key, "table": {p: list(v) for p, v in self.table.items()}}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict["prompt_key"] != self.prompt_key:
            rank_zero_warn(
                f"RewardMetrics.prompt_key changed from {state_dict['prompt_key']!r} to "
                f"{self.prompt_key!r}; the running per-prompt table starts afresh"
            )
            return
        self.table = {p: [float(x) for x in v] for p, v in state_dict["table"].items()}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _fmt(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:.4g}"
