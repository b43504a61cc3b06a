"""Sliding-window layers (Gemma 3 local layers): keep exactly the window, whatever the policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .base import LayerContext, ScorerPolicy, decodes_as, evict_oldest


@dataclass
class SlidingWindow(ScorerPolicy):
    """Keeps the last ``sliding_window - 1`` prompt tokens; decoding replaces the oldest pair."""

    name: ClassVar[str] = "sliding"
    uses_budgets: ClassVar[bool] = False
    window: int = 0

    def score(self, ctx: LayerContext) -> torch.Tensor:
        return ctx.positions.float()[:, None, :].expand(ctx.batch, ctx.kv_heads, -1)     # the newest win

    def token_budgets(self, ctx: LayerContext, scores: torch.Tensor) -> torch.Tensor:  # noqa: ARG002 (a policy hook's signature)
        return torch.full((ctx.batch, ctx.kv_heads), ctx.sliding_window - 1, dtype=torch.long,
                          device=ctx.keys.device)

    def reserve(self, ctx, kept):
        return (ctx.sliding_window - kept).clamp(min=1)

    def before_append(self, ctx: LayerContext) -> None:
        evict_oldest(ctx, 0)

    def decode_group(self) -> tuple[Any, ...] | None:
        """Rows that evict their oldest pair decode together (a streaming cache without sinks among them)."""
        return ("evict_oldest", 0) if decodes_as(type(self), SlidingWindow) else None
