"""KV caches of probe prompts: a haystack prefix computed once, copied for a batch, cut back after a continuation."""

from __future__ import annotations

import torch


@torch.no_grad()
def prefix_cache(model, prefix_ids: list[int], device: torch.device):
    """The KV of ``prefix_ids`` (one sequence), every layer kept in full.

    Sliding-window layers keep all positions too (a plain :class:`~transformers.DynamicCache`), so any
    shorter prefix of it can be reused. An empty prefix gives an empty cache.
    """
    from transformers import DynamicCache

    cache = DynamicCache()
    if prefix_ids:
        model(input_ids=torch.tensor([prefix_ids], device=device), past_key_values=cache, use_cache=True,
              logits_to_keep=1)
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
