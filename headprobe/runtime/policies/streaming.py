"""``streaming``: StreamingLLM's attention sinks plus the most recent tokens, at a constant size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import HeadprobeError
from ..store import Selection
from .base import LayerContext, Policy, check_window, window_and_topk


def evict_oldest(ctx: LayerContext, protect_first: int) -> None:
    """Overwrite the oldest pair (after the first ``protect_first`` positions) with the new token, in
    segments that are full; the others append. Needs a single new token per step."""
    store = ctx.store
    full = store.lengths >= store.capacity
    if not bool(full.any()):
        return
    view = store.padded()
    pos = view["positions"].masked_fill(~view["valid"], 1 << 60)
    pos = pos.masked_fill(pos < protect_first, 1 << 60)
    slot = pos.argmin(1)
    store.remove(slot, full)


@dataclass
class Streaming(Policy):
    """Keep ``sink`` first tokens and ``budget - sink`` most recent ones; the cache never grows."""

    name: ClassVar[str] = "streaming"
    sink: int = 4
    window: int = 8

    def __post_init__(self) -> None:
        check_window(self, 0)
        if self.sink < 0:
            raise HeadprobeError(f"policy streaming: sink {self.sink}: expected 0 or more")

    def select(self, ctx: LayerContext) -> Selection:
        n = ctx.keys.shape[2]
        recency = ctx.positions.float()
        score = torch.where(ctx.positions < self.sink, torch.full_like(recency, 2.0 * n), recency)  # sinks first
        return window_and_topk(score[:, None, :].expand(-1, ctx.kv_heads, -1), ctx, self.window)

    def reserve(self, ctx, kept):
        budgets = ctx.budgets.reshape(-1).to(kept.device)
        limit = torch.minimum(budgets, kept + ctx.cache.max_new_tokens)
        return (limit - kept).clamp(min=0) + (limit == 0).long()

    def before_append(self, ctx: LayerContext) -> None:
        evict_oldest(ctx, self.sink)
