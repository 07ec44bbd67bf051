"""Each distinct prompt encoded once: :class:`PromptCache` keeps the text encoders' output rows per prompt (LRU,
``size`` prompts), can pre-encode a fit's prompts and then move the text encoders off the accelerator (FLUX.1's T5
and Wan's UMT5 are 4.7-5.7B parameters)."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

Cond = dict[str, Tensor]
#: prompts per text-encoder call (the last padded by repeating its last prompt): a matrix product's
#: kernel is chosen by its shape, so a row's last bit can depend on how many rows were encoded with
#: it (measured: the tiny CLIP's pooled output, 1 or 3 prompts vs 8)
ENCODE_BATCH = 8


@dataclass(frozen=True)
class PromptCacheSettings:
    """``--model.prompt_cache``: whether and where prompt embeddings are kept."""

    size: int = 0
    """Prompts whose embeddings are kept (least recently used dropped first); 0: no cache, every
    call encodes (the default)."""
    pre_encode: bool = False
    """At the start of a fit, encode every training and validation prompt of the datamodule (needs
    a ``size`` that holds them all)."""
    offload_encoders: bool = False
    """After ``pre_encode``, move the text encoders to the CPU; a prompt not in the cache later (a
    callback's own prompt) brings them back for that call, with a warning the first time."""

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError(f"prompt_cache.size must be >= 0 (0: no cache), got {self.size}")
        if self.pre_encode and self.size == 0:
            raise ValueError("prompt_cache.pre_encode needs a cache: set prompt_cache.size to the number of prompts")
        if self.offload_encoders and not self.pre_encode:
            raise ValueError("prompt_cache.offload_encoders needs prompt_cache.pre_encode true (encode first)")


def text_encoders(adapter: nn.Module) -> list[tuple[str, nn.Module]]:
    """The adapter's text encoders: its module attributes named ``text_encoder*``."""
    return [(name, m) for name, m in adapter.named_children() if name.startswith("text_encoder") and m is not None]


class PromptCache:
    """An LRU of per-prompt embedding rows in front of ``adapter.encode_prompts``."""

    def __init__(self, settings: PromptCacheSettings) -> None:
        self.settings = settings
        self._rows: OrderedDict[str, Cond] = OrderedDict()  # prompt -> {name: [1, ...]}
        self._key: tuple[Any, ...] | None = None
        self.hits = 0
        self.misses = 0
        self._offloaded: list[tuple[str, nn.Module]] = []
        self._warned_miss = False

    def __len__(self) -> int:
        return len(self._rows)

    def encode(self, adapter: Any, prompts: list[str]) -> Cond:
        """The conditioning of ``prompts`` [P rows]: from the cache where it holds them; the others
        encoded in calls of :data:`ENCODE_BATCH` prompts."""
        if self.settings.size == 0:
            return self._encode(adapter, prompts)
        key = adapter.encoding_key()
        if key != self._key:
            self._rows.clear()
            self._key = key
        missing = list(dict.fromkeys(p for p in prompts if p not in self._rows))  # [M] distinct, in order
        fresh: dict[str, Cond] = {}
        if missing:
            cond = self._encode(adapter, missing)
            for i, prompt in enumerate(missing):
                fresh[prompt] = {name: self._keep(value[i : i + 1]) for name, value in cond.items()}
        self.hits += len(prompts) - len(missing)  # rows served without encoding them again
        self.misses += len(missing)
        rows = [fresh.get(p) or self._rows[p] for p in prompts]
        device = adapter.device
        out = {name: value.to(device) for name, value in adapter.join_conds(rows).items()}  # [P, ...]
        for prompt in prompts:  # most recently used last; the fresh rows enter now
            if prompt in fresh:
                self._rows[prompt] = fresh[prompt]
            self._rows.move_to_end(prompt)
        while len(self._rows) > self.settings.size:
            self._rows.popitem(last=False)
        return out

    def pre_encode(self, adapter: Any, prompts: Iterable[str], batch_size: int = 64) -> None:
        """Encode every one of ``prompts`` into the cache (in batches), then offload the text
        encoders when the settings say so."""
        distinct = list(dict.fromkeys(prompts))
        if len(distinct) > self.settings.size:
            raise ValueError(
                f"prompt_cache.pre_encode: {len(distinct)} distinct prompts do not fit prompt_cache.size "
                f"{self.settings.size}; raise it to at least {len(distinct)}"
            )
        for start in range(0, len(distinct), batch_size):
            self.encode(adapter, distinct[start : start + batch_size])
        if self.settings.offload_encoders:
            self._offloaded = text_encoders(adapter)
            for _, module in self._offloaded:
                module.to("cpu")

    def pre_encode_data(self, adapter: Any, datamodule: Any) -> None:
        """:meth:`pre_encode` every training and validation prompt of ``datamodule`` (a ``PromptSource``)."""
        prompts = [*datamodule.train_set.prompts, *datamodule.val_set.prompts]
        if not prompts:
            raise ValueError("prompt_cache.pre_encode: the datamodule has no prompts to encode (train_set / val_set)")
        self.pre_encode(adapter, prompts)

    def _encode(self, adapter: Any, prompts: list[str]) -> Cond:
        """``adapter.encode_prompts`` in calls of exactly :data:`ENCODE_BATCH` prompts, cut back to ``prompts``."""
        n = ENCODE_BATCH
        parts = []
        for start in range(0, len(prompts), n):
            chunk = prompts[start : start + n]
            padded = chunk + [chunk[-1]] * (n - len(chunk))
            cond = self._encode_call(adapter, padded)
            parts.append({name: value[: len(chunk)] for name, value in cond.items()})
        if len(parts) == 1:
            return parts[0]
        return adapter.join_conds(parts)

    def _encode_call(self, adapter: Any, prompts: list[str]) -> Cond:
        if not self._offloaded:
            return adapter.encode_prompts(prompts)
        if not self._warned_miss:
            self._warned_miss = True
            warnings.warn(
                f"prompt_cache: {prompts[0]!r} was not pre-encoded; the text encoders come back to the device "
                "for each such call (add the prompt to the data, or raise prompt_cache.size)",
                UserWarning,
                stacklevel=3,
            )
        for _, module in self._offloaded:
            module.to(adapter.device)
        try:
            return adapter.encode_prompts(prompts)
        finally:
            for _, module in self._offloaded:
                module.to("cpu")

    def _keep(self, row: Tensor) -> Tensor:
        return row.detach().clone()
