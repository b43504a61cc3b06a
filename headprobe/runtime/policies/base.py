"""The policy interface: what to keep at prefill, what to evict while decoding.

A policy sees one layer at a time through a :class:`LayerContext`: the new tokens' tensors and budgets,
plus the only parts of the cache it may touch: its own layer's store (:class:`~headprobe.runtime.store.LayerStore`,
changed only through its verbs), the cache's shape (layers, KV heads, layer types), the decode room
``max_new_tokens``, and the state it declares (:attr:`Policy.layer_state` per layer,
:attr:`Policy.cache_state` shared by the layers of one cache). A policy that decides across layers
(DynamicKV) returns a :class:`Rebalance` from :meth:`Policy.rebalance`, which the cache applies.

The default prefill runs full causal attention over the prompt, asks :meth:`Policy.select` which tokens
each segment keeps and gathers them into the layer's store; the default decode appends the new token in
place and attends over the ragged store. Policies override only the step they change (kvpress style).
Most policies only score the prompt tokens: they derive from :class:`ScorerPolicy` and write
:meth:`ScorerPolicy.score`; the base keeps the window plus the best-scored tokens up to the budget.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np
import torch

from ...errors import HeadprobeError
from ..decode_room import decode_room
from ..prefill_attention import prefill_attention
from ..shape import CacheShape
from ..store import LayerStore, Selection


@dataclass
class LayerContext:
    """One attention call of one layer: what a policy reads and the parts of the cache it may change.

    Attributes
    ----------
    layer_idx
        Layer index.
    store
        The layer's store: empty (``store.allocated`` False) during the layer's prefill until the policy
        allocates it (:meth:`allocate`, :meth:`Policy.build_store`).
    state
        The policy's state for this layer (an instance of :attr:`Policy.layer_state`), ``None`` without one.
    shape
        Layers, KV heads and layer types of the cache.
    max_new_tokens
        Decode room the cache was made for.
    query
        ``[batch, q_heads, n, head_dim]`` post-RoPE queries of the new tokens.
    keys, values
        ``[batch, kv_heads, n, head_dim]`` keys and values of the new tokens.
    positions
        ``[batch, n]`` int64 absolute positions (negative for left padding).
    valid
        ``[batch, n]`` bool, False for padding.
    budgets
        ``[batch, kv_heads]`` int64 tokens each segment may keep (window included), as resolved for the
        prompt; the same at every call of the layer.
    host_budgets
        ``[batch * kv_heads]`` the same budgets as a host int64 array, one per segment, so that decoding
        decides on the host.
    scaling, sliding_window, softcap
        As the model's attention passes them.
    shared
        The policy's cache-wide state (an instance of :attr:`Policy.cache_state`), ``None`` without one.
    memo
        Results computed from this call's tensors alone, kept for the next cache built from the same
        recorded prompt (:mod:`headprobe.runtime.shared_prefill`): SnapKV's window scores are the same for
        every capacity and budget, so settings of one prompt score it once. ``None`` in a live prefill.
    """

    layer_idx: int
    store: LayerStore
    state: Any
    shape: CacheShape
    max_new_tokens: int
    query: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    budgets: torch.Tensor
    host_budgets: np.ndarray
    scaling: float
    sliding_window: int | None = None
    softcap: float | None = None
    shared: Any = None
    memo: dict[Any, Any] | None = None

    def memoized(self, key: Any, compute: Any) -> Any:
        """``compute()``, or what it returned for ``key`` on this recorded prompt before (see :attr:`memo`);
        the result is shared, so it is read, never written in place."""
        if self.memo is None:
            return compute()
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    @property
    def batch(self) -> int:
        return self.keys.shape[0]

    @property
    def kv_heads(self) -> int:
        return self.keys.shape[1]

    @property
    def tokens(self) -> int:
        """``n``: tokens in this call (padding included)."""
        return self.keys.shape[2]

    @property
    def prompt_lengths(self) -> torch.Tensor:
        """``[batch]`` real (unpadded) tokens in this call."""
        return self.valid.long().sum(1)

    def allocate(self, capacity: torch.Tensor, votes: bool = False) -> LayerStore:
        """Allocate the layer's store with ``capacity`` ``[segments]`` rows per segment, for pairs shaped and
        placed like :attr:`keys` (``votes``: the pairs carry KeepKV votes); returns it, empty."""
        return self.store.allocate(self.batch, self.kv_heads, self.keys.shape[-1], capacity, self.keys.dtype,
                                   self.keys.device, votes=votes)


@dataclass
class Rebalance:
    """What a policy changes in layers other than the current one, applied by the cache.

    Attributes
    ----------
    lengths
        Layer index → ``[batch * kv_heads]`` int64: that layer's segments are cut to their first ``lengths``
        pairs (the policy stored them best first).
    room
        When set, every listed layer is then re-laid out with this decode room per segment.
    """

    lengths: dict[int, torch.Tensor]
    room: int | None = None


# ---- selection helpers ---------------------------------------------------------------------------------

def prompt_prefix(lengths: torch.Tensor, n: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The window of each left-padded row and the tokens before it.

    Parameters
    ----------
    lengths
        ``[batch]`` real tokens per row (the row's last ``lengths`` of ``n`` columns).
    n
        Columns (padding included).
    window
        Recent tokens every head keeps.

    Returns
    -------
    window_tokens, prefix
        ``[batch]`` window tokens per row (``min(length, window)``) and ``[batch, n]`` bool, True for the
        real tokens before the window (the ones a policy chooses among).
    """
    w = torch.minimum(lengths, torch.full_like(lengths, window))
    idx = torch.arange(n, device=lengths.device)
    prefix = (idx[None, :] >= (n - lengths)[:, None]) & (idx[None, :] < (n - w)[:, None])
    return w, prefix


def window_and_topk(scores: torch.Tensor, budgets: torch.Tensor, lengths: torch.Tensor, window: int,
                    window_first: bool = False) -> Selection:
    """Keep the last ``window`` real tokens plus the top ``budget - window`` scored tokens before them.

    Parameters
    ----------
    scores
        ``[batch, kv_heads, n]`` token scores (higher is kept); padding and window entries are ignored.
    budgets
        ``[batch, kv_heads]`` tokens each head keeps, window included (capped at the row's length).
    lengths
        ``[batch]`` real tokens per row (left padding).
    window
        Recent tokens always kept.
    window_first
        List each head's window first, then its other tokens by decreasing score (so that cutting a head
        to its first ``k`` tokens keeps the window and the best ``k - window``), and return their scores
        in :attr:`Selection.scores`. Default: every head's tokens sorted by position.

    Returns
    -------
    Selection
        Per segment ``b * kv_heads + h``.
    """
    b, h, n = scores.shape
    dev = scores.device
    real = lengths.to(dev)
    w, prefix = prompt_prefix(real, n, window)
    budget = torch.maximum(torch.minimum(budgets.to(dev), real[:, None]), w[:, None])
    n_top = (budget - w[:, None]).clamp(min=0)                # [b, h]
    masked = scores.float().masked_fill(~prefix[:, None, :], float("-inf"))
    k_max = int(n_top.max()) if n_top.numel() else 0
    top = masked.topk(k_max, dim=-1) if k_max else None
    top_index = top.indices if top is not None else torch.zeros(b, h, 0, dtype=torch.long, device=dev)
    w_max = int(w.max())
    win = (n - w_max + torch.arange(w_max, device=dev))[None, :].expand(b, w_max)
    # Rows with a shorter window: their window entries are the last w of the w_max columns.
    win_ok = torch.arange(w_max, device=dev)[None, :] >= (w_max - w)[:, None]   # [b, w_max]
    if window_first:
        win_sorted = torch.where(win_ok, win, torch.full_like(win, n + 1)).sort(1).values
        cand = torch.cat([win_sorted[:, None, :].expand(b, h, w_max), top_index], -1)
        # Rows whose window is shorter than w_max: shift the scored part left over the gap.
        gap = (w_max - w)[:, None, None]
        pos_in = torch.arange(cand.shape[-1], device=dev)[None, None, :]
        src = torch.where(pos_in < w[:, None, None], pos_in, pos_in + gap).clamp(max=cand.shape[-1] - 1)
        cand = torch.gather(cand, 2, src.expand_as(cand))
        index = torch.where(cand > n, torch.zeros_like(cand), cand)
        top_scores = top.values if top is not None else torch.zeros(b, h, 0, device=dev)
        return Selection(index=index.reshape(b * h, -1), count=(w[:, None] + n_top).reshape(-1),
                         scores=top_scores)
    top_ok = torch.arange(k_max, device=dev)[None, None, :] < n_top[:, :, None]
    cand = torch.cat([top_index, win[:, None, :].expand(b, h, w_max)], -1)
    ok = torch.cat([top_ok, win_ok[:, None, :].expand(b, h, w_max)], -1)
    key = torch.where(ok, cand, torch.full_like(cand, n + 1))
    key, _ = key.sort(-1)
    count = ok.sum(-1)
    index = torch.where(key > n, torch.zeros_like(key), key)
    return Selection(index=index.reshape(b * h, -1), count=count.reshape(-1))


def evict_oldest(ctx: LayerContext, protect_first: int) -> None:
    """Drop the oldest pair (after the first ``protect_first`` positions) of every full segment, so that the
    new token fits; the other segments append. Needs a single new token per step."""
    store = ctx.store
    full, host_full = store.at_limit()
    if not host_full.any():
        return
    positions, valid = store.padded_positions()
    pos = positions.masked_fill(~valid, 1 << 60)
    pos = pos.masked_fill(pos < protect_first, 1 << 60)
    store.remove(pos.argmin(1), full, host_full)


def decodes_as(cls: type, owner: type) -> bool:
    """Whether ``cls`` decodes with ``owner``'s hooks (``decode``, ``before_append``, ``after_attend``), none
    overridden below it."""
    return all(getattr(cls, hook) is getattr(owner, hook) for hook in ("decode", "before_append", "after_attend"))


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
    """Refuse a ``window`` (recent tokens every head keeps) below ``minimum``."""
    if policy.window < minimum:
        raise HeadprobeError(f"policy {policy.name}: window {policy.window}: expected at least {minimum}")


def check_kernel_size(policy: Policy) -> None:
    """Refuse a pooling ``kernel_size`` that is not odd and positive: the pooled scores keep the prompt's
    length only with an odd kernel (padding ``kernel_size // 2`` on each side)."""
    k = policy.kernel_size
    if k < 1 or k % 2 == 0:
        raise HeadprobeError(f"policy {policy.name}: kernel_size {k}: expected an odd positive integer")


# ---- policies ------------------------------------------------------------------------------------------

@dataclass
class Policy:
    """Base class: keeps everything (the full-cache baseline behaves exactly like this).

    Subclasses are dataclasses; their fields are the policy options (``option=value`` pairs, checked by
    :meth:`from_options`).
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
    #: State kept per layer between calls (``ctx.state``): a class built with no arguments, or None.
    layer_state: ClassVar[type | None] = None
    #: State shared by the layers of one cache (``ctx.shared``): a class built with no arguments, or None.
    cache_state: ClassVar[type | None] = None
    #: Whether the policy scores the prompt from an observation window (its last ``window`` queries), so that
    #: setting ``window`` changes what it observes (``headprobe eval``'s question window); policies that keep
    #: recent tokens (StreamingLLM) or distinct keys (KeyDiff) whatever their ``window`` say False.
    observes_window: ClassVar[bool] = False
    window: int = 8

    def __post_init__(self) -> None:
        """Check the options; a policy with options of its own overrides this and checks its window too."""
        check_window(self, 0)

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
        return torch.full_like(kept, ctx.max_new_tokens)

    def select(self, ctx: LayerContext) -> Selection:
        """Tokens each segment keeps at the end of prefill (default: all real tokens)."""
        b, h, n = ctx.batch, ctx.kv_heads, ctx.tokens
        everything = torch.full((b, h), n, dtype=torch.long, device=ctx.keys.device)
        return window_and_topk(torch.zeros(b, h, n, device=ctx.keys.device), everything, ctx.prompt_lengths,
                               self.window)

    def prefill(self, ctx: LayerContext) -> torch.Tensor:
        """Attention output ``[batch, q_heads, n, head_dim]`` of the prompt; fills the layer's store."""
        out = prefill_attention(ctx.query, ctx.keys, ctx.values, ctx.positions, ctx.valid, ctx.scaling,
                                ctx.sliding_window, ctx.softcap)
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
        """Allocate the layer's store (the kept pairs plus the decode room of :meth:`reserve`) and gather the
        selected prompt pairs into it; returns it."""
        asked = self.reserve(ctx, selection.count)
        room = decode_room(asked, selection.count, ctx.prompt_lengths, ctx.kv_heads,
                           ctx.max_new_tokens)          # never more up front than a full cache would hold
        store = ctx.allocate(selection.count + room, votes=self.uses_votes)
        store.set_limit(selection.count + asked)        # where a constant-size policy evicts (the room regrows)
        store.write_selection(ctx.keys, ctx.values, ctx.positions, selection, log_votes)
        return store

    def rebalance(self, ctx: LayerContext) -> Rebalance | None:  # noqa: ARG002 (a policy hook's signature)
        """Cache-level hook, run by the cache once the prefill of ``ctx``'s layer is done: changes to the layers
        prefilled before it (and to this one), which the cache applies. The only way a policy changes other
        layers than its own (DynamicKV's cross-layer budgets); default: none."""
        return None

    def decode(self, ctx: LayerContext) -> torch.Tensor:
        """Attention output of the new tokens over the ragged cache; appends them first.

        Decoding reads nothing from the device: the hooks decide on the store's host mirror
        (:meth:`~headprobe.runtime.store.LayerStore.at_limit`, ``host_lengths``) and
        :attr:`LayerContext.host_budgets`, and write densely. The new tokens follow the prompt, so none of
        them is padding (``ctx.valid`` is all True) and they are appended without a mask.
        """
        self.before_append(ctx)
        ctx.store.append(ctx.keys, ctx.values, ctx.positions)
        out = ctx.store.attend(ctx.query, ctx.positions, ctx.scaling, ctx.sliding_window, ctx.softcap)
        self.after_attend(ctx)
        return out

    def decode_group(self) -> tuple[Any, ...] | None:
        """What decoding does to a cache, as a key: rows of caches whose policies give equal keys decode in
        one batch (:func:`headprobe.runtime.settings_batch.generate_settings`), each exactly as alone.

        Default: the base's decode (append the new token, attend) with no per-layer state or votes, which
        any per-head budgets share: ``("append",)``. A policy that overrides a decode hook gives its own key,
        or ``None`` (its rows decode alone).
        """
        if self.uses_votes or self.layer_state is not None or not decodes_as(type(self), Policy):
            return None
        return ("append",)

    def before_append(self, ctx: LayerContext) -> None:
        """Evict before the new tokens are written (policies with a constant-size cache). Decide on the host
        (no ``bool(tensor)``, ``.item()`` or boolean-mask indexing of device tensors)."""

    def after_attend(self, ctx: LayerContext) -> None:
        """Update per-pair statistics after the new tokens attended (same rule as :meth:`before_append`)."""


@dataclass
class ScorerPolicy(Policy):
    """Score the prompt tokens; keep the window plus the best-scored ``budget - window`` tokens before it.

    A subclass writes :meth:`score` (and may override :meth:`token_budgets`); selection, storage, decode
    room and decoding come from the base. See ``docs/runtime.md``, "Adding a policy".
    """

    def score(self, ctx: LayerContext) -> torch.Tensor:
        """``[batch, kv_heads, n]`` score of every prompt token; higher is kept. Padding and window tokens
        are ignored whatever their score."""
        raise NotImplementedError

    def token_budgets(self, ctx: LayerContext, scores: torch.Tensor) -> torch.Tensor:  # noqa: ARG002 (a policy hook's signature)
        """``[batch, kv_heads]`` tokens each head keeps, window included (default: the resolved budgets)."""
        return ctx.budgets

    def select(self, ctx: LayerContext) -> Selection:
        scores = self.score(ctx)
        return window_and_topk(scores, self.token_budgets(ctx, scores), ctx.prompt_lengths, self.window)
