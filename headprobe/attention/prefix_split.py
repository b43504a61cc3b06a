"""Attention of a block of queries that follows a cached prefix, as two kernel calls merged exactly.

A forward over a prompt's suffix, on top of a cached prefix, normally runs SDPA with an explicit mask
over all keys: every query is scored against every key, including the block's own future keys that
the mask then throws away, and the kernel cannot skip the blocks above the diagonal. When every query
sees the whole prefix and the block is causal among itself (right padding only), the same attention is
an unmasked pass over the prefix plus a causal pass over the block. Both passes return the log-sum-exp
of their logits, so the two partial outputs merge exactly (:func:`merge_partial_attention`):
``out = (e^{lse_p} out_p + e^{lse_b} out_b) / (e^{lse_p} + e^{lse_b})``. The causal pass skips the
upper triangle, which is about a third of the attention work for a suffix as long as its prefix and
half of it for a suffix with no prefix. No ``[block, prefix + block]`` mask is built.

The fused kernels that return the log-sum-exp (:func:`attention_with_lse`):

- CPU: ``aten._scaled_dot_product_flash_attention_for_cpu``;
- CUDA: ``aten._scaled_dot_product_flash_attention`` for float16 / bfloat16,
  ``aten._scaled_dot_product_efficient_attention`` (``compute_log_sumexp=True``) for float32, whose
  log-sum-exp rows are padded to a multiple of 32 and cut back here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: ``attend(query, key, value, causal, scaling) -> (out [b, h, n, d], lse [b, h, n] float32)``: one fused
#: attention call that also returns each query row's log-sum-exp of its (scaled) logits.
LseAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool, float], tuple[torch.Tensor, torch.Tensor]]

#: Largest head size the CUDA flash and memory-efficient kernels take.
_CUDA_MAX_HEAD_DIM = 256


def prefix_split_supported(query: torch.Tensor, sliding_window: int | None, softcap: float | None,
                           dropout: float) -> bool:
    """Whether :func:`prefix_split_attention` can stand in for masked SDPA here.

    It needs a fused kernel that returns the log-sum-exp (CPU, or CUDA with a head size that is a
    multiple of 8 up to 256), global attention (no sliding window), no logit soft-capping and no dropout.
    """
    if sliding_window or softcap or dropout or query.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    if query.device.type == "cpu":
        return True
    head_dim = query.shape[-1]
    return query.device.type == "cuda" and head_dim % 8 == 0 and head_dim <= _CUDA_MAX_HEAD_DIM


def attention_with_lse(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool,
                       scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One fused SDPA call that also returns the log-sum-exp of every query row.

    Parameters
    ----------
    query
        ``[batch, heads, n, head_dim]``.
    key, value
        ``[batch, heads, keys, head_dim]`` (as many heads as the query).
    causal
        Top-left causal mask (query ``i`` sees keys ``0 .. i``); used with ``keys == n``.
    scaling
        Multiplier of ``q·k``.

    Returns
    -------
    out, lse
        ``[batch, heads, n, head_dim]`` in the query's dtype and ``[batch, heads, n]`` float32
        ``log Σ_j exp(scaling · q·k_j)``.
    """
    if query.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, causal,
                                                                             scale=scaling)[:2]
        return out, lse
    if query.dtype in (torch.float16, torch.bfloat16):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, 0.0, causal, False,
                                                                     scale=scaling)[:2]
    else:
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, None, True, 0.0, causal,
                                                                          scale=scaling)[:2]
    return out, lse[..., :query.shape[2]].float()


def merge_partial_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                            lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over the union of two disjoint key sets from the two partial attentions.

    Parameters
    ----------
    out_a, out_b
        ``[..., n, head_dim]`` softmax-normalised outputs over key sets A and B.
    lse_a, lse_b
        ``[..., n]`` log-sum-exp of the logits over A and over B (``-inf`` for a row that sees none).

    Returns
    -------
    torch.Tensor
        ``[..., n, head_dim]`` float32: ``(e^{lse_a} out_a + e^{lse_b} out_b) / (e^{lse_a} + e^{lse_b})``,
        computed against the larger of the two so that nothing overflows.
    """
    top = torch.maximum(lse_a, lse_b)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    w_a = torch.exp(lse_a.float() - top)[..., None]
    w_b = torch.exp(lse_b.float() - top)[..., None]
    return (out_a.float() * w_a + out_b.float() * w_b) / (w_a + w_b)


def prefix_split_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, prefix: int,
                           scaling: float, attend: LseAttention | None = None) -> torch.Tensor:
    """Attention of a block after ``prefix`` cached keys: all of the prefix visible, causal within the block.

    Parameters
    ----------
    query
        ``[batch, query_heads, block, head_dim]``.
    key, value
        ``[batch, kv_heads, prefix + block, head_dim]``: the cached prefix, then the block's own keys.
        ``query_heads`` must be a multiple of ``kv_heads``.
    prefix
        Number of cached keys every query sees (0 for a block with nothing before it).
    scaling
        Multiplier of ``q·k``.
    attend
        The fused call (default :func:`attention_with_lse`, which picks the kernel by device).

    Returns
    -------
    torch.Tensor
        ``[batch, block, query_heads, head_dim]`` (the layout transformers' attention functions return),
        in the query's dtype. Equal to SDPA with the mask ``key j visible to query i iff j < prefix + i + 1``
        up to float rounding.
    """
    attend = attend or attention_with_lse
    batch, q_heads, block, head_dim = query.shape
    kv_heads = key.shape[1]
    if key.shape[2] != prefix + block:
        raise ValueError(f"keys: expected prefix + block = {prefix + block}, got {key.shape[2]}")
    group = q_heads // kv_heads
    block_key, block_value = key[:, :, prefix:], value[:, :, prefix:]
    if group > 1:  # the causal pass needs one key head per query head; the block is the short part
        block_key = block_key.repeat_interleave(group, dim=1)
        block_value = block_value.repeat_interleave(group, dim=1)
    out_block, lse_block = attend(query, block_key, block_value, True, scaling)
    if prefix == 0:
        return out_block.transpose(1, 2).contiguous()
    # Unmasked, the prefix pass can stack a KV head's query heads along the query axis instead of
    # repeating the (long) prefix keys: query head h reads KV head h // group.
    stacked = query.reshape(batch, kv_heads, group * block, head_dim)
    out_prefix, lse_prefix = attend(stacked, key[:, :, :prefix], value[:, :, :prefix], False, scaling)
    out_prefix = out_prefix.reshape(batch, q_heads, block, head_dim)
    lse_prefix = lse_prefix.reshape(batch, q_heads, block)
    merged = merge_partial_attention(out_prefix, lse_prefix, out_block, lse_block)
    return merged.to(query.dtype).transpose(1, 2).contiguous()
