"""Record the attention rows of chosen query positions during a normal model forward.

:class:`RowRecorder` registers an attention implementation (``"headprobe_rows"``) with transformers'
:class:`~transformers.AttentionInterface`. It computes every layer's output with the stock SDPA kernel
(no eager attention on the whole forward) and, for the requested query positions only, the post-RoPE
softmax rows over all keys, which it hands to a callback layer by layer. Nothing is patched at import
time: the implementation is registered and switched on inside the ``with`` block and switched back after
(:class:`~headprobe.attention.registry.AttentionSwitch`).

Its mask builder is SDPA's, except for a forward whose request promises ``prefix_visible``: there the
global-attention layers run :func:`~headprobe.attention.prefix_split.prefix_split_attention`, which needs
no mask, so none is built (a ``[batch, 1, block, prefix + block]`` mask is the one tensor of such a
forward that grows with the square of the prompt). A layer that cannot split after all (soft-capped
logits, attention sinks) builds the mask itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .prefix_split import prefix_split_attention, prefix_split_supported
from .registry import AttentionSwitch
from .rows import attention_rows

IMPLEMENTATION = "headprobe_rows"

#: ``callback(layer_idx, rows, key_positions)`` with ``rows [batch, query_heads, n_rows, keys]`` and
#: ``key_positions [keys]`` (absolute positions of the keys the layer attended to).
RowCallback = Callable[[int, torch.Tensor, torch.Tensor], None]


@dataclass
class RowRequest:
    """Which rows to capture in the next forward.

    Attributes
    ----------
    positions
        ``[batch, n_rows]`` absolute positions of the query rows (all inside the current forward).
    block_start
        Absolute position of the first token of the current forward (the cache length before it).
    callback
        Receives each layer's rows.
    key_mask
        ``[batch, keys_total]`` boolean, ``False`` for padding keys (right padding in batched trials).
    query_index
        ``[batch, n_rows]`` indices of the rows inside the current forward, when they are not
        ``positions - block_start`` (a forward that continues after padding).
    key_positions
        ``[batch, keys_total]`` absolute positions of all cache entries after this forward, when they are
        not ``0 .. keys_total-1``; the callback then receives ``[batch, keys]`` key positions.
    prefix_visible
        The caller's promise that every query of this forward sees all ``block_start`` cached keys and the
        forward's own keys causally (no padding except at the right end). Layers that allow it then run
        :func:`~headprobe.attention.prefix_split.prefix_split_attention` instead of masked SDPA: the same
        output for less work.
    """

    positions: torch.Tensor
    block_start: int
    callback: RowCallback
    key_mask: torch.Tensor | None = None
    query_index: torch.Tensor | None = None
    key_positions: torch.Tensor | None = None
    prefix_visible: bool = False


def _rows_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    # transformers loads here, on first use: importing this module costs torch only
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    recorder = RowRecorder.active()
    request = recorder.request if recorder is not None else None
    split = (request is not None and request.prefix_visible and query.shape[2] > 1
             and key.shape[2] == request.block_start + query.shape[2])
    if (split and not kwargs.get("s_aux")
            and prefix_split_supported(query, kwargs.get("sliding_window"), kwargs.get("softcap"), dropout)):
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = (prefix_split_attention(query, key, value, request.block_start, scale), None)
    else:
        if split and attention_mask is None:         # the mask builder left it out for the split
            attention_mask = recorder._block_mask(query.shape[0], query.shape[2], key.shape[2], query.device)
        out = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                     **kwargs)
    if request is not None:
        recorder._capture(module, query, key, scaling, kwargs.get("sliding_window"), kwargs.get("softcap"))
    return out


def _rows_mask(*args, **kwargs):
    """SDPA's mask builder, except that it builds nothing for the global-attention mask of a forward whose
    request promises ``prefix_visible`` (those layers split their attention and need no mask)."""
    # transformers loads here, on first use: importing this module costs torch only
    from transformers.masking_utils import sdpa_mask

    recorder = RowRecorder.active()
    request = recorder.request if recorder is not None else None
    if (request is not None and request.prefix_visible and kwargs.get("local_size") is None
            and not kwargs.get("use_vmap")):
        q_length, q_offset = _query_span(kwargs)
        if q_length > 1 and q_offset == request.block_start:
            return None
    return sdpa_mask(*args, **kwargs)


def _query_span(mask_kwargs: dict) -> tuple[int, int | None]:
    """``(q_length, q_offset)`` of a mask builder call: named so since transformers' mask rework, derived
    from the ``cache_position`` tensor that earlier 5.x releases pass instead."""
    if "q_length" in mask_kwargs:
        return int(mask_kwargs["q_length"]), mask_kwargs.get("q_offset", 0)
    positions = mask_kwargs.get("cache_position")
    if positions is None or positions.numel() == 0:
        return 0, None
    return int(positions.shape[0]), int(positions[0])


class RowRecorder(AttentionSwitch, implementation=IMPLEMENTATION, sdpa_masks=False):
    """Context manager that switches a model to the row-recording attention.

    Examples
    --------
    >>> with RowRecorder(model) as rec:                          # doctest: +SKIP
    ...     rec.request = RowRequest(torch.tensor([[n - 1]]), 0, lambda l, rows, kp: store.append(rows))
    ...     model(input_ids)
    """

    attention = staticmethod(_rows_attention)

    def __init__(self, model) -> None:
        super().__init__(model)
        self._request: RowRequest | None = None
        self._mask: tuple[tuple, torch.Tensor] | None = None

    @property
    def request(self) -> RowRequest | None:
        """What the next forward records (set before each forward)."""
        return self._request

    @request.setter
    def request(self, request: RowRequest | None) -> None:
        self._request = request
        self._mask = None

    def __enter__(self) -> Any:
        # transformers loads here, on first use: importing this module costs torch only
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

        if ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(IMPLEMENTATION) is not _rows_mask:
            AttentionMaskInterface.register(IMPLEMENTATION, _rows_mask)
        return super().__enter__()

    def _block_mask(self, batch: int, q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
        """``[batch, 1, q_len, k_len]`` bool mask of a ``prefix_visible`` forward: the keys up to each query's
        position that ``key_mask`` keeps (built once per forward, for layers that cannot split)."""
        request = self.request
        shape = (batch, q_len, k_len, str(device))
        if self._mask is None or self._mask[0] != shape:
            query_pos = request.block_start + torch.arange(q_len, device=device)
            visible = torch.arange(k_len, device=device)[None, :] <= query_pos[:, None]
            visible = visible[None, None].expand(batch, 1, q_len, k_len)
            if request.key_mask is not None:
                visible = visible & request.key_mask[:, None, None, :k_len].to(device=device, dtype=torch.bool)
            self._mask = (shape, visible)
        return self._mask[1]

    def _capture(self, module, query, key, scaling, sliding_window, softcap) -> None:
        request = self.request
        batch, q_heads, q_len, head_dim = query.shape
        k_len = key.shape[2]
        block_end = request.block_start + q_len
        if request.query_index is not None:
            local = request.query_index.to(query.device)
        else:
            local = request.positions.to(query.device) - request.block_start
        if local.min() < 0 or local.max() >= q_len:
            raise ValueError("requested attention rows lie outside the current forward")
        index = local[:, None, :, None].expand(batch, q_heads, local.shape[1], head_dim)
        q_sel = torch.gather(query, 2, index)
        if request.key_positions is not None:
            key_positions = request.key_positions[:, block_end - k_len:block_end].to(key.device)
        else:
            key_positions = torch.arange(block_end - k_len, block_end, device=key.device)
        key_mask = None
        if request.key_mask is not None:
            key_mask = request.key_mask[:, block_end - k_len:block_end].to(key.device)
        scale = scaling if scaling is not None else head_dim ** -0.5
        rows = attention_rows(q_sel, key, request.positions.to(key.device), scale, key_positions=key_positions,
                              sliding_window=sliding_window, softcap=softcap, key_mask=key_mask)
        request.callback(int(module.layer_idx), rows, key_positions)
