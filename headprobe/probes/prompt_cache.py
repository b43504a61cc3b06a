"""KV caches of probe prompts: a haystack prefix computed once, copied for a batch, cut back after a
continuation; haystack prompts and their KV kept across calls (:class:`HaystackCaches`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from ..haystack.context import build_context
from ..haystack.corpus import Haystack
from ..models.cache_argument import with_cache

if TYPE_CHECKING:
    from ..models.loading import LoadedModel


@torch.no_grad()
def prefix_cache(model, prefix_ids: list[int], device: torch.device):
    """The KV of ``prefix_ids`` (one sequence), every layer kept in full.

    Sliding-window layers keep all positions too (a plain :class:`~transformers.DynamicCache`), so any
    shorter prefix of it can be reused. An empty prefix gives an empty cache.
    """
    # transformers loads here, on first use: importing this module costs torch only
    from transformers import DynamicCache

    cache = DynamicCache()
    if prefix_ids:
        model(input_ids=torch.tensor([prefix_ids], device=device), use_cache=True, logits_to_keep=1,
              **with_cache(model, cache))
    return cache


def batch_cache(base, prefix: int, batch: int):
    """A new cache holding the first ``prefix`` positions of ``base`` once per sequence of a batch.

    Parameters
    ----------
    base
        A one-sequence :class:`~transformers.DynamicCache`, ``[1, kv_heads, positions, head_dim]`` per layer.
    prefix
        Positions to copy (``0`` gives an empty cache).
    batch
        Sequences of the new cache: each layer holds ``[batch, kv_heads, prefix, head_dim]``.
    """
    # transformers loads here, on first use: importing this module costs torch only
    from transformers import DynamicCache

    cache = DynamicCache()
    if prefix > 0:
        for layer_idx, layer in enumerate(base.layers):
            cache.update(layer.keys[:, :, :prefix].expand(batch, -1, -1, -1).contiguous(),
                         layer.values[:, :, :prefix].expand(batch, -1, -1, -1).contiguous(), layer_idx)
    return cache


def crop_cache(cache, length: int) -> None:
    """Cut a :class:`~transformers.DynamicCache` back to its first ``length`` positions."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


class HaystackCaches:
    """The haystack prompt and its KV per (length, seed), computed on first use and kept.

    A run that visits lengths in turn (early stopping spreads trials over lengths) computes each haystack
    forward once; ``keep`` bounds how many are held (the least recently used goes first).
    """

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._entries: dict[tuple[int, str], tuple[list[int], Any]] = {}

    def get(self, lm: LoadedModel, haystack: Haystack, length: int,
            chat_template: bool) -> tuple[list[int], Any, float]:
        """``(base_ids, cache, seconds)``: ``seconds`` is the forward's time the first time, then 0."""
        key = (length, haystack.fingerprint)
        if key in self._entries:
            self._entries[key] = self._entries.pop(key)         # the most recently used goes last
            return (*self._entries[key], 0.0)
        start = time.perf_counter()
        base = build_context(lm.tokenizer, haystack, None, length, 0.0, chat_template, lm.identity.max_context)
        cache = prefix_cache(lm.model, base.input_ids, lm.device)
        seconds = time.perf_counter() - start
        while len(self._entries) >= self.keep:
            self._entries.pop(next(iter(self._entries)))
        self._entries[key] = (base.input_ids, cache)
        return base.input_ids, cache, seconds
