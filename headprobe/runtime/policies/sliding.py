"""Sliding-window layers (Gemma 3 local layers): keep exactly the window, whatever the policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..store import Selection
from .base import LayerContext, Policy, window_and_topk
from .streaming import evict_oldest


@dataclass
class SlidingWindow(Policy):
    """Keeps the last ``sliding_window - 1`` prompt tokens; decoding replaces the oldest pair."""

    name: ClassVar[str] = "sliding"
    uses_budgets: ClassVar[bool] = False
    window: int = 0

    def select(self, ctx: LayerContext) -> Selection:
        keep = ctx.sliding_window - 1
        b, h = ctx.batch, ctx.kv_heads
        sized = LayerContext(**{**ctx.__dict__, "budgets": torch.full((b, h), keep, dtype=torch.long,
                                                                       device=ctx.keys.device)})
        return window_and_topk(ctx.positions.float()[:, None, :].expand(b, h, -1), sized, 0)

    def reserve(self, ctx, kept):
        return (ctx.sliding_window - kept).clamp(min=1)

    def before_append(self, ctx: LayerContext) -> None:
        evict_oldest(ctx, 0)
