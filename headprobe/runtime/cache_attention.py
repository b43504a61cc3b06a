"""The ``headprobe`` attention implementation and the switch that installs it on a model.

transformers passes whatever ``Cache.update`` returned as ``key``/``value``; with a
:class:`~headprobe.runtime.cache.CompressedCache` that is the layer slot, and this function runs the
cache's policy for the layer. No mask function is registered: the cache knows the positions and padding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import HeadprobeError
from ..models.identity import text_config

ATTENTION_NAME = "headprobe"
SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")


def headprobe_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: Any, value: Any,
                                attention_mask: torch.Tensor | None, scaling: float | None = None,
                                dropout: float = 0.0, sliding_window: int | None = None,
                                softcap: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention over a :class:`CompressedCache` layer.

    Parameters
    ----------
    query
        ``[batch, q_heads, n, head_dim]`` post-RoPE.
    key, value
        The :class:`~headprobe.runtime.cache.LayerSlot` returned by ``CompressedCache.update``.

    Returns
    -------
    tuple
        ``([batch, n, q_heads, head_dim], None)`` like transformers' attention functions.
    """
    from .cache import LayerSlot

    if not isinstance(key, LayerSlot):
        raise HeadprobeError("the headprobe attention needs past_key_values=CompressedCache(...) "
                             "(use headprobe.generate_compressed)")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    out = key.cache.attend(key, query, float(scaling), sliding_window, softcap, kwargs.get("position_ids"))
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register the attention implementation with transformers (idempotent); no mask builder: the
    ragged cache applies causality and windows itself."""
    from ..attention.registry import register_attention

    register_attention(ATTENTION_NAME, headprobe_attention_forward, sdpa_masks=False)


def check_layer_types(config: Any) -> None:
    """Refuse models with attention types the runtime does not handle, naming the layer."""
    cfg = text_config(config)
    for i, kind in enumerate(getattr(cfg, "layer_types", None) or []):
        if kind not in SUPPORTED_LAYER_TYPES:
            raise HeadprobeError(f"layer {i} has attention type {kind!r}; the compressed cache supports "
                                 f"{', '.join(SUPPORTED_LAYER_TYPES)}")


@contextlib.contextmanager
def headprobe_attention(model: Any) -> Iterator[Any]:
    """Switch ``model`` to the headprobe attention for the duration of the block, then restore it."""
    from ..attention.registry import attention_switched

    register()
    check_layer_types(model.config)
    with attention_switched(model, ATTENTION_NAME):
        yield model
