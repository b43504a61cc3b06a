"""Registering an attention implementation with transformers, once, at the point of use."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


def register_attention(name: str, forward: Callable, sdpa_masks: bool = True) -> None:
    """Register ``forward`` under ``name`` in transformers' ``AttentionInterface`` (idempotent).

    Parameters
    ----------
    name
        The implementation name for ``model.set_attn_implementation(name)``.
    forward
        ``forward(module, query, key, value, attention_mask, scaling=..., dropout=..., **kwargs)``.
    sdpa_masks
        Also register SDPA's mask builder under ``name``, so the model builds the masks SDPA expects.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if AttentionInterface._global_mapping.get(name) is not forward:
        AttentionInterface.register(name, forward)
    if sdpa_masks and name not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionMaskInterface.register(name, sdpa_mask)


@contextlib.contextmanager
def attention_switched(model: Any, name: str) -> Iterator[Any]:
    """Switch ``model`` to the registered implementation ``name`` for the block, then restore the previous one."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield model
    finally:
        if previous:
            model.set_attn_implementation(previous)
