"""Attention of a chosen set of queries over a whole key buffer, for selective recompute.

When only some tokens of a prompt are recomputed in a layer (the rest keep cached keys and values), the
queries are a scattered subset of positions and the keys are the layer's full buffer. Teacher-forced
responses can ride along as *branches*: tokens after the prompt that see the prompt and the earlier
tokens of their own branch only. :class:`KeyLayout` holds who sees what (positions and branches of the
buffer's keys and of the queries); :class:`SelectiveAttention` registers an attention implementation
that reads the layout of the running layer and

- runs the queries in blocks, each against the keys it can see (keys after a block's last position are
  cut off, and before its window on sliding layers), with the query heads of a KV head stacked along the
  query axis so the key buffer is never repeated per query head;
- runs a contiguous tail of prompt queries (every position from ``tail_start`` to the prompt's end) on a
  global layer on the CPU as :func:`~headprobe.attention.prefix_split.prefix_split_attention` (no mask,
  causal blocks skipped);
- hands the softmax rows of the last ``rows`` queries over the whole buffer to a callback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import HeadprobeError
from .prefix_split import prefix_split_attention, prefix_split_supported
from .registry import AttentionSwitch

IMPLEMENTATION = "headprobe_selective"
#: Queries per block of the masked attention.
BLOCK = 256
#: ``callback(layer_idx, rows [batch, query_heads, n_rows, keys], key_positions [keys])``.
RowCallback = Callable[[int, torch.Tensor, torch.Tensor], None]


@dataclass
class KeyLayout:
    """Positions and branches of a layer's keys and queries (branch ``-1``: the prompt).

    A key is visible to a query when its position is not later than the query's, it lies inside the
    query's window on a sliding layer, and it belongs to the prompt or to the query's own branch.

    Attributes
    ----------
    key_positions, key_branches
        ``[keys]`` of the buffer: prompt keys first (key ``j`` at position ``j``), then branch tokens.
    query_positions, query_branches
        ``[queries]`` of the forward, prompt queries first (ascending), then branch queries.
    prompt_length
        Prompt positions in the buffer (``n``).
    tail_start
        When the prompt queries are exactly positions ``tail_start .. n - 1``, else ``None``.
    rows
        How many of the last queries to hand to ``row_callback`` (``0``: none).
    row_callback
        Receives the rows of the last ``rows`` queries over every key.
    """

    key_positions: torch.Tensor
    key_branches: torch.Tensor
    query_positions: torch.Tensor
    query_branches: torch.Tensor
    prompt_length: int
    tail_start: int | None = None
    rows: int = 0
    row_callback: RowCallback | None = None

    def visible(self, queries: slice, keys: slice, window: int | None) -> torch.Tensor:
        """``[queries, keys]`` boolean visibility of a block of queries over a range of keys."""
        qp, qb = self.query_positions[queries], self.query_branches[queries]
        kp, kb = self.key_positions[keys], self.key_branches[keys]
        seen = (kp[None, :] <= qp[:, None]) & ((kb[None, :] < 0) | (kb[None, :] == qb[:, None]))
        if window:
            seen = seen & (qp[:, None] - kp[None, :] < window)
        return seen

    def key_range(self, queries: slice, window: int | None) -> slice:
        """The keys a block of queries can see at most: up to its last position (the whole buffer when it
        holds branch queries), from its window's start on sliding layers."""
        qp, qb = self.query_positions[queries], self.query_branches[queries]
        stop = len(self.key_positions) if bool((qb >= 0).any()) else int(qp.max()) + 1
        start = max(0, int(qp.min()) - window + 1) if window else 0
        return slice(min(start, self.prompt_length), stop)


def grouped_masked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                             scaling: float) -> torch.Tensor:
    """Masked softmax attention with the query heads of each KV head stacked along the query axis.

    Parameters
    ----------
    query
        ``[batch, query_heads, queries, head_dim]``; query head ``h`` reads KV head ``h // group``.
    key, value
        ``[batch, kv_heads, keys, head_dim]``.
    mask
        ``[queries, keys]`` boolean, ``True`` where a key is visible (every query sees at least one key).
    scaling
        Multiplier of ``q·k``.

    Returns
    -------
    torch.Tensor
        ``[batch, queries, query_heads, head_dim]`` (the layout transformers' attention functions return).
    """
    batch, q_heads, queries, head_dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    group = q_heads // kv_heads
    stacked = query.reshape(batch, kv_heads, group * queries, head_dim)
    stacked_mask = mask[None].expand(group, queries, keys).reshape(1, 1, group * queries, keys)
    out = F.scaled_dot_product_attention(stacked, key, value, attn_mask=stacked_mask, scale=scaling)
    return out.reshape(batch, q_heads, queries, head_dim).transpose(1, 2).contiguous()


def masked_rows(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor, scaling: float) -> torch.Tensor:
    """Softmax rows ``[batch, query_heads, queries, keys]`` float32 of ``query`` over ``key`` under ``mask``
    ``[queries, keys]`` (shapes as in :func:`grouped_masked_attention`)."""
    batch, q_heads, queries, head_dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    group = q_heads // kv_heads
    q = query.float().reshape(batch, kv_heads, group * queries, head_dim)
    logits = torch.matmul(q, key.float().transpose(-1, -2)) * scaling
    logits = logits.reshape(batch, kv_heads, group, queries, keys).masked_fill(~mask, float("-inf"))
    return torch.softmax(logits, dim=-1).reshape(batch, q_heads, queries, keys)


def _selective_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):  # noqa: ARG001 (transformers' attention-function signature)
    switch = SelectiveAttention.active()
    layout: KeyLayout | None = switch.layout if switch is not None else None
    if layout is None:
        raise HeadprobeError("selective attention ran without a key layout")
    if kwargs.get("softcap") or kwargs.get("s_aux") is not None or dropout:
        raise HeadprobeError("selective recompute does not support attention logit soft-capping or sinks")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    window = kwargs.get("sliding_window")
    n, total = layout.prompt_length, query.shape[2]
    outputs = []
    start = 0
    if layout.tail_start is not None and prefix_split_supported(query, window, None, 0.0):
        prompt_queries = n - layout.tail_start
        outputs.append(prefix_split_attention(query[:, :, :prompt_queries], key[:, :, :n], value[:, :, :n],
                                              layout.tail_start, scale))
        start = prompt_queries
    for block in range(start, total, BLOCK):
        queries = slice(block, min(block + BLOCK, total))
        keys = layout.key_range(queries, window)
        outputs.append(grouped_masked_attention(query[:, :, queries], key[:, :, keys], value[:, :, keys],
                                                layout.visible(queries, keys, window), scale))
    if layout.rows and layout.row_callback is not None:
        queries = slice(total - layout.rows, total)
        everything = slice(0, key.shape[2])
        rows = masked_rows(query[:, :, queries], key, layout.visible(queries, everything, window), scale)
        layout.row_callback(int(module.layer_idx), rows, layout.key_positions)
    return torch.cat(outputs, dim=1), None


class SelectiveAttention(AttentionSwitch, implementation=IMPLEMENTATION, sdpa_masks=False):
    """Context manager: the model's layers attend by the :class:`KeyLayout` set in ``layout`` before each
    layer runs (the ``attention_mask`` argument is not used)."""

    attention = staticmethod(_selective_attention)

    def __init__(self, model) -> None:
        super().__init__(model)
        self.layout: KeyLayout | None = None
