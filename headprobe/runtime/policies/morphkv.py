"""``morphkv``: a constant-size cache while decoding (R recent + top C older tokens).

Following the authors' newer design: the last ``recent`` post-RoPE queries of every query head are kept;
at each eviction their attention to the cache is recomputed (softmax over the older tokens only), reduced
over the GQA group (``group_reduce``), fused over the window rows (``fuse`` = sum | max), and the top
``C = budget - recent`` older tokens stay. Eviction happens before the current token attends. The prompt
is cut to ``C + R`` at the end of prefill, with the prompt's last R queries (the same scores the first
decoding step would compute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ...attention.rows import attention_rows
from ...errors import HeadprobeError
from ..kernels.torch_ref import ragged_attention_torch
from .base import LayerContext, ScorerPolicy, check_window


def _reduce(probs: torch.Tensor, fuse: str, group_reduce: str) -> torch.Tensor:
    """``[b, kv, group, rows, keys]`` → ``[b, kv, keys]``."""
    fused = probs.sum(3) if fuse == "sum" else probs.amax(3)
    return fused.sum(2) if group_reduce == "sum" else fused.amax(2)


@dataclass
class MorphKVState:
    """The last R queries of a layer, kept to score its cache while decoding.

    Attributes
    ----------
    queries
        ``[batch, q_heads, R, head_dim]`` post-RoPE queries (a ring of the most recent ones).
    query_positions
        ``[batch, R]`` their positions.
    step
        Decoding steps so far (eviction every ``evict_every``).
    """

    queries: torch.Tensor | None = None
    query_positions: torch.Tensor | None = None
    step: int = 0


@dataclass
class MorphKV(ScorerPolicy):
    """MorphKV: ``window`` (R) recent tokens + the top ``budget - R`` by fused window attention."""

    name: ClassVar[str] = "morphkv"
    observes_window: ClassVar[bool] = True
    layer_state: ClassVar[type] = MorphKVState
    window: int = 32
    fuse: str = "sum"
    group_reduce: str = "max"
    evict_every: int = 1

    def __post_init__(self) -> None:
        check_window(self)
        if self.fuse not in ("sum", "max"):
            raise HeadprobeError(f"policy morphkv: fuse {self.fuse!r}: expected sum or max")
        if self.group_reduce not in ("sum", "max"):
            raise HeadprobeError(f"policy morphkv: group_reduce {self.group_reduce!r}: expected sum or max")
        if self.evict_every < 1:
            raise HeadprobeError("policy morphkv: evict_every must be at least 1")

    def score(self, ctx: LayerContext) -> torch.Tensor:
        n = ctx.tokens
        r = min(self.window, n)
        older = ctx.valid.clone()
        older[:, n - r:] = False
        rows = attention_rows(ctx.query[:, :, n - r:], ctx.keys, ctx.positions[:, n - r:], ctx.scaling,
                              key_positions=ctx.positions, sliding_window=ctx.sliding_window,
                              softcap=ctx.softcap, key_mask=older)                  # [b, hq, r, n]
        b, hq = rows.shape[:2]
        return _reduce(rows.reshape(b, ctx.kv_heads, hq // ctx.kv_heads, r, n), self.fuse, self.group_reduce)

    def compress(self, ctx: LayerContext) -> None:
        n = ctx.tokens
        r = min(self.window, n)
        state: MorphKVState = ctx.state
        state.queries = ctx.query[:, :, n - r:].clone()          # the window queries, for decoding
        state.query_positions = ctx.positions[:, n - r:].clone()
        state.step = 0
        store = self.build_store(ctx, self.select(ctx))
        store.set_state_bytes(state.queries.numel() * state.queries.element_size())

    def reserve(self, ctx: LayerContext, kept: torch.Tensor) -> torch.Tensor:
        budget = ctx.budgets.reshape(-1).to(kept.device)
        limit = torch.minimum(budget + self.evict_every - 1, kept + ctx.max_new_tokens)
        return (limit - kept).clamp(min=0)

    def before_append(self, ctx: LayerContext) -> None:
        state: MorphKVState = ctx.state
        r = self.window
        state.queries = torch.cat([state.queries, ctx.query], 2)[:, :, -r:]
        state.query_positions = torch.cat([state.query_positions, ctx.positions], 1)[:, -r:]
        state.step += 1
        store, budget = ctx.store, ctx.budgets.reshape(-1).to(ctx.store.lengths.device)
        n_new = ctx.tokens
        if state.step % self.evict_every and bool((store.host_lengths + n_new <= store.host_capacity).all()):
            return
        # After eviction; the new tokens fill up to the budget. Decided on the host.
        host_target = np.clip(ctx.host_budgets - n_new, 0, None)
        if not (store.host_lengths > host_target).any():
            return
        target = (budget - n_new).clamp(min=0)
        view = store.padded()
        pos = view["positions"].masked_fill(~view["valid"], -1)
        rank = pos.argsort(1, descending=True).argsort(1)
        recent = (rank < max(r - n_new, 0)) & view["valid"]      # the window minus the incoming tokens
        older = view["valid"] & ~recent
        _, probs = ragged_attention_torch(state.queries, view["keys"], view["values"], view["positions"],
                                          older, state.query_positions, ctx.scaling, ctx.sliding_window,
                                          ctx.softcap, return_probs=True)          # [S, g*r', L]
        s, _, width = probs.shape
        rows = state.queries.shape[2]
        g = state.queries.shape[1] * ctx.batch // s
        scores = _reduce(probs.reshape(ctx.batch, s // ctx.batch, g, rows, width), self.fuse, self.group_reduce)
        scores = scores.reshape(s, width).masked_fill(recent, float("inf")).masked_fill(~view["valid"], float("-inf"))
        host_count = np.minimum(store.host_lengths, host_target)
        keep = scores.topk(max(int(host_count.max()), 1), dim=1).indices
        store.keep_in_place(keep, torch.minimum(store.lengths, target), host_count)
