"""Attention probabilities of a few query rows over the keys, without the full attention matrix.

:func:`masked_attention` is the one masked softmax attention of the package (float32, GQA by stacking
each KV head's query heads, optional soft-capping and log bias); :func:`attention_rows` builds the causal
mask from positions and calls it. These are the pure tensor functions; :mod:`headprobe.attention.recorder` hooks them into a model's
forward through transformers' attention interface.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import HeadprobeError


def masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor | None,
    visible: torch.Tensor,
    scaling: float,
    softcap: float | None = None,
    log_bias: torch.Tensor | None = None,
    return_probs: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention in float32 under an explicit visibility mask, GQA without repeating the keys.

    The query heads that read one KV head are stacked along the query axis
    (``[batch, kv_heads, group · n, head_dim]``), so the keys and values are used as they are.

    Parameters
    ----------
    query
        ``[batch, query_heads, n, head_dim]``; ``query_heads`` a multiple of ``kv_heads`` (query head ``h``
        reads KV head ``h // (query_heads // kv_heads)``).
    key
        ``[batch, kv_heads, keys, head_dim]``.
    value
        ``[batch, kv_heads, keys, value_dim]``, or ``None`` to return the probabilities only.
    visible
        Boolean, broadcastable to ``[batch, kv_heads, n, keys]`` (``[batch or 1, kv_heads or 1, n, keys]``):
        which keys each query row may attend to; shared by the query heads of a KV head.
    scaling
        Multiplier of ``q·k``.
    softcap
        Logit soft-capping ``softcap · tanh(logits / softcap)`` (applied before the bias), ``None`` for none.
    log_bias
        ``[batch, kv_heads, keys]`` added to the logits (KeepKV's ``log p`` votes).
    return_probs
        Also return the probabilities.

    Returns
    -------
    torch.Tensor or tuple
        ``[batch, query_heads, n, value_dim]`` in the query's dtype; with ``return_probs`` also the
        ``[batch, query_heads, n, keys]`` float32 probabilities; with ``value=None`` the probabilities only.
        A row that sees no key gets zero probabilities (and a zero output).
    """
    batch, q_heads, n, head_dim = query.shape
    kv_heads, n_keys = key.shape[1], key.shape[2]
    group = q_heads // kv_heads
    q = query.float().reshape(batch, kv_heads, group * n, head_dim)
    logits = torch.matmul(q, key.float().transpose(-1, -2)) * scaling        # [b, kv, group*n, keys]
    logits = logits.reshape(batch, kv_heads, group, n, n_keys)
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    if log_bias is not None:
        logits = logits + log_bias.float()[:, :, None, None, :]
    logits = logits.masked_fill(~visible.to(torch.bool)[:, :, None], float("-inf"))
    probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)                     # [b, kv, group, n, keys]
    if value is None:
        return probs.reshape(batch, q_heads, n, n_keys)
    out = torch.matmul(probs.reshape(batch, kv_heads, group * n, n_keys), value.float())
    out = out.reshape(batch, q_heads, n, value.shape[-1]).to(query.dtype)
    return (out, probs.reshape(batch, q_heads, n, n_keys)) if return_probs else out


def attention_rows(
    query: torch.Tensor,
    key: torch.Tensor,
    query_positions: torch.Tensor,
    scaling: float,
    key_positions: torch.Tensor | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    key_mask: torch.Tensor | None = None,
    log_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal softmax attention of selected queries over all keys, every query head.

    Parameters
    ----------
    query
        ``[batch, query_heads, n_rows, head_dim]`` post-RoPE queries of the selected rows only.
    key
        ``[batch, kv_heads, keys, head_dim]`` post-RoPE keys; ``query_heads`` must be a multiple of
        ``kv_heads`` (query head ``h`` reads KV head ``h // (query_heads // kv_heads)``).
    query_positions
        ``[n_rows]`` or ``[batch, n_rows]`` absolute positions of the rows; key ``j`` is visible to a
        row at position ``p`` when ``key_positions[j] <= p`` (and ``p - key_positions[j] < sliding_window``).
    scaling
        Multiplier of ``q·k`` (``1/sqrt(head_dim)`` for most models).
    key_positions
        ``[keys]`` or ``[batch, keys]`` absolute key positions; default ``0 .. keys-1``.
    sliding_window
        Window of a sliding-window layer, ``None`` for global attention.
    softcap
        Logit soft-capping (``softcap * tanh(logits / softcap)``), ``None`` for none.
    key_mask
        ``[batch, keys]`` boolean, ``False`` for padding keys.
    log_bias
        ``[batch, kv_heads, keys]`` added to the logits (KeepKV's ``log p`` votes).

    Returns
    -------
    torch.Tensor
        ``[batch, query_heads, n_rows, keys]`` float32 probabilities (:func:`masked_attention`); rows sum to 1.
    """
    if key_positions is None:
        key_positions = torch.arange(key.shape[2], device=key.device)
    qp = query_positions.to(key.device)
    kp = key_positions.to(key.device)
    qp = qp[None, :] if qp.dim() == 1 else qp          # [b or 1, rows]
    kp = kp[None, :] if kp.dim() == 1 else kp          # [b or 1, keys]
    visible = kp[:, None, :] <= qp[:, :, None]         # [b or 1, rows, keys]
    if sliding_window:
        visible = visible & (qp[:, :, None] - kp[:, None, :] < sliding_window)
    if key_mask is not None:
        visible = visible & key_mask[:, None, :].to(torch.bool)
    return masked_attention(query, key, None, visible[:, None], scaling, softcap=softcap, log_bias=log_bias)


def pooled_window_scores(
    rows: torch.Tensor,
    prefix_len: int,
    kernel_size: int = 7,
    pooling: str = "max",
) -> torch.Tensor:
    """SnapKV's token scores: window rows averaged over the rows, then 1-D pooled over positions.

    Parameters
    ----------
    rows
        ``[batch, heads, window, keys]`` attention probabilities of the last ``window`` queries.
    prefix_len
        Keys ``0 .. prefix_len-1`` (the part before the window) are scored.
    kernel_size
        Pooling kernel (odd; padding ``kernel_size // 2`` keeps the length).
    pooling
        ``"max"`` (SnapKV/HeadKV) or ``"avg"``.

    Returns
    -------
    torch.Tensor
        ``[batch, heads, prefix_len]`` float32 scores.
    """
    if pooling not in ("max", "avg"):
        raise HeadprobeError(f"pooling {pooling!r}: expected max or avg")
    scores = rows[..., :prefix_len].float().mean(dim=-2)  # [b, h, prefix]
    if kernel_size and kernel_size > 1 and prefix_len > 0:
        b, h, n = scores.shape
        flat = scores.reshape(b * h, 1, n)
        pad = kernel_size // 2
        if pooling == "max":
            flat = F.max_pool1d(flat, kernel_size=kernel_size, stride=1, padding=pad)
        else:
            # zeros past both ends count, as in SnapKV's code and kvpress's SnapKVPress (torch's default)
            flat = F.avg_pool1d(flat, kernel_size=kernel_size, stride=1, padding=pad, count_include_pad=True)
        scores = flat.reshape(b, h, n)
    return scores
