"""``dynamickv``: progressive per-layer budgets decided during prefill.

Per layer: SnapKV scores (window ``window``, pooling ``kernel_size``); each head keeps for now the window
plus its top ``min(r_max · B, n - window)`` tokens (``B = capacity - window``), stored window first and
then by decreasing score so that cutting a head to ``k`` tokens is setting its length. Every ``interval``
cached layers, and at the last one whatever ``layers mod interval`` is, the global top ``B · H · t`` over
the scores held by the ``t`` layers so far decides each layer's share (winners counted per layer); the
shares are split over the layer's heads, clamped to what each head holds (never reaching into the window)
with the excess redistributed, and the earlier layers are cut in place. After the last layer every layer
is re-laid out tightly with its decode room. The budgets of all layers sum exactly to ``B · H · L`` per
prompt (or to everything the prompt holds when it is shorter). With a budget map instead of a capacity,
``B`` is each head's own budget beyond the window and the layers share the map's total the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from ...allocation.clamp import split_with_caps
from ...errors import HeadprobeError
from ..store import LayerStore, Selection
from .base import LayerContext, ScorerPolicy, check_kernel_size, check_window, prompt_prefix
from .snapkv import window_scores


@dataclass
class HeldLayer:
    """A layer whose heads hold their temporary top tokens until the next rebalance.

    Attributes
    ----------
    store
        The layer's store: per head the window, then the prefix by decreasing score.
    scores
        ``[batch, kv_heads, k]`` the held prefix tokens' scores, decreasing.
    window
        ``[batch]`` window tokens per row.
    base
        ``[batch, kv_heads]`` each head's own budget beyond the window (``B``).
    """

    store: LayerStore
    scores: torch.Tensor
    window: torch.Tensor
    base: torch.Tensor


@dataclass
class DynamicKVState:
    """The cached layers seen so far in the current prefill (shared by the layers of one cache)."""

    layers: list[HeldLayer] = field(default_factory=list)


@dataclass
class DynamicKV(ScorerPolicy):
    """DynamicKV with the update interval ``interval`` (m) and ``r_max`` as parameters."""

    name: ClassVar[str] = "dynamickv"
    cache_state: ClassVar[type] = DynamicKVState
    window: int = 8
    kernel_size: int = 7
    r_max: int = 10
    interval: int = 4

    def __post_init__(self) -> None:
        check_window(self)
        check_kernel_size(self)
        if self.interval < 1 or self.r_max < 1:
            raise HeadprobeError("policy dynamickv: interval and r_max must be at least 1")

    def score(self, ctx: LayerContext) -> torch.Tensor:
        return window_scores(ctx, self.window, self.kernel_size)

    def compress(self, ctx: LayerContext) -> None:
        b, h, n = ctx.batch, ctx.kv_heads, ctx.tokens
        dev = ctx.keys.device
        scores = self.score(ctx)                                          # [b, h, n]
        real = ctx.prompt_lengths
        w, prefix = prompt_prefix(real, n, self.window)
        base = (ctx.budgets.to(dev) - w[:, None]).clamp(min=0)           # B per head: the capacity, or the budget map's head budget
        hold = torch.minimum(base * self.r_max, (real - w)[:, None])      # [b, h]
        masked = scores.float().masked_fill(~prefix[:, None, :], float("-inf"))
        k_max = int(hold.max()) if hold.numel() else 0
        top = masked.topk(k_max, dim=-1) if k_max else None
        w_max = int(w.max())
        win = (n - w_max + torch.arange(w_max, device=dev))[None, :].expand(b, w_max)
        win_ok = torch.arange(w_max, device=dev)[None, :] >= (w_max - w)[:, None]
        # Window first (left-aligned per row), then the prefix by decreasing score.
        win_sorted = torch.where(win_ok, win, torch.full_like(win, n + 1)).sort(1).values
        cand = torch.cat([win_sorted[:, None, :].expand(b, h, w_max),
                          top.indices if top is not None else torch.zeros(b, h, 0, dtype=torch.long, device=dev)], -1)
        # Rows whose window is shorter than w_max: shift the prefix part left over the gap.
        gap = (w_max - w)[:, None, None]
        pos_in = torch.arange(cand.shape[-1], device=dev)[None, None, :]
        src = torch.where(pos_in < w[:, None, None], pos_in, pos_in + gap).clamp(max=cand.shape[-1] - 1)
        cand = torch.gather(cand, 2, src.expand_as(cand))
        count = w[:, None] + hold
        index = torch.where(cand > n, torch.zeros_like(cand), cand)
        store = self.build_store(ctx, Selection(index=index.reshape(b * h, -1), count=count.reshape(-1)))
        state: DynamicKVState = ctx.shared
        sorted_scores = top.values if top is not None else torch.zeros(b, h, 0, device=dev)
        state.layers.append(HeldLayer(store, sorted_scores, w, base))
        last = ctx.layer_idx == ctx.shape.cached_layers[-1]
        if len(state.layers) % self.interval == 0 or last:
            self._rebalance(state.layers)
        if last:
            for held in state.layers:
                held.store.relayout(torch.full_like(held.store.lengths, ctx.max_new_tokens))
            state.layers.clear()

    def reserve(self, ctx, kept):
        return torch.zeros_like(kept)

    def _rebalance(self, layers: list[HeldLayer]) -> None:
        """Global top-k over the held scores of the layers so far; cut every one of them in place."""
        t = len(layers)
        b, h = layers[0].scores.shape[:2]
        for row in range(b):
            held = []
            for entry in layers:
                lengths = entry.store.lengths.reshape(b, h)[row] - entry.window[row]
                sc = entry.scores[row].clone()                                # [h, k]
                ar = torch.arange(sc.shape[1], device=sc.device)
                sc = sc.masked_fill(ar[None, :] >= lengths[:, None], float("-inf"))
                held.append((lengths, sc))
            # The layers may live on different devices (accelerate's device_map): rank them on the first's.
            device = held[0][1].device
            flat = torch.cat([sc.reshape(-1).to(device) for _, sc in held])
            finite = int(torch.isfinite(flat).sum())
            # Σ of the layers' own budgets beyond the window: B·H·t for a uniform capacity, the budget
            # file's totals for a map (each layer's heads may differ).
            total = min(sum(int(entry.base[row].sum()) for entry in layers), finite)
            owner = torch.cat([torch.full((sc.numel(),), i, dtype=torch.long) for i, (_, sc) in enumerate(held)])
            counts = np.zeros(t)
            if total:
                winners = flat.topk(total).indices.cpu()
                counts = np.bincount(owner[winners].numpy(), minlength=t).astype(np.float64)
            caps = torch.stack([lengths.cpu() for lengths, _ in held]).numpy().astype(np.int64)   # [t, h]
            weights = np.repeat(counts[:, None] / h, h, axis=1)
            shares = split_with_caps(total, weights, caps)
            for i, entry in enumerate(layers):
                seg = slice(row * h, (row + 1) * h)
                lengths = entry.store.lengths.clone()
                lengths[seg] = entry.window[row] + torch.from_numpy(shares[i]).to(lengths.device)
                entry.store.set_lengths(lengths)
