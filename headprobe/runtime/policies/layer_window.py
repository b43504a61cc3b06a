"""``layer_window``: each layer attends as a serving engine's sliding-window layer does.

A layer whose budget is ``W`` tokens per head attends, for every query (prompt and decode alike), the first
``sink`` tokens and the last ``W - sink`` (the query itself included), and keeps exactly those: vLLM's and
llama.cpp's sliding window (``sink = 0``: the last ``W``), TensorRT-LLM's ``max_attention_window`` with
``sink_token_length``. A budget at least the prompt plus the new tokens is a global layer: every token.
With a layer split (:class:`~headprobe.runtime.split_budget.SplitBudget`) local layers get their window and
global layers everything; with a uniform capacity every layer is local at that window.

Unlike ``streaming``, the prompt itself is attended through the window (the engine's prefill is windowed
too), so hidden states past a local layer are those the engine computes; a recorded full prefill cannot
stand in for it (``full_prefill = False``). The model's own sliding layers (Gemma 3) are served by this
policy too, at their budget or their own window, whichever is smaller (``serves_sliding_layers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from ...attention.rows import masked_attention
from ...errors import HeadprobeError
from .base import LayerContext
from .streaming import Streaming


def window_mask(positions: torch.Tensor, valid: torch.Tensor, windows: torch.Tensor, sink: int) -> torch.Tensor:
    """``[batch, n, n]`` bool: key ``j`` visible to query ``i`` when causal, not padding, and either among
    the first ``sink`` positions or within the last ``windows[b] - sink`` tokens up to ``i``.

    Parameters
    ----------
    positions, valid
        ``[batch, n]`` absolute positions (negative for left padding) and False for padding.
    windows
        ``[batch]`` tokens a query attends, sink included.
    """
    n = positions.shape[1]
    qp, kp = positions[:, :, None], positions[:, None, :]
    recent = (windows - sink).to(positions.device)[:, None, None]
    visible = (kp <= qp) & valid[:, None, :] & ((qp - kp < recent) | (kp < sink))
    return visible | torch.eye(n, dtype=torch.bool, device=positions.device)[None]


def window_attention(ctx: LayerContext, windows: torch.Tensor, sink: int) -> torch.Tensor:
    """``[batch, q_heads, n, head_dim]`` the prompt attending through :func:`window_mask`."""
    visible = window_mask(ctx.positions, ctx.valid, windows, sink)
    q = ctx.query
    k, v = ctx.keys.to(q.dtype), ctx.values.to(q.dtype)
    if ctx.softcap:
        return masked_attention(q, k, v, visible[:, None], ctx.scaling, softcap=ctx.softcap)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible[:, None], scale=ctx.scaling)


def layer_windows(budgets: torch.Tensor, layer_idx: int, sliding_window: int | None, sink: int) -> torch.Tensor:
    """``[batch]`` a layer's window per row from its budgets ``[batch, kv_heads]``: the heads must share one (an
    engine's window is per layer), a model's own sliding layer keeps at most its own window, and the window must
    exceed the sink.

    Raises
    ------
    HeadprobeError
        Heads of the layer with different budgets, or a window no larger than the sink.
    """
    windows = budgets.max(dim=1).values
    if bool((budgets.min(dim=1).values != windows).any()):
        raise HeadprobeError(f"policy layer_window: layer {layer_idx} has different budgets per head; an "
                             "engine's window is one per layer (use a layer split or a capacity)")
    if sliding_window:                        # the model's own sliding layer: at most its own window
        windows = windows.clamp(max=int(sliding_window))
    if int(windows.min()) <= sink:
        raise HeadprobeError(f"policy layer_window: layer {layer_idx} keeps {int(windows.min())} tokens, "
                             f"not more than the sink ({sink})")
    return windows


@dataclass
class LayerWindow(Streaming):
    """Per layer: the first ``sink`` and the last ``budget - sink`` tokens, in prefill and decode alike."""

    name: ClassVar[str] = "layer_window"
    full_prefill: ClassVar[bool] = False
    #: The model's own sliding-window layers run under this policy too (at their budget).
    serves_sliding_layers: ClassVar[bool] = True
    sink: int = 0
    window: int = 0

    def layer_windows(self, ctx: LayerContext) -> torch.Tensor:
        """``[batch]`` this layer's window per row (its heads share one: the engine's window is per layer)."""
        return layer_windows(ctx.budgets, ctx.layer_idx, ctx.sliding_window, self.sink)

    def token_budgets(self, ctx: LayerContext, scores: torch.Tensor) -> torch.Tensor:  # noqa: ARG002 (a policy hook's signature)
        """``[batch, kv_heads]`` the layer's window for every head (the budget, capped at a sliding layer's own)."""
        return self.layer_windows(ctx)[:, None].expand(-1, ctx.kv_heads)

    def head_limits(self, ctx: LayerContext) -> torch.Tensor:
        """``[batch * kv_heads]`` the layer's window for every head (:meth:`Streaming.reserve` grows up to it)."""
        return self.token_budgets(ctx, ctx.budgets).reshape(-1)

    def prefill(self, ctx: LayerContext) -> torch.Tensor:
        out = window_attention(ctx, self.layer_windows(ctx), self.sink)
        self.compress(ctx)
        return out

    def decode(self, ctx: LayerContext) -> torch.Tensor:
        """Evict the oldest non-sink pair of a full head, append, attend over what the head holds."""
        self.before_append(ctx)
        ctx.store.append(ctx.keys, ctx.values, ctx.positions)
        out = ctx.store.attend(ctx.query, ctx.positions, ctx.scaling, None, ctx.softcap)
        self.after_attend(ctx)
        return out
