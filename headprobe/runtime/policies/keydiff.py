"""``keydiff``: attention-free eviction by key diversity, with a real block-wise prefill.

Each cached key is scored by its negative cosine similarity to the anchor (the mean of the segment's
keys, normalised first or raw); the most distinct keys stay. The prompt is processed in blocks of
``block_size``: each block attends to the compressed cache plus itself, then the cache is cut back to the
budget, so a head never holds more than ``budget + block_size`` pairs. This is computed layer by layer;
since every layer is causal per token, the outputs equal those of feeding the blocks through the whole
model one after the other. Decoding evicts the least distinct pair once a head is full.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from ...errors import HeadprobeError
from ..store import LayerStore
from .base import LayerContext, Policy, check_window


def keydiff_scores(keys: torch.Tensor, valid: torch.Tensor, anchor: str = "normalized") -> torch.Tensor:
    """``[segments, L]`` scores (higher = more distinct) of padded keys ``[segments, L, head_dim]``."""
    k = keys.float()
    kn = F.normalize(k, dim=-1)
    src = kn if anchor == "normalized" else k
    w = valid.float()[..., None]
    mean = (src * w).sum(1) / w.sum(1).clamp(min=1)            # [S, D]
    cos = (kn * F.normalize(mean, dim=-1)[:, None, :]).sum(-1)  # [S, L]
    return (-cos).masked_fill(~valid, float("-inf"))


@dataclass
class KeyDiff(Policy):
    """KeyDiff with block prefill (``block_size``), anchor ``normalized`` | ``raw``, and an optional
    share of the budget reserved for the most recent tokens (``recent_share``)."""

    name: ClassVar[str] = "keydiff"
    full_prefill: ClassVar[bool] = False
    window: int = 0
    block_size: int = 128
    anchor: str = "normalized"
    recent_share: float = 0.0

    def __post_init__(self) -> None:
        check_window(self, 0)
        if self.anchor not in ("normalized", "raw"):
            raise HeadprobeError(f"policy keydiff: anchor {self.anchor!r}: expected normalized or raw")
        if not 0.0 <= self.recent_share < 1.0:
            raise HeadprobeError(f"policy keydiff: recent_share {self.recent_share}: expected a value in [0, 1)")
        if self.block_size < 1:
            raise HeadprobeError("policy keydiff: block_size must be positive")

    def _keep(self, store: LayerStore, budget: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Local slots to keep ``[S, k]`` and counts ``[S]`` to cut every segment to ``budget``."""
        view = store.padded()
        scores = keydiff_scores(view["keys"], view["valid"], self.anchor)
        recent = torch.round(budget.float() * self.recent_share).long()
        if bool((recent > 0).any()):
            pos = view["positions"].masked_fill(~view["valid"], -1)
            rank = pos.argsort(1, descending=True).argsort(1)       # 0 = newest
            scores = scores.masked_fill((rank < recent[:, None]) & view["valid"], float("inf"))
        count = torch.minimum(store.lengths, budget)
        k = max(int(count.max()), 1)
        keep = scores.topk(min(k, scores.shape[1]), dim=1).indices
        return keep, count

    def compress(self, ctx: LayerContext) -> None:  # noqa: ARG002 (a policy hook's signature)
        raise HeadprobeError("policy keydiff: its block-wise prefill cannot be replayed from a full prefill")

    def prefill(self, ctx: LayerContext) -> torch.Tensor:
        budget = ctx.budgets.reshape(-1).to(ctx.keys.device)
        n = ctx.tokens
        bs = self.block_size
        store = ctx.allocate(budget + min(bs, n))
        outs = []
        for start in range(0, n, bs):
            sl = slice(start, min(start + bs, n))
            store.append(ctx.keys[:, :, sl], ctx.values[:, :, sl], ctx.positions[:, sl], ctx.valid[:, sl])
            outs.append(store.attend(ctx.query[:, :, sl], ctx.positions[:, sl], ctx.scaling, ctx.sliding_window,
                                     ctx.softcap))
            if bool((store.lengths > budget).any()):
                store.keep_in_place(*self._keep(store, budget))
        # Decode room: grow up to the budget, then evict in place.
        limit = torch.minimum(budget, store.lengths + ctx.max_new_tokens)
        store.relayout((limit - store.lengths).clamp(min=0) + (limit == store.lengths).long())
        return torch.cat(outs, 2)

    def before_append(self, ctx: LayerContext) -> None:
        store = ctx.store
        budget = ctx.budgets.reshape(-1).to(store.lengths.device)
        full, host_full = store.at_limit(budget, ctx.host_budgets)
        if host_full.any():
            view = store.padded()
            scores = keydiff_scores(view["keys"], view["valid"], self.anchor)
            if self.recent_share > 0:
                recent = torch.round(budget.float() * self.recent_share).long()
                pos = view["positions"].masked_fill(~view["valid"], -1)
                rank = pos.argsort(1, descending=True).argsort(1)
                scores = scores.masked_fill((rank < recent[:, None] - 1) & view["valid"], float("inf"))
            store.remove(scores.argmin(1), full, host_full)
