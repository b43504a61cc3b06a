"""Attention of a block of queries that follows a cached prefix, as two kernel calls merged exactly.

A forward over a prompt's suffix, on top of a cached prefix, normally runs SDPA with an explicit mask
over all keys: every query is scored against every key, including the block's own future keys that
the mask then throws away, and the kernel cannot skip the blocks above the diagonal. When every query
sees the whole prefix and the block is causal among itself (right padding only), the same attention is
an unmasked pass over the prefix plus a causal pass over the block. Both passes return the log-sum-exp
of their logits, so the two partial outputs merge exactly:
``out = (e^{lse_p} out_p + e^{lse_b} out_b) / (e^{lse_p} + e^{lse_b})``. The causal pass skips the
upper triangle, which is about a third of the attention work for a suffix as long as its prefix and
half of it for a suffix with no prefix.
"""

from __future__ import annotations

import torch


def prefix_split_supported(query: torch.Tensor, sliding_window: int | None, softcap: float | None,
                           dropout: float) -> bool:
    """Whether :func:`prefix_split_attention` can stand in for masked SDPA here.

    It needs the CPU flash kernel (which returns the log-sum-exp), global attention (no sliding
    window), no logit soft-capping and no dropout.
    """
    return (query.device.type == "cpu" and not sliding_window and not softcap and not dropout
            and query.dtype in (torch.float32, torch.bfloat16, torch.float16))


def prefix_split_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, prefix: int,
                           scaling: float) -> torch.Tensor:
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

    Returns
    -------
    torch.Tensor
        ``[batch, block, query_heads, head_dim]`` (the layout transformers' attention functions return),
        in the query's dtype. Equal to SDPA with the mask ``key j visible to query i iff j < prefix + i + 1``
        up to float rounding.
    """
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    batch, q_heads, block, head_dim = query.shape
    kv_heads = key.shape[1]
    if key.shape[2] != prefix + block:
        raise ValueError(f"keys: expected prefix + block = {prefix + block}, got {key.shape[2]}")
    group = q_heads // kv_heads
    block_key, block_value = key[:, :, prefix:], value[:, :, prefix:]
    if group > 1:  # the causal pass needs one key head per query head; the block is the short part
        block_key = block_key.repeat_interleave(group, dim=1)
        block_value = block_value.repeat_interleave(group, dim=1)
    out_block, lse_block = flash(query, block_key, block_value, 0.0, True, scale=scaling)[:2]
    if prefix == 0:
        return out_block.transpose(1, 2).contiguous()
    # Unmasked, the prefix pass can stack a KV head's query heads along the query axis instead of
    # repeating the (long) prefix keys: query head h reads KV head h // group.
    stacked = query.reshape(batch, kv_heads, group * block, head_dim)
    out_prefix, lse_prefix = flash(stacked, key[:, :, :prefix], value[:, :, :prefix], 0.0, False, scale=scaling)[:2]
    out_prefix = out_prefix.reshape(batch, q_heads, block, head_dim)
    lse_prefix = lse_prefix.reshape(batch, q_heads, block)
    top = torch.maximum(lse_prefix, lse_block)
    w_prefix = torch.exp(lse_prefix - top)[..., None]            # [b, h, block, 1]
    w_block = torch.exp(lse_block - top)[..., None]
    merged = (out_prefix.float() * w_prefix + out_block.float() * w_block) / (w_prefix + w_block)
    return merged.to(query.dtype).transpose(1, 2).contiguous()
