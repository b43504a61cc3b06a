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
from ...errors import HeadprobeError
from .base import LayerContext, ScorerPolicy, check_kernel_size, check_window, prompt_prefix


def window_scores(ctx: LayerContext, window: int, kernel_size: int, pooling: str = "max") -> torch.Tensor:
    """``[batch, kv_heads, n]`` SnapKV scores of every prompt token (GQA group mean).

    Window rows are the last ``window`` queries; padding keys get no attention. As in SnapKV's and HeadKV's
    code (and kvpress's ``SnapKVPress``), the tokens before the window are pooled among themselves: the
    window's columns are cut off before pooling, so they do not raise the scores of the last tokens before
    it. The window's own columns hold their unpooled mean attention (every policy keeps the window).
    """
    return ctx.memoized(("window_scores", window, kernel_size, pooling),
                        lambda: _window_scores(ctx, window, kernel_size, pooling))


def _window_scores(ctx: LayerContext, window: int, kernel_size: int, pooling: str) -> torch.Tensor:
    n = ctx.tokens
    w = min(window, n)
    rows = attention_rows(ctx.query[:, :, n - w:], ctx.keys, ctx.positions[:, n - w:], ctx.scaling,
                          key_positions=ctx.positions, sliding_window=ctx.sliding_window, softcap=ctx.softcap,
                          key_mask=ctx.valid)
    prefix = pooled_window_scores(rows, n - w, kernel_size, pooling)              # [b, q_heads, n - w]
    scores = torch.cat([prefix, rows[..., n - w:n].float().mean(dim=-2)], dim=-1)  # [b, q_heads, n]
    b, hq, _ = scores.shape
    return scores.reshape(b, ctx.kv_heads, hq // ctx.kv_heads, n).mean(2)


def adaptive_budgets(scores: torch.Tensor, ctx: LayerContext, window: int, floor_share: float,
                     floor_of: str = "prefix") -> torch.Tensor:
    """AdaKV-style online split of a layer's budget over its heads: ``[batch, kv_heads]``.

    Every head first keeps ``floor_share`` of its own budget (its best tokens); the rest of the layer's
    total goes to the best-scored remaining tokens of any head (one top-k over the layer). The layer's
    total is unchanged.

    ``floor_of`` says what the share is of: ``"prefix"``, the head's budget beyond the window (the
    window is kept besides); ``"budget"``, the head's whole budget with the window counted inside it
    (kvpress's ``AdaKVPress``: ``int(n_kept · alpha_safeguard)`` positions, the window among them).
    """
    b, h, n = scores.shape
    real = ctx.prompt_lengths
    w, prefix = prompt_prefix(real, n, window)
    masked = scores.float().masked_fill(~prefix[:, None, :], float("-inf"))
    whole = torch.minimum(ctx.budgets.to(scores.device), real[:, None])                            # [b, h]
    own = (whole - w[:, None]).clamp(min=0)
    if floor_of == "budget":
        floor = torch.minimum((torch.floor(whole.float() * floor_share).long() - w[:, None]).clamp(min=0), own)
    else:
        floor = torch.floor(own.float() * floor_share).long()
    rank = masked.argsort(-1, descending=True).argsort(-1)                 # 0 = best of the head
    rest = masked.masked_fill(rank < floor[:, :, None], float("-inf")).reshape(b, h * n)
    pool = own.sum(1) - floor.sum(1)                                        # [b]
    out = floor.clone()
    for row in range(b):
        k = min(int(pool[row]), int(torch.isfinite(rest[row]).sum()))
        if k > 0:
            winners = rest[row].topk(k).indices // n
            out[row] += torch.bincount(winners, minlength=h)
    return out + w[:, None]


@dataclass
class SnapKV(ScorerPolicy):
    """HeadKV / SnapKV selection (window 8, max-pool 7) with any budget map.

    With ``adaptive=True`` each layer's budget is re-split over its heads online (AdaKV-style,
    :func:`adaptive_budgets`), keeping ``floor_share`` of every head's budget as a safeguard.
    """

    name: ClassVar[str] = "snapkv"
    observes_window: ClassVar[bool] = True
    window: int = 8
    kernel_size: int = 7
    pooling: str = "max"
    adaptive: bool = False
    floor_share: float = 0.2
    floor_of: str = "prefix"

    def __post_init__(self) -> None:
        check_window(self)
        if self.pooling not in ("max", "avg"):
            raise HeadprobeError(f"policy snapkv: pooling {self.pooling!r}: expected max or avg")
        check_kernel_size(self)
        if not 0.0 <= self.floor_share <= 1.0:
            raise HeadprobeError(f"policy snapkv: floor_share {self.floor_share}: expected a value in [0, 1]")
        if self.floor_of not in ("prefix", "budget"):
            raise HeadprobeError(f"policy snapkv: floor_of {self.floor_of!r}: expected prefix (the budget beyond "
                                 "the window) or budget (the whole budget, window included, as kvpress's AdaKVPress)")

    def score(self, ctx: LayerContext) -> torch.Tensor:
        return window_scores(ctx, self.window, self.kernel_size, self.pooling)

    def token_budgets(self, ctx: LayerContext, scores: torch.Tensor) -> torch.Tensor:
        if self.adaptive:
            return adaptive_budgets(scores, ctx, self.window, self.floor_share, self.floor_of)
        return ctx.budgets
