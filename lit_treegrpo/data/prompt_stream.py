"""The stateless, data-parallel training stream of prompts, and the fixed evaluation batches."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from torch.utils.data import IterableDataset, get_worker_info

from .prompt_sets import PromptSet


class PromptBatch(NamedTuple):
    """The prompts of one step on one rank; Lightning moves it to a device unchanged (no tensors)."""

    prompts: list[str]
    """This rank's prompts for the step."""
    index: int
    """Training: the global batch index ``k`` of the stream. Validation / test / predict: the
    index of this chunk of the evaluation prompts (the same on every world size)."""
    metadata: list[dict[str, Any]]
    """Per prompt, the extra fields of a ``.jsonl`` line or ``.csv`` row (``{}`` for ``.txt``)."""


def collate(batch: PromptBatch) -> PromptBatch:
    """``collate_fn`` for a ``DataLoader(batch_size=None)`` over our datasets: the batch as is."""
    return batch


_MASK64 = (1 << 64) - 1


def prompt_permutation(n: int, *key: int | str) -> list[int]:
    """A permutation of ``range(n)`` that depends only on ``key`` (e.g. ``("stream", seed, epoch)``)."""
    state = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
        j = (z * (i + 1)) >> 64
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def _worker_slice() -> tuple[int, int]:
    """(this DataLoader worker, number of workers); (0, 1) in the main process."""
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class PromptStream(IterableDataset):
    """The infinite training stream of one data-parallel rank (see the module docstring)."""

    def __init__(
        self,
        prompt_set: PromptSet,
        *,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        start_index: int = 0,
    ) -> None:
        if not prompt_set.prompts:
            raise ValueError("PromptStream needs at least one prompt")
        if batch_size < 1:
            raise ValueError(f"--data.batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of size {world_size}")
        if start_index < 0:
            raise ValueError(f"start_index must be >= 0, got {start_index}")
        self.prompt_set = prompt_set
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.start_index = start_index
        self._perms: dict[int, list[int]] = {}

    @property
    def global_batch_size(self) -> int:
        """Prompts per step over all ranks, ``G = batch_size · world_size``."""
        return self.batch_size * self.world_size

    def position_index(self, position: int) -> int:
        """The training-prompt index at global stream position ``position``."""
        n = len(self.prompt_set.prompts)
        epoch, offset = divmod(position, n)
        perm = self._perms.get(epoch)
        if perm is None:
            if len(self._perms) >= 4:  # a batch spans few passes unless N is tiny, then perms are cheap
                self._perms.clear()
            perm = self._perms[epoch] = prompt_permutation(n, "stream", self.seed, epoch)
        return perm[offset]

    def indices(self, k: int) -> list[int]:
        """Training-prompt indices of batch ``k`` on this rank."""
        if k < 0:
            raise ValueError(f"batch index must be >= 0, got {k}")
        first = k * self.global_batch_size + self.rank * self.batch_size
        return [self.position_index(j) for j in range(first, first + self.batch_size)]

    def batch(self, k: int) -> PromptBatch:
        """Batch ``k`` on this rank: a pure function of ``(seed, k, rank, world_size, prompts)``."""
        idx = self.indices(k)
        return PromptBatch(
            [self.prompt_set.prompts[i] for i in idx], k, [dict(self.prompt_set.metadata[i]) for i in idx]
        )

    def __iter__(self) -> Iterator[PromptBatch]:
        worker, workers = _worker_slice()
        k = self.start_index + worker
        while True:
            yield self.batch(k)
            k += workers


class PromptChunks(IterableDataset):
    """A fixed, finite sequence of :class:`PromptBatch` (one rank's validation / test / predict
    batches); iterable-style so that Lightning never wraps it in a second distributed sampler."""

    def __init__(self, batches: Sequence[PromptBatch]) -> None:
        self.batches = list(batches)

    def __iter__(self) -> Iterator[PromptBatch]:
        worker, workers = _worker_slice()
        yield from self.batches[worker::workers]


def eval_batches(
    prompt_set: PromptSet, batch_size: int, *, rank: int = 0, world_size: int = 1, pad: bool = True
) -> list[PromptBatch]:
    """This rank's share of fixed evaluation prompts, in order."""
    prompts, metadata = prompt_set
    chunks = [
        PromptBatch(prompts[s : s + batch_size], c, [dict(m) for m in metadata[s : s + batch_size]])
        for c, s in enumerate(range(0, len(prompts), batch_size))
    ]
    if not chunks:
        return []
    if not pad:
        return chunks[rank::world_size]
    per_rank = math.ceil(len(chunks) / world_size)
    return [chunks[(rank + i * world_size) % len(chunks)] for i in range(per_rank)]
