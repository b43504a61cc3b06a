"""Full causal attention over a prompt (left padding and sliding windows respected), on fused kernels.

Every call takes a path a fused SDPA kernel accepts:

- no padding, no window: ``is_causal`` with ``enable_gqa`` (no mask at all);
- padding or a sliding window: an explicit boolean mask, with the keys and values repeated to the query
  heads. SDPA's fused CUDA kernels do not take an explicit mask together with ``enable_gqa``; that pair
  falls back to the math kernel, which materialises float32 ``[batch, q_heads, n, n]`` scores. The
  repeated keys and values cost ``group ×`` the prompt's K/V instead;
- soft-capped logits (no SDPA kernel caps them): float32 attention through
  :func:`~headprobe.attention.rows.masked_attention`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention.rows import masked_attention


def prompt_mask(positions: torch.Tensor, valid: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    """``[batch, n, n]`` bool: key ``j`` visible to query ``i`` (causal, not padding, inside the window).

    Padding rows see themselves, so that no row is empty.
    """
    n = positions.shape[1]
    qp, kp = positions[:, :, None], positions[:, None, :]
    visible = (kp <= qp) & valid[:, None, :]
    if sliding_window:
        visible &= qp - kp < sliding_window
    return visible | torch.eye(n, dtype=torch.bool, device=positions.device)[None]


def prefill_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                      valid: torch.Tensor, scaling: float, sliding_window: int | None = None,
                      softcap: float | None = None) -> torch.Tensor:
    """Causal attention of a prompt over itself.

    Parameters
    ----------
    query
        ``[batch, q_heads, n, head_dim]`` post-RoPE.
    keys, values
        ``[batch, kv_heads, n, head_dim]``.
    positions, valid
        ``[batch, n]`` absolute positions and ``False`` for left padding.
    scaling, sliding_window, softcap
        As the model's attention passes them.

    Returns
    -------
    torch.Tensor
        ``[batch, q_heads, n, head_dim]`` in the query's dtype.
    """
    n = query.shape[2]
    k, v = keys.to(query.dtype), values.to(query.dtype)
    if softcap:
        visible = prompt_mask(positions, valid, sliding_window)
        return masked_attention(query, k, v, visible[:, None], scaling, softcap=softcap)
    if not sliding_window and bool(valid.all()):
        return F.scaled_dot_product_attention(query, k, v, is_causal=n > 1, scale=scaling, enable_gqa=True)
    group = query.shape[1] // keys.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    visible = prompt_mask(positions, valid, sliding_window)
    return F.scaled_dot_product_attention(query, k, v, attn_mask=visible[:, None], scale=scaling)
