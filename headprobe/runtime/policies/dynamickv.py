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

from ...budget_arithmetic import split_with_caps
from ...errors import HeadprobeError
from .base import (
    LayerContext,
    Rebalance,
    ScorerPolicy,
    check_kernel_size,
    check_window,
    prompt_prefix,
    window_and_topk,
)
from .snapkv import window_scores


@dataclass
class HeldLayer:
    """A layer whose heads hold their temporary top tokens until the next rebalance.

    Attributes
    ----------
    layer_idx
        The layer.
    lengths
        ``[batch * kv_heads]`` what each of its heads holds: the window, then the prefix by decreasing score.
    scores
        ``[batch, kv_heads, k]`` the held prefix tokens' scores, decreasing.
    window
        ``[batch]`` window tokens per row.
    base
        ``[batch, kv_heads]`` each head's own budget beyond the window (``B``).
    """

    layer_idx: int
    lengths: torch.Tensor
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
    observes_window: ClassVar[bool] = True
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
        """Hold the window plus the top ``min(r_max · B, n - window)`` tokens per head, best first."""
        real = ctx.prompt_lengths
        w, _ = prompt_prefix(real, ctx.tokens, self.window)
        base = (ctx.budgets.to(ctx.keys.device) - w[:, None]).clamp(min=0)   # B per head: the capacity, or the map's
        selection = window_and_topk(self.score(ctx), w[:, None] + base * self.r_max, real, self.window,
                                    window_first=True)
        self.build_store(ctx, selection)
        state: DynamicKVState = ctx.shared
        state.layers.append(HeldLayer(ctx.layer_idx, selection.count.clone(), selection.scores, w, base))

    def reserve(self, ctx, kept):  # noqa: ARG002 (a policy hook's signature)
        return torch.zeros_like(kept)

    def rebalance(self, ctx: LayerContext) -> Rebalance | None:
        """Every ``interval`` cached layers and at the last one: cut the held layers to their shares; after
        the last one, give every layer its decode room."""
        state: DynamicKVState = ctx.shared
        last = ctx.layer_idx == ctx.shape.cached_layers[-1]
        if len(state.layers) % self.interval and not last:
            return None
        _cut(state.layers)
        lengths = {held.layer_idx: held.lengths for held in state.layers}
        if not last:
            return Rebalance(lengths)
        state.layers.clear()
        return Rebalance(lengths, room=ctx.max_new_tokens)


def _cut(layers: list[HeldLayer]) -> None:
    """Global top-k over the held scores of the layers so far; sets every held layer's new lengths."""
    t = len(layers)
    b, h = layers[0].scores.shape[:2]
    for row in range(b):
        held = []
        for entry in layers:
            lengths = entry.lengths.reshape(b, h)[row] - entry.window[row]
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
            lengths = entry.lengths.clone()
            lengths[seg] = entry.window[row] + torch.from_numpy(shares[i]).to(lengths.device)
            entry.lengths = lengths
