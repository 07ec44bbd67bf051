"""Prompts for RL post-training: :class:`PromptDataModule`, with a train / validation split."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, IterableDataset

from ..common.reads import regular_file
from .prompt_sets import PromptSet, load_prompts
from .prompt_stream import PromptChunks, PromptStream, collate, eval_batches, prompt_permutation

__all__ = ["DEFAULT_BATCH_SIZE", "PromptDataModule", "resolve_batch_size"]

DEFAULT_BATCH_SIZE = 4  # prompts per rank when neither batch size is given


def resolve_batch_size(batch_size: int | None, global_batch_size: int | None, world_size: int) -> int:
    """Prompts per data-parallel rank from ``--data.batch_size`` / ``--data.global_batch_size``."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if global_batch_size is None:
        return DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    per_rank, rest = divmod(global_batch_size, world_size)
    if rest:
        lower = per_rank * world_size
        choices = f"{lower} or {lower + world_size}" if lower else f"{world_size}"
        raise ValueError(
            f"--data.global_batch_size {global_batch_size} is not divisible by the {world_size} "
            f"data-parallel processes (--trainer.devices x --trainer.num_nodes); use a multiple of "
            f"{world_size} ({choices}), or give --data.batch_size (prompts per process) instead"
        )
    if batch_size is not None and batch_size != per_rank:
        raise ValueError(
            f"--data.batch_size {batch_size} and --data.global_batch_size {global_batch_size} disagree: "
            f"{world_size} process(es) x {batch_size} != {global_batch_size}; give only one of them "
            "(--data.batch_size null keeps the global one)"
        )
    return per_rank


def _load(source: str, option: str) -> PromptSet:
    """:func:`load_prompts` of ``source``, once a FIFO, device or socket there is refused by its status, never opened
    (:func:`~lit_treegrpo.common.reads.regular_file`): load_prompts tells a file by ``is_file``, and would call one a
    missing prompt set. A folder, or nothing, is load_prompts' to name (a built-in set's name may be a folder here)."""
    path = Path(source).expanduser()
    if os.path.lexists(path) and not path.is_dir():
        fix = "give a .txt, .jsonl or .csv file of prompts, or the name of a built-in prompt set"
        regular_file(path, "a prompt file", fix, option=option)
    return load_prompts(source, option=option)


class PromptDataModule(LightningDataModule):
    """Prompts for training (an infinite, seeded, data-parallel stream) and validation (fixed)."""

    def __init__(
        self,
        prompts: str,
        batch_size: int | None = None,
        global_batch_size: int | None = None,
        val_prompts: str | None = None,
        val_fraction: float = 0.05,
        val_size: int | None = 16,
        seed: int = 0,
    ) -> None:
        """
        Args:
            prompts: Training prompts: a .txt file (one prompt per line), a .jsonl file (a "prompt" field per line,
                other fields kept as metadata), a .csv file (a "prompt" column, other columns kept as metadata),
                or the name of a built-in set: hpdv2_style, animals, shapes, shapes_world.
            batch_size: Prompts per rank per training step (the global batch is batch_size x the
                number of data-parallel ranks). Default 4 when global_batch_size is not given either.
            global_batch_size: Prompts per training step over all data-parallel ranks, as the papers quote it ("batch
                32"); each rank then takes global_batch_size / (devices x num_nodes), and a world size
                that does not divide it is refused.
            val_prompts: Validation prompts (file or built-in set, as for prompts).
            val_fraction: Fraction of the distinct prompts held out for validation when
                val_prompts is not given (rounded up; 0 = no validation), in [0, 1).
            val_size: At most this many validation prompts (the first ones of val_prompts, or
                fewer held out); null = no cap.
            seed: Seed of the hold-out choice and of the order in which training prompts are drawn.
        """
        super().__init__()
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"--data.batch_size must be >= 1, got {batch_size}")
        if global_batch_size is not None and global_batch_size < 1:
            raise ValueError(f"--data.global_batch_size must be >= 1, got {global_batch_size}")
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(
                f"--data.val_fraction must be in [0, 1), got {val_fraction}; it is the fraction of "
                "prompts held out for validation (0 = none)"
            )
        if val_size is not None and val_size < 0:
            raise ValueError(f"--data.val_size must be >= 0 or null (no cap), got {val_size}")
        self.source = prompts
        self.val_source = val_prompts
        self.batch_size = batch_size
        self.global_batch_size = global_batch_size
        self.val_fraction = val_fraction
        self.val_size = val_size
        self.seed = seed
        self.start_index = 0
        """Global index of the first training batch; set from a resumed step counter."""
        self.all_set = _load(prompts, "--data.prompts")
        self.train_set, self.val_set = self._split()
        # before anything draws a batch (drawing 10^8 prompts alone takes hours); the world size,
        # and so how batch_size and global_batch_size relate, is only known in setup
        self._check_batch_fits(global_batch_size or batch_size or DEFAULT_BATCH_SIZE, 1)

    def _split(self) -> tuple[PromptSet, PromptSet]:
        prompts, metadata = self.all_set
        if self.val_source is not None:
            val = _load(self.val_source, "--data.val_prompts")
            cap = len(val.prompts) if self.val_size is None else self.val_size
            val = PromptSet(val.prompts[:cap], val.metadata[:cap])
            overlap = set(prompts) & set(val.prompts)
            if overlap:
                rank_zero_warn(
                    f"--data.val_prompts: {len(overlap)} validation prompt(s) are also training prompts "
                    f"(e.g. {next(iter(overlap))!r}); validation on them does not measure generalisation"
                )
            return self.all_set, val
        distinct = list(dict.fromkeys(prompts))  # first occurrences, file order
        # round() first: 0.07 * 100 is 7.000000000000001 in floating point, which must not ceil to 8
        n_held = math.ceil(round(self.val_fraction * len(distinct), 6))
        if self.val_size is not None:
            n_held = min(n_held, self.val_size)
        held = {distinct[i] for i in prompt_permutation(len(distinct), "holdout", self.seed)[:n_held]}
        train = [(p, m) for p, m in zip(prompts, metadata) if p not in held]
        if not train:
            raise ValueError(
                f"--data.prompts: all {len(distinct)} distinct prompt(s) of '{self.source}' are held out "
                f"for validation (--data.val_fraction {self.val_fraction}, rounded up), none are left to "
                "train on; set --data.val_fraction 0 or give a separate --data.val_prompts"
            )
        first = {}
        for p, m in zip(prompts, metadata):
            first.setdefault(p, m)
        val = [(p, first[p]) for p in distinct if p in held]
        return (
            PromptSet([p for p, _ in train], [m for _, m in train]),
            PromptSet([p for p, _ in val], [m for _, m in val]),
        )

    # -- ranks ----------------------------------------------------------------------------------

    def data_parallel(self) -> tuple[int, int]:
        """(rank, world size) of data parallelism."""
        trainer = self.trainer
        if trainer is not None and (kwargs := trainer.distributed_sampler_kwargs):
            return kwargs["rank"], kwargs["num_replicas"]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def _rank_world(self, rank: int | None, world_size: int | None) -> tuple[int, int]:
        auto_rank, auto_world = self.data_parallel()
        return (auto_rank if rank is None else rank), (auto_world if world_size is None else world_size)

    def per_rank_batch_size(self, world_size: int | None = None) -> int:
        """Prompts per rank for ``world_size`` data-parallel ranks (default: the current one);
        refused when a step would draw more prompts than there are training prompts."""
        world = self.data_parallel()[1] if world_size is None else world_size
        per_rank = resolve_batch_size(self.batch_size, self.global_batch_size, world)
        self._check_batch_fits(per_rank, world)
        return per_rank

    def _check_batch_fits(self, per_rank: int, world: int) -> None:
        """Refuse a training step of more prompts than the training set holds: it would repeat
        prompts within the step (as separate groups), and a huge one would take hours to draw."""
        available = len(self.train_set.prompts)
        if per_rank * world <= available:
            return
        held = len(self.all_set.prompts) - available if self.val_source is None else 0
        after = f" after holding out {held} for validation" if held else ""
        if self.global_batch_size is not None:
            asked = f"--data.global_batch_size {self.global_batch_size} asks"
        else:
            default = " (the default)" if self.batch_size is None else ""
            processes = f" x {world} data-parallel processes" if world > 1 else ""
            asked = f"--data.batch_size {per_rank}{default}{processes} asks"
        most = available // world
        if most < 1:
            fix = f"use at most {available} data-parallel processes"
        elif self.global_batch_size is not None:
            fix = f"use --data.global_batch_size {most * world} or less"
        else:
            fix = f"use --data.batch_size {most} or less"
        raise ValueError(
            f"{asked} for {per_rank * world} prompts per training step, but '{self.source}' has "
            f"{available} training prompts{after}; {fix}, or give more prompts"
        )

    def setup(self, stage: str) -> None:
        """Check the batch sizes against the world size, now that the trainer knows it."""
        self.per_rank_batch_size()

    # -- datasets -------------------------------------------------------------------------------

    def train_dataset(self, rank: int | None = None, world_size: int | None = None) -> PromptStream:
        """This rank's training stream from :attr:`start_index` (rank / world size overridable)."""
        rank, world_size = self._rank_world(rank, world_size)
        return PromptStream(
            self.train_set,
            batch_size=self.per_rank_batch_size(world_size),
            seed=self.seed,
            rank=rank,
            world_size=world_size,
            start_index=self.start_index,
        )

    def val_dataset(self, rank: int | None = None, world_size: int | None = None) -> PromptChunks:
        """This rank's validation chunks, padded to the same count on every rank."""
        rank, world_size = self._rank_world(rank, world_size)
        batch_size = self.per_rank_batch_size(world_size)
        return PromptChunks(eval_batches(self.val_set, batch_size, rank=rank, world_size=world_size))

    def predict_dataset(self, rank: int | None = None, world_size: int | None = None) -> PromptChunks:
        """This rank's share of the validation prompts, each prompt once over all ranks."""
        rank, world_size = self._rank_world(rank, world_size)
        batch_size = self.per_rank_batch_size(world_size)
        batches = eval_batches(self.val_set, batch_size, rank=rank, world_size=world_size, pad=False)
        return PromptChunks(batches)

    @staticmethod
    def _loader(dataset: IterableDataset) -> DataLoader:
        # Prompts are strings: worker processes would cost more than they save.
        return DataLoader(dataset, batch_size=None, collate_fn=collate, num_workers=0)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset())

    def val_dataloader(self) -> DataLoader | list:
        # An empty list tells Lightning there is no validation (val_fraction 0 / val_size 0).
        return self._loader(self.val_dataset()) if self.val_set.prompts else []

    def test_dataloader(self) -> DataLoader | list:
        return self.val_dataloader()

    def predict_dataloader(self) -> DataLoader | list:
        return self._loader(self.predict_dataset()) if self.val_set.prompts else []

    # -- checkpoint -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What the stream depends on, to refuse resuming on other prompts, seed or split."""
        return {
            "source": self.source,
            "seed": self.seed,
            "num_prompts": len(self.all_set.prompts),
            "prompts_sha256": self.all_set.fingerprint(),
            "num_train": len(self.train_set.prompts),
            "train_sha256": self.train_set.fingerprint(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check that a checkpoint was trained on the same prompts, seed and split as this run."""
        old, now = state_dict, self.state_dict()
        if (old["num_prompts"], old["prompts_sha256"]) != (now["num_prompts"], now["prompts_sha256"]):
            raise ValueError(
                f"--data.prompts: the checkpoint was trained on {old['num_prompts']} prompts from "
                f"'{old['source']}' (sha256 {old['prompts_sha256'][:12]}), but '{self.source}' now gives "
                f"{now['num_prompts']} prompts (sha256 {now['prompts_sha256'][:12]}); resume with the same "
                "prompts, or start a new run without --ckpt_path to train on different ones"
            )
        if old["seed"] != self.seed:
            raise ValueError(
                f"--data.seed: the checkpoint's data seed is {old['seed']}, this run's is {self.seed}; "
                "resume with the same seed, or start a new run without --ckpt_path"
            )
        if old["train_sha256"] != now["train_sha256"]:
            raise ValueError(
                f"--data.val_prompts / --data.val_fraction / --data.val_size: the checkpoint trained on "
                f"{old['num_train']} prompts after the validation hold-out, this run would train on "
                f"{now['num_train']} different ones; resume with the same validation settings"
            )
