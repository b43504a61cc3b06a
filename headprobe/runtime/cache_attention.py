"""The ``headprobe`` attention implementation and the switch that installs it on a model.

transformers passes whatever ``Cache.update`` returned as ``key``/``value``; with a
:class:`~headprobe.runtime.cache.CompressedCache` that is the layer's
:class:`~headprobe.runtime.cache.PendingKV` handle, and this function runs the cache's policy for the
layer. No mask function is registered: the cache knows the positions and padding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from ..attention.registry import attention_switched, register_attention
from ..errors import HeadprobeError
from .cache import PendingKV
from .shape import CacheShape

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ATTENTION_NAME = "headprobe"
SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")


def headprobe_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: Any, value: Any,
                                attention_mask: torch.Tensor | None, scaling: float | None = None,  # noqa: ARG001 (transformers' attention-function signature)
                                dropout: float = 0.0, sliding_window: int | None = None,  # noqa: ARG001 (transformers' attention-function signature)
                                softcap: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention over a :class:`CompressedCache` layer.

    Parameters
    ----------
    query
        ``[batch, q_heads, n, head_dim]`` post-RoPE.
    key, value
        The :class:`~headprobe.runtime.cache.PendingKV` returned by ``CompressedCache.update`` (both).

    Returns
    -------
    tuple
        ``([batch, n, q_heads, head_dim], None)`` like transformers' attention functions.
    """
    if not isinstance(key, PendingKV) or value is not key:
        raise HeadprobeError("the headprobe attention needs a CompressedCache passed as the model's cache "
                             "(cache=, or past_key_values= before transformers 5.24) and the keys and values its "
                             "update returned (use headprobe.generate_compressed)")
    layer = key.layer
    index = getattr(module, "layer_idx", layer.layer_idx)
    if index != layer.layer_idx:
        raise HeadprobeError(f"the attention of layer {index} received the keys of layer {layer.layer_idx}; the "
                             "compressed cache needs each layer to update and attend its own cache layer")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    out = key.cache.attend(layer, query, float(scaling), sliding_window, softcap, kwargs.get("position_ids"))
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register the attention implementation with transformers (idempotent); no mask builder: the
    ragged cache applies causality and windows itself."""
    register_attention(ATTENTION_NAME, headprobe_attention_forward, sdpa_masks=False)


def check_supported(hf_model: PreTrainedModel) -> CacheShape:
    """Refuse, in one line, a model the compressed cache cannot run; returns its cache shape.

    :func:`headprobe_attention` runs it on entry, before anything else the block does.

    Supported: decoder-only models whose attention goes through transformers' ``AttentionInterface``
    (``_supports_attention_backend``) with full-attention and sliding-window layers only.
    """
    config = hf_model.config
    shape = CacheShape.from_config(config)
    for i, kind in enumerate(shape.layer_types):
        if kind not in SUPPORTED_LAYER_TYPES:
            raise HeadprobeError(f"layer {i} has attention type {kind!r}; the compressed cache supports "
                                 f"{', '.join(SUPPORTED_LAYER_TYPES)}")
    name = type(hf_model).__name__
    if getattr(config, "is_encoder_decoder", False):
        raise HeadprobeError(f"{name} is an encoder-decoder model; the compressed cache serves decoder-only models")
    if not getattr(hf_model, "_supports_attention_backend", False):
        raise HeadprobeError(f"{name} does not route its attention through transformers' AttentionInterface; the "
                             "compressed cache cannot run it")
    return shape


@contextlib.contextmanager
def headprobe_attention(model: PreTrainedModel) -> Iterator[Any]:
    """Switch ``model`` to the headprobe attention for the duration of the block, then restore it.

    A model the compressed cache cannot run is refused first (:func:`check_supported`)."""
    register()
    check_supported(model)
    with attention_switched(model, ATTENTION_NAME):
        yield model
