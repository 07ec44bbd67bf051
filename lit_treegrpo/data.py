"""Prompts for RL post-training: files and built-in sets, a train / validation split, and a
stateless, data-parallel prompt stream.

Sources (``--data.prompts PATH_OR_NAME``):

- ``.txt``: one prompt per line; blank lines skipped, surrounding whitespace stripped.
- ``.jsonl``: one JSON object per line with a ``prompt`` string; its other fields become the
  prompt's ``metadata`` dict.
- ``.csv``: a header row with a ``prompt`` column; the other columns become ``metadata``.
- a built-in set shipped in ``lit_treegrpo/prompts/`` (:func:`available_prompt_sets`):
  ``hpdv2_style`` (300 prompts in the HPDv2 style: photo, anime, concept art, painting),
  ``animals`` (100 simple animal prompts), ``shapes`` (the 24 "a {colour} {shape}" prompts of the
  Shapes world) and ``shapes_world`` (its whole grammar, 360 prompts with size and position words:
  :func:`lit_treegrpo.shapes.world.all_prompts`).

The training stream is infinite and has no state: there is a global sequence of prompt indices
whose position ``j`` holds ``perm(seed, epoch=j // N)[j % N]``, a fresh seeded permutation of the
``N`` training prompts on every pass (so each pass shows every prompt once), and training batch
``k`` on data-parallel rank ``r`` of ``W`` takes positions ``[k·G + r·B, k·G + (r+1)·B)`` with
``B = batch_size`` prompts per rank and ``G = B·W`` (or, with ``global_batch_size`` given,
``G = global_batch_size`` and ``B = G / W``). Batch ``k`` is therefore a pure function of
``(seed, k, rank, W, prompts)``: ranks see different prompts, runs repeat exactly, and a resumed run
continues exactly by starting at the right ``k`` (:attr:`PromptDataModule.start_index`). The
permutation is our own Fisher-Yates shuffle over a SplitMix64 generator, so it does not change
with the torch or numpy version either.

Long prompts are passed through untouched: truncating to the text encoder's limit is the model
adapter's business (it warns).
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import io
import json
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .errors import explain_os_error

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "PromptBatch",
    "PromptChunks",
    "PromptDataModule",
    "PromptSet",
    "PromptStream",
    "available_prompt_sets",
    "collate",
    "load_prompts",
    "prompt_permutation",
    "resolve_batch_size",
]

SUFFIXES = {
    ".txt": "one prompt per line",
    ".jsonl": "one JSON object with a 'prompt' field per line",
    ".csv": "a header row with a 'prompt' column",
}
DEFAULT_BATCH_SIZE = 4  # prompts per rank when neither batch size is given
_BUILTIN_PACKAGE = "lit_treegrpo"
_BUILTIN_FOLDER = "prompts"


class PromptBatch(NamedTuple):
    """The prompts of one step on one rank; Lightning moves it to a device unchanged (no tensors).

    ``len(batch)`` is the tuple's length (3): count prompts with ``len(batch.prompts)``.
    """

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


class PromptSet(NamedTuple):
    """Prompts loaded from one source, in file order, with their metadata."""

    prompts: list[str]
    metadata: list[dict[str, Any]]

    def fingerprint(self) -> str:
        """sha256 of the prompts and metadata; changes when any prompt, field or the order does."""
        payload = json.dumps([self.prompts, self.metadata], sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def available_prompt_sets() -> list[str]:
    """Names of the built-in prompt sets, usable as ``--data.prompts NAME``."""
    folder = resources.files(_BUILTIN_PACKAGE).joinpath(_BUILTIN_FOLDER)
    return sorted(entry.name[: -len(".txt")] for entry in folder.iterdir() if entry.name.endswith(".txt"))


def load_prompts(source: str, *, option: str = "--data.prompts") -> PromptSet:
    """Load prompts from a ``.txt`` / ``.jsonl`` / ``.csv`` file or a built-in set name.

    Every problem raises ``FileNotFoundError`` or ``ValueError`` with a one-line message that starts
    with ``option`` and says how to fix it. Duplicate prompts are kept, with one warning.
    """
    path = Path(source).expanduser()
    if path.is_file():
        name, suffix = str(path), path.suffix.lower()
        if suffix not in SUFFIXES:
            supported = "; ".join(f"{ext} ({what})" for ext, what in SUFFIXES.items())
            raise ValueError(
                f"{option}: {name} has the unsupported extension '{path.suffix}'; "
                f"use one of {supported}"
            )
        try:
            data = path.read_bytes()
        except OSError as err:  # permissions, an I/O error, a file that vanished
            raise ValueError(f"{option}: cannot read {name}: {explain_os_error(err)}") from err
    elif source in available_prompt_sets():
        name, suffix = f"built-in set '{source}'", ".txt"
        data = resources.files(_BUILTIN_PACKAGE).joinpath(_BUILTIN_FOLDER, f"{source}.txt").read_bytes()
    else:
        builtins = available_prompt_sets()
        close = difflib.get_close_matches(source, builtins, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        what = "a directory, " if path.is_dir() else ""
        raise FileNotFoundError(
            f"{option}: '{source}' is {what}neither a file nor a built-in prompt set{hint}; pass the path "
            f"of a {'/'.join(SUFFIXES)} file or one of the built-in sets: {', '.join(builtins)}"
        )
    text = _decode(data, name, option)
    parse = {".txt": _parse_txt, ".jsonl": _parse_jsonl, ".csv": _parse_csv}[suffix]
    prompt_set = parse(text, name, option)
    if not prompt_set.prompts:
        raise ValueError(f"{option}: {name} has a header but no prompt rows; add one row per prompt")
    counts = Counter(prompt_set.prompts)
    repeated = {prompt: n for prompt, n in counts.items() if n > 1}
    if repeated:
        example, n = next(iter(repeated.items()))
        rank_zero_warn(
            f"{option}: {len(repeated)} prompt(s) of {name} occur more than once (e.g. {example!r} x{n}); "
            "duplicates are kept, so such a prompt is trained on once per copy in every pass"
        )
    return prompt_set


def _decode(data: bytes, name: str, option: str) -> str:
    if not data:
        raise ValueError(f"{option}: {name} is empty; put at least one prompt in it")
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark, as some editors write
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ValueError(
            f"{option}: {name} is not UTF-8 text: line {line} has the byte 0x{data[err.start]:02x}; "
            "re-save the file as UTF-8"
        ) from None
    if not text.strip():
        raise ValueError(f"{option}: {name} contains only blank lines; put at least one prompt in it")
    return text


def _lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its end) for every line that is not blank."""
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield number, line


def _parse_txt(text: str, name: str, option: str) -> PromptSet:
    prompts = [line.strip() for _, line in _lines(text)]
    return PromptSet(prompts, [{} for _ in prompts])


def _parse_jsonl(text: str, name: str, option: str) -> PromptSet:
    prompts: list[str] = []
    metadata: list[dict[str, Any]] = []
    for number, line in _lines(text):
        where = f"{option}: {name} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{where} is not valid JSON ({err.msg}); each line must be one object like "
                '{"prompt": "a photo of a cat"}'
            ) from None
        except RecursionError:
            raise ValueError(
                f"{where} nests arrays or objects deeper than the JSON parser can follow; each line "
                'must be one flat object like {"prompt": "a photo of a cat"}'
            ) from None
        if not isinstance(record, dict):
            kind = type(record).__name__
            raise ValueError(f"{where} is a JSON {kind}, not an object with a 'prompt' field")
        if "prompt" not in record:
            fields = ", ".join(repr(key) for key in record) or "none"
            raise ValueError(f"{where} has no 'prompt' field (fields: {fields}); add one to every line")
        prompt = record.pop("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{where}: 'prompt' must be a non-empty string, got {prompt!r}")
        prompts.append(prompt.strip())
        metadata.append(record)
    return PromptSet(prompts, metadata)


def _parse_csv(text: str, name: str, option: str) -> PromptSet:
    reader = csv.reader(io.StringIO(text, newline=""))
    header = [column.strip() for column in next(row for row in reader if any(cell.strip() for cell in row))]
    if "prompt" not in header:
        raise ValueError(
            f"{option}: {name} has no 'prompt' column (columns: {', '.join(map(repr, header))}); "
            "name the column of prompts 'prompt' in the header row"
        )
    column = header.index("prompt")
    prompts: list[str] = []
    metadata: list[dict[str, Any]] = []
    for row in reader:
        if not any(cell.strip() for cell in row):
            continue
        where = f"{option}: {name} line {reader.line_num}"
        if len(row) != len(header):
            raise ValueError(
                f"{where} has {len(row)} fields but the header has {len(header)}; quote fields with commas"
            )
        if not row[column].strip():
            raise ValueError(f"{where} has an empty prompt")
        prompts.append(row[column].strip())
        metadata.append({key: value for i, (key, value) in enumerate(zip(header, row)) if i != column})
    return PromptSet(prompts, metadata)


# ---------------------------------------------------------------------------------------------
# Stream
# ---------------------------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1


def prompt_permutation(n: int, *key: int | str) -> list[int]:
    """A permutation of ``range(n)`` that depends only on ``key`` (e.g. ``("stream", seed, epoch)``).

    Fisher-Yates driven by SplitMix64 (Steele, Lea & Flood 2014) seeded from a blake2b hash of the
    key: stable across platforms and library versions, so checkpoints resume exactly anywhere.
    Index draws use the multiply-shift map ``(z · (i+1)) >> 64`` (bias below ``n / 2**64``).
    """
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
    """The infinite training stream of one data-parallel rank (see the module docstring).

    Iterating yields :class:`PromptBatch` ``start_index, start_index + 1, ...`` forever. Under a
    multi-worker ``DataLoader`` worker ``w`` of ``n`` yields batches ``start_index + w + i·n``, which
    the loader interleaves back into order.
    """

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
    """This rank's share of fixed evaluation prompts, in order.

    The prompts are cut into chunks of ``batch_size`` (the last may be shorter) numbered
    ``c = 0 .. C-1``, independently of the world size; rank ``r`` takes chunks ``r, r+W, ...``.
    With ``pad`` (validation / test) every rank gets ``ceil(C / W)`` chunks, ranks short of one
    repeating chunk ``(r + i·W) mod C`` like ``DistributedSampler`` pads: equal counts keep
    collective ops (FSDP forwards, ``sync_dist``) in step; a repeat keeps its chunk's ``index``.
    Without ``pad`` (predict) each prompt appears exactly once over all ranks.
    """
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


# ---------------------------------------------------------------------------------------------
# DataModule
# ---------------------------------------------------------------------------------------------


def resolve_batch_size(batch_size: int | None, global_batch_size: int | None, world_size: int) -> int:
    """Prompts per data-parallel rank from ``--data.batch_size`` / ``--data.global_batch_size``.

    Neither: :data:`DEFAULT_BATCH_SIZE`. ``batch_size`` alone: itself. ``global_batch_size``:
    ``global_batch_size / world_size``, refused when the world size does not divide it, or when a
    ``batch_size`` given as well disagrees.
    """
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


class PromptDataModule(LightningDataModule):
    """Prompts for training (an infinite, seeded, data-parallel stream) and validation (fixed).

    Prompts are loaded and checked when the module is built, so a bad file fails before any model
    loads. The training stream starts at :attr:`start_index`, which the training module sets from
    its resumed step counter before the dataloader is built; :meth:`state_dict` records which
    prompts and split a checkpoint was trained on, and resuming on others is an error.
    """

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
            prompts: Training prompts: a .txt file (one prompt per line), a .jsonl file (a "prompt"
                field per line, other fields kept as metadata), a .csv file (a "prompt" column,
                other columns kept as metadata), or the name of a built-in set: hpdv2_style,
                animals, shapes, shapes_world.
            batch_size: Prompts per rank per training step (the global batch is batch_size x the
                number of data-parallel ranks). Default 4 when global_batch_size is not given either.
            global_batch_size: Prompts per training step over all data-parallel ranks, as the papers
                quote it ("batch 32"); each rank then takes global_batch_size / (devices x
                num_nodes), and a world size that does not divide it is refused. Give it or
                batch_size (both must agree).
            val_prompts: Validation prompts (file or built-in set, as for prompts). If not given,
                val_fraction of the distinct training prompts is held out (chosen by seed) and
                never trained on.
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
        self.all_set = load_prompts(prompts, option="--data.prompts")
        self.train_set, self.val_set = self._split()
        # before anything draws a batch (drawing 10^8 prompts alone takes hours); the world size,
        # and so how batch_size and global_batch_size relate, is only known in setup
        self._check_batch_fits(global_batch_size or batch_size or DEFAULT_BATCH_SIZE, 1)

    def _split(self) -> tuple[PromptSet, PromptSet]:
        prompts, metadata = self.all_set
        if self.val_source is not None:
            val = load_prompts(self.val_source, option="--data.val_prompts")
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
        """(rank, world size) of data parallelism.

        From the attached trainer's strategy first (with 2-D parallelism this is the data-parallel
        dimension, so tensor-parallel peers get the same prompts), else from an initialised
        ``torch.distributed``, else ``(0, 1)``.
        """
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
