"""``streaming``: StreamingLLM's attention sinks plus the most recent tokens, at a constant size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ...errors import HeadprobeError
from .base import LayerContext, ScorerPolicy, check_window, decodes_as, evict_oldest


@dataclass
class Streaming(ScorerPolicy):
    """Keep ``sink`` first tokens and ``budget - sink`` most recent ones; the cache never grows."""

    name: ClassVar[str] = "streaming"
    sink: int = 4
    window: int = 8

    def __post_init__(self) -> None:
        check_window(self, 0)
        if self.sink < 0:
            raise HeadprobeError(f"policy {self.name}: sink {self.sink}: expected 0 or more")

    def score(self, ctx: LayerContext) -> torch.Tensor:
        recency = ctx.positions.float()
        sinks_first = torch.where(ctx.positions < self.sink, torch.full_like(recency, 2.0 * ctx.tokens), recency)
        return sinks_first[:, None, :].expand(-1, ctx.kv_heads, -1)

    def head_limits(self, ctx: LayerContext) -> torch.Tensor:
        """``[batch * kv_heads]`` the most pairs a head ever holds: its budget."""
        return ctx.budgets.reshape(-1)

    def reserve(self, ctx, kept):
        """Room to grow up to the head's limit, never beyond: the oldest non-sink pair leaves for each new one."""
        limit = torch.minimum(self.head_limits(ctx).to(kept.device), kept + ctx.max_new_tokens)
        return (limit - kept).clamp(min=0) + (limit == 0).long()

    def before_append(self, ctx: LayerContext) -> None:
        evict_oldest(ctx, self.sink)

    def decode_group(self) -> tuple[Any, ...] | None:
        """Rows that evict their oldest pair past the same ``sink`` decode together."""
        same = decodes_as(type(self), Streaming) and self.layer_state is None and not self.uses_votes
        return ("evict_oldest", self.sink) if same else None
