"""PyTorch implementations of the runtime kernels: the CPU default and the reference for the Triton ones."""

from __future__ import annotations

import torch

from ...attention.rows import masked_attention


def compact_torch(keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, index: torch.Tensor,
                  count: torch.Tensor, offsets: torch.Tensor, out_keys: torch.Tensor, out_values: torch.Tensor,
                  out_positions: torch.Tensor) -> None:
    """Gather the kept pairs of every segment into the flat buffers.

    Parameters
    ----------
    keys, values
        ``[batch, kv_heads, tokens, head_dim]``.
    positions
        ``[batch, tokens]`` absolute positions.
    index, count
        ``[segments, k_max]`` token indices and ``[segments]`` counts.
    offsets
        ``[segments]`` first flat row of each segment.
    out_keys, out_values, out_positions
        Flat ``[rows, head_dim]`` / ``[rows]`` buffers written in place.
    """
    b, h, n, d = keys.shape
    s, k = index.shape
    if k == 0 or n == 0:
        return
    src = index.clamp(0, n - 1)
    ar = torch.arange(k, device=keys.device)
    valid = ar[None, :] < count[:, None]
    dst = (offsets[:, None] + ar[None, :])[valid]
    gk = torch.gather(keys.reshape(s, n, d), 1, src[..., None].expand(s, k, d))
    gv = torch.gather(values.reshape(s, n, d), 1, src[..., None].expand(s, k, d))
    pos = positions[:, None, :].expand(b, h, n).reshape(s, n)
    gp = torch.gather(pos, 1, src)
    out_keys[dst] = gk[valid].to(out_keys.dtype)
    out_values[dst] = gv[valid].to(out_values.dtype)
    out_positions[dst] = gp[valid].to(out_positions.dtype)


def ragged_attention_torch(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                           key_positions: torch.Tensor, valid: torch.Tensor, query_positions: torch.Tensor,
                           scaling: float, sliding_window: int | None = None, softcap: float | None = None,
                           log_bias: torch.Tensor | None = None, return_probs: bool = False):
    """Attention of new queries over per-segment padded keys (GQA: one segment serves ``group`` heads).

    The segments are viewed as ``[batch, kv_heads, max_len, head_dim]`` and handed to
    :func:`~headprobe.attention.rows.masked_attention` with the causal (and sliding-window) mask of the
    stored positions.

    Parameters
    ----------
    query
        ``[batch, query_heads, n, head_dim]``.
    keys, values
        ``[segments, max_len, head_dim]`` with ``segments = batch * kv_heads``.
    key_positions, valid
        ``[segments, max_len]`` positions and bool mask of the stored pairs.
    query_positions
        ``[batch, n]``; key ``j`` is visible when ``pos_j <= pos_q`` (and inside the sliding window).
    log_bias
        ``[segments, max_len]`` added to the logits (KeepKV votes).

    Returns
    -------
    torch.Tensor
        ``[batch, query_heads, n, head_dim]`` in the query dtype (and ``[segments, group*n, max_len]``
        probabilities when ``return_probs``).
    """
    b, _, _, d = query.shape
    s, width = keys.shape[:2]
    hkv = s // b
    kp = key_positions.reshape(b, hkv, 1, width)
    qp = query_positions[:, None, :, None]                                  # [b, 1, n, 1]
    visible = valid.reshape(b, hkv, 1, width) & (kp <= qp)                 # [b, kv, n, L]
    if sliding_window:
        visible = visible & (qp - kp < sliding_window)
    bias = log_bias.reshape(b, hkv, width) if log_bias is not None else None
    out, probs = masked_attention(query, keys.reshape(b, hkv, width, d), values.reshape(b, hkv, width, -1),
                                  visible, scaling, softcap=softcap, log_bias=bias, return_probs=True)
    return (out, probs.reshape(s, -1, width)) if return_probs else out
