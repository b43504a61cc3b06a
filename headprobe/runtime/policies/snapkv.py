"""``snapkv``: HeadKV's selection inside each head, once, at the end of prefill.

Scores: the last ``window`` queries' softmax attention to the prefix, averaged over those rows, max-pooled
(kernel 7), averaged over the query heads of each KV head; keep the top ``budget - window`` positions plus
the window. Decoding appends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...attention.rows import attention_rows, pooled_window_scores
from ..store import Selection
from .base import LayerContext, Policy, window_and_topk


def window_scores(ctx: LayerContext, window: int, kernel_size: int, pooling: str = "max") -> torch.Tensor:
    """``[batch, kv_heads, n]`` SnapKV scores of every prompt token (GQA group mean).

    Window rows are the last ``window`` queries; padding keys get no attention.
    """
    n = ctx.keys.shape[2]
    w = min(window, n)
    rows = attention_rows(ctx.query[:, :, n - w:], ctx.keys, ctx.positions[:, n - w:], ctx.scaling,
                          key_positions=ctx.positions, sliding_window=ctx.sliding_window, softcap=ctx.softcap,
                          key_mask=ctx.valid)
    scores = pooled_window_scores(rows, n, kernel_size, pooling)   # [b, q_heads, n]
    b, hq, _ = scores.shape
    return scores.reshape(b, ctx.kv_heads, hq // ctx.kv_heads, n).mean(2)


@dataclass
class SnapKV(Policy):
    """HeadKV / SnapKV selection (window 8, max-pool 7) with any budget map."""

    name: ClassVar[str] = "snapkv"
    window: int = 8
    kernel_size: int = 7
    pooling: str = "max"

    def select(self, ctx: LayerContext) -> Selection:
        return window_and_topk(window_scores(ctx, self.window, self.kernel_size, self.pooling), ctx, self.window)
