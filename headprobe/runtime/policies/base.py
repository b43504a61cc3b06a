"""The policy interface: what to keep at prefill, what to evict while decoding.

A policy sees one layer at a time through a context. The default prefill runs full causal attention over
the prompt, asks :meth:`Policy.select` which tokens each segment keeps and gathers them into the layer's
store; the default decode appends the new token in place and attends over the ragged store. Policies
override only the step they change (kvpress style).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F

from ...errors import HeadprobeError
from ..kernels.dispatch import ragged_attention
from ..store import LayerStore, Selection

if TYPE_CHECKING:  # pragma: no cover
    from ..cache import CompressedCache


@dataclass
class LayerContext:
    """One attention call of one layer.

    Attributes
    ----------
    cache
        The :class:`~headprobe.runtime.cache.CompressedCache`.
    layer_idx
        Layer index.
    query
        ``[batch, q_heads, n, head_dim]`` post-RoPE queries of the new tokens.
    keys, values
        ``[batch, kv_heads, n, head_dim]`` keys and values of the new tokens.
    positions
        ``[batch, n]`` int64 absolute positions (negative for left padding).
    valid
        ``[batch, n]`` bool, False for padding.
    budgets
        ``[batch, kv_heads]`` int64 tokens each segment may keep (window included); prefill only.
    scaling, sliding_window, softcap
        As the model's attention passes them.
    """

    cache: CompressedCache
    layer_idx: int
    query: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    budgets: torch.Tensor | None
    scaling: float
    sliding_window: int | None = None
    softcap: float | None = None

    @property
    def store(self) -> LayerStore | None:
        return self.cache.stores[self.layer_idx]

    @property
    def batch(self) -> int:
        return self.keys.shape[0]

    @property
    def kv_heads(self) -> int:
        return self.keys.shape[1]

    @property
    def prompt_lengths(self) -> torch.Tensor:
        """``[batch]`` real (unpadded) tokens in this call."""
        return self.valid.long().sum(1)


def prefill_attention(ctx: LayerContext) -> torch.Tensor:
    """Full causal attention over the prompt (padding and sliding window respected).

    Returns ``[batch, q_heads, n, head_dim]``.
    """
    q, k, v = ctx.query, ctx.keys, ctx.values
    n = q.shape[2]
    padded = not bool(ctx.valid.all())
    if not padded and not ctx.sliding_window and not ctx.softcap:
        return F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), is_causal=n > 1,
                                              scale=ctx.scaling, enable_gqa=True)
    qp, kp = ctx.positions[:, :, None], ctx.positions[:, None, :]
    allowed = (kp <= qp) & ctx.valid[:, None, :]
    if ctx.sliding_window:
        allowed &= qp - kp < ctx.sliding_window
    allowed |= torch.eye(n, dtype=torch.bool, device=q.device)[None]  # padding rows see themselves
    if ctx.softcap:
        g = q.shape[1] // k.shape[1]
        kr, vr = k.repeat_interleave(g, 1).float(), v.repeat_interleave(g, 1).float()
        logits = torch.matmul(q.float(), kr.transpose(-1, -2)) * ctx.scaling
        logits = ctx.softcap * torch.tanh(logits / ctx.softcap)
        logits = logits.masked_fill(~allowed[:, None], float("-inf"))
        return torch.matmul(torch.softmax(logits, -1), vr).to(q.dtype)
    return F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=allowed[:, None],
                                          scale=ctx.scaling, enable_gqa=True)


def window_and_topk(scores: torch.Tensor, ctx: LayerContext, window: int) -> Selection:
    """Keep the last ``window`` real tokens plus the top ``budget - window`` scored tokens before them.

    Parameters
    ----------
    scores
        ``[batch, kv_heads, n]`` token scores (higher is kept); padding and window entries are ignored.
    ctx
        The prefill context (``budgets``, ``valid``).
    window
        Recent tokens always kept.

    Returns
    -------
    Selection
        Per segment ``b * kv_heads + h``: indices sorted by position.
    """
    b, h, n = scores.shape
    real = ctx.prompt_lengths                                 # [b]
    pad = n - real
    w = torch.minimum(real, torch.full_like(real, window))    # window tokens per row
    budget = torch.minimum(ctx.budgets.to(scores.device), real[:, None])  # [b, h]
    budget = torch.maximum(budget, w[:, None])
    n_top = (budget - w[:, None]).clamp(min=0)                # [b, h]
    idx = torch.arange(n, device=scores.device)
    prefix = (idx[None, :] >= pad[:, None]) & (idx[None, :] < (n - w)[:, None])   # [b, n]
    masked = scores.float().masked_fill(~prefix[:, None, :], float("-inf"))
    k_max = int(n_top.max()) if n_top.numel() else 0
    top = masked.topk(k_max, dim=-1).indices if k_max else torch.zeros(b, h, 0, dtype=torch.long,
                                                                         device=scores.device)
    w_max = int(w.max())
    win = (n - w_max + torch.arange(w_max, device=scores.device))[None, None, :].expand(b, h, w_max)
    # Rows with a shorter window: shift their window entries to the row's own window.
    win_ok = torch.arange(w_max, device=scores.device)[None, :] >= (w_max - w)[:, None]   # [b, w_max]
    ar = torch.arange(k_max, device=scores.device)
    top_ok = ar[None, None, :] < n_top[:, :, None]
    cand = torch.cat([top, win], -1)
    ok = torch.cat([top_ok, win_ok[:, None, :].expand(b, h, w_max)], -1)
    key = torch.where(ok, cand, torch.full_like(cand, n + 1))
    key, _ = key.sort(-1)
    count = ok.sum(-1)
    index = torch.where(key > n, torch.zeros_like(key), key)
    return Selection(index=index.reshape(b * h, -1), count=count.reshape(-1))


def _check_type(policy: str, key: str, value: Any, default: Any) -> None:
    """Refuse an option value of the wrong kind (``window=8.5``, ``adaptive=yes``) in one line."""
    if isinstance(default, bool):
        ok, want = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, float):
        ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    elif isinstance(default, str):
        ok, want = isinstance(value, str), "a string"
    else:
        return
    if not ok:
        raise HeadprobeError(f"policy {policy}: option {key}={value!r}: expected {want}")


def check_window(policy: Policy, minimum: int = 1) -> None:
    if policy.window < minimum:
        raise HeadprobeError(f"policy {policy.name}: window {policy.window}: expected at least {minimum}")


@dataclass
class Policy:
    """Base class: keeps everything (the full-cache baseline behaves exactly like this).

    Subclasses are dataclasses; their fields are the policy options (``headprobe generate --option``).
    """

    name: ClassVar[str] = "base"
    #: Whether stored pairs carry KeepKV votes.
    uses_votes: ClassVar[bool] = False
    #: Whether the policy reads per-head budgets (``full`` does not).
    uses_budgets: ClassVar[bool] = True
    #: Whether the prompt's forward pass is plain causal attention whatever the policy keeps, so that one
    #: recorded prefill can serve many settings (:mod:`headprobe.runtime.shared_prefill`). KeyDiff's
    #: block-wise prefill changes the forward itself and sets this to False.
    full_prefill: ClassVar[bool] = True
    window: int = 8

    # ---- options ---------------------------------------------------------------------------------

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in fields(cls)] if hasattr(cls, "__dataclass_fields__") else []

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> Policy:
        """Build the policy, refusing options it does not have (one clear line)."""
        names = cls.option_names()
        defaults = {f.name: f.default for f in fields(cls)} if names else {}
        for key, value in options.items():
            if key not in names:
                have = ", ".join(names) or "none"
                raise HeadprobeError(f"policy {cls.name}: option {key!r} does not apply (options: {have})")
            _check_type(cls.name, key, value, defaults[key])
        return cls(**options)

    # ---- hooks -----------------------------------------------------------------------------------

    def reserve(self, ctx: LayerContext, kept: torch.Tensor) -> torch.Tensor:
        """Slots preallocated per segment after prefill for decoding; ``kept`` is ``[segments]``."""
        return torch.full_like(kept, ctx.cache.max_new_tokens)

    def select(self, ctx: LayerContext) -> Selection:
        """Tokens each segment keeps at the end of prefill (default: all real tokens)."""
        b, h, n = ctx.batch, ctx.kv_heads, ctx.keys.shape[2]
        everything = replace(ctx, budgets=torch.full((b, h), n, dtype=torch.long, device=ctx.keys.device))
        return window_and_topk(torch.zeros(b, h, n, device=ctx.keys.device), everything, self.window)

    def prefill(self, ctx: LayerContext) -> torch.Tensor:
        """Attention output ``[batch, q_heads, n, head_dim]`` of the prompt; fills the layer's store."""
        out = prefill_attention(ctx)
        self.compress(ctx)
        return out

    def compress(self, ctx: LayerContext) -> None:
        """Fill the layer's store from the prompt's pairs: everything prefill does after the attention.

        Policies with ``full_prefill`` put all their prefill-time work here, so that a recorded prefill
        replayed layer by layer (:mod:`headprobe.runtime.shared_prefill`) builds the same store.
        """
        self.build_store(ctx, self.select(ctx))

    def build_store(self, ctx: LayerContext, selection: Selection,
                    log_votes: torch.Tensor | None = None) -> LayerStore:
        capacity = selection.count + self.reserve(ctx, selection.count)
        store = LayerStore(ctx.batch, ctx.kv_heads, ctx.keys.shape[-1], capacity, ctx.keys.dtype,
                           ctx.keys.device, votes=self.uses_votes)
        store.write_selection(ctx.keys, ctx.values, ctx.positions, selection, log_votes)
        ctx.cache.stores[ctx.layer_idx] = store
        return store

    def decode(self, ctx: LayerContext) -> torch.Tensor:
        """Attention output of the new tokens over the ragged cache; appends them first."""
        self.before_append(ctx)
        ctx.store.append(ctx.keys, ctx.values, ctx.positions, ctx.valid)
        out = ragged_attention(ctx.query, ctx.store, ctx.positions, ctx.scaling, ctx.sliding_window, ctx.softcap)
        self.after_attend(ctx)
        return out

    def before_append(self, ctx: LayerContext) -> None:
        """Evict before the new tokens are written (policies with a constant-size cache)."""

    def after_attend(self, ctx: LayerContext) -> None:
        """Update per-pair statistics after the new tokens attended."""
