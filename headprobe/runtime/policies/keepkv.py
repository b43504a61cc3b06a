"""``keepkv``: eviction with merging and electoral votes.

Every stored pair carries votes ``p`` (``log p`` is added to its attention logit). The prompt is cut with
SnapKV's selection; each evicted pair merges into the retained pair of the same KV head with the highest
key cosine similarity when it is at least ``threshold``, else it is dropped (:mod:`.merge`). While
decoding, a full head evicts its lowest-scored pair (estimated ``p · s``, outside the recent window) the
same way. Scores are estimated per pair from the logits the queries give it: an exponential moving average
(``ema``) or the mean over the last ``score_window`` steps (``window_mean``). ``key_merge`` defaults to
``convex``, chosen by measurement on SmolLM2 (``docs/benchmarks.md``, "KeepKV key merge"): it kept the
most needle accuracy at capacity 128 (0.21 against 0.18 for ``values_only`` and 0.06 for the paper's
``zip``, which is exact for one step but loses accuracy over many merges), with the three tied within
noise on long generation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from ...errors import HeadprobeError
from ..store import LayerStore
from .base import LayerContext, ScorerPolicy, check_kernel_size, check_window
from .merge import KEY_MERGES, merge_groups, most_similar
from .snapkv import window_scores


@dataclass
class KeepKVState:
    """Decoding steps of a layer (the ring slot of the ``window_mean`` score estimator)."""

    step: int = 0


@dataclass
class KeepKV(ScorerPolicy):
    """KeepKV merging on top of SnapKV eviction, with any budget map."""

    name: ClassVar[str] = "keepkv"
    observes_window: ClassVar[bool] = True
    uses_votes: ClassVar[bool] = True
    layer_state: ClassVar[type] = KeepKVState
    window: int = 8
    threshold: float = 0.8
    key_merge: str = "convex"
    score_estimator: str = "ema"
    ema_decay: float = 0.9
    score_window: int = 8
    kernel_size: int = 7

    def __post_init__(self) -> None:
        check_window(self)
        if self.key_merge not in KEY_MERGES:
            raise HeadprobeError(f"policy keepkv: key_merge {self.key_merge!r}: expected one of {', '.join(KEY_MERGES)}")
        if self.score_estimator not in ("ema", "window_mean"):
            raise HeadprobeError(f"policy keepkv: score_estimator {self.score_estimator!r}: expected ema or window_mean")
        if not -1.0 <= self.threshold <= 1.0:
            raise HeadprobeError(f"policy keepkv: threshold {self.threshold}: expected a cosine in [-1, 1]")
        if not 0.0 <= self.ema_decay < 1.0:
            raise HeadprobeError(f"policy keepkv: ema_decay {self.ema_decay}: expected a value in [0, 1)")
        if self.score_window < 1:
            raise HeadprobeError(f"policy keepkv: score_window {self.score_window}: expected at least 1")
        check_kernel_size(self)

    # ---- prefill -----------------------------------------------------------------------------------

    def score(self, ctx: LayerContext) -> torch.Tensor:
        return window_scores(ctx, self.window, self.kernel_size)

    def _window_logits(self, ctx: LayerContext) -> torch.Tensor:
        """``[b, kv, n]`` mean logit the last ``window`` queries give each token (GQA group mean)."""
        n = ctx.tokens
        w = min(max(self.window, 1), n)
        q = ctx.query[:, :, n - w:].float()
        b, hq, _, d = q.shape
        g = hq // ctx.kv_heads
        logits = torch.einsum("bkgwd,bknd->bkgwn", q.reshape(b, ctx.kv_heads, g, w, d), ctx.keys.float())
        return logits.mean((2, 3)) * ctx.scaling

    def compress(self, ctx: LayerContext) -> None:
        sel = self.select(ctx)
        b, h, n, d = ctx.keys.shape
        s = b * h
        keys = ctx.keys.reshape(s, n, d)
        values = ctx.values.reshape(s, n, d)
        logits = self._window_logits(ctx).reshape(s, n)
        k = sel.index.shape[1]
        ar = torch.arange(k, device=keys.device)
        kept_valid = ar[None, :] < sel.count[:, None]
        kept = torch.zeros(s, n, dtype=torch.bool, device=keys.device)
        kept.scatter_(1, sel.index, kept_valid)
        evicted = ctx.valid[:, None, :].expand(b, h, n).reshape(s, n) & ~kept
        cand = torch.gather(keys, 1, sel.index[..., None].expand(s, k, d))
        sim, which = most_similar(keys, cand, kept_valid)
        join = evicted & (sim >= self.threshold)
        target = torch.where(join, torch.gather(sel.index, 1, which), torch.arange(n, device=keys.device)[None, :])
        new_k, new_v, new_lnp, new_l = merge_groups(keys, values, torch.zeros(s, n, device=keys.device), logits,
                                                    target, join | kept, self.key_merge)
        merged_ctx = replace(ctx, keys=new_k.reshape(b, h, n, d), values=new_v.reshape(b, h, n, d))
        lnp_sel = torch.gather(new_lnp, 1, sel.index)
        store = self.build_store(merged_ctx, sel, lnp_sel)
        self._init_scores(store, torch.gather(new_l, 1, sel.index))

    def reserve(self, ctx: LayerContext, kept: torch.Tensor) -> torch.Tensor:
        budget = ctx.budgets.reshape(-1).to(kept.device)
        limit = torch.minimum(budget, kept + ctx.max_new_tokens)
        return (limit - kept).clamp(min=0) + (limit == kept).long()

    def _init_scores(self, store: LayerStore, logits: torch.Tensor) -> None:
        """Per-pair score estimates from the prompt's window logits ``[segments, k]`` of the kept pairs."""
        if self.score_estimator == "ema":
            store.add_pair_state("logit", logits)
        else:
            # The prefill estimate counts as one observation, in the ring slot overwritten last.
            store.add_pair_state("logit_sum", logits)
            store.add_pair_state("logit_count", torch.ones_like(logits))
            hist = torch.zeros((*logits.shape, self.score_window), dtype=logits.dtype, device=logits.device)
            hist[..., -1] = logits
            store.add_pair_state("logit_hist", hist)

    def _scores(self, store: LayerStore, index: torch.Tensor) -> torch.Tensor:
        if self.score_estimator == "ema":
            return store.pair_state("logit", index)
        return store.pair_state("logit_sum", index) / store.pair_state("logit_count", index).clamp(min=1)

    # ---- decoding ----------------------------------------------------------------------------------

    def before_append(self, ctx: LayerContext) -> None:
        store = ctx.store
        full, host_full = store.at_limit(ctx.budgets.reshape(-1).to(store.lengths.device), ctx.host_budgets)
        full = full & (store.lengths > 0)
        host_full = host_full & (store.host_lengths > 0)
        if not host_full.any():
            return
        view = store.padded()
        index, valid = view["index"], view["valid"]
        logits = self._scores(store, index)
        lnp = view["log_votes"]
        pos = view["positions"].masked_fill(~valid, -1)
        rank = pos.argsort(1, descending=True).argsort(1)
        protected = (rank < max(self.window - 1, 0)) | ~valid
        victim = (lnp + logits).masked_fill(protected, float("inf")).argmin(1)          # [S]
        keys = view["keys"]
        s, length, _ = keys.shape
        seg = torch.arange(s, device=keys.device)
        slots = torch.arange(length, device=keys.device)
        is_victim = slots[None, :] == victim[:, None]                                   # [S, L]
        sim, which = most_similar(keys[seg, victim][:, None, :], keys, valid & ~is_victim)
        join = full & (sim[:, 0] >= self.threshold)
        target = torch.where(is_victim & join[:, None], which, slots[None, :])
        part = valid & ~(is_victim & ~join[:, None])
        new_k, new_v, new_lnp, new_l = merge_groups(keys, view["values"], lnp, logits, target, part, self.key_merge)
        # The merged pair of each joining segment replaces its target.
        best = which[:, 0]
        state = {"logit": new_l[seg, best]} if self.score_estimator == "ema" else None
        store.replace_pairs(best, join, new_k[seg, best], new_v[seg, best], new_lnp[seg, best], state)
        store.remove(victim, full, host_full)

    def after_attend(self, ctx: LayerContext) -> None:
        store = ctx.store
        view = store.padded()
        rows = view["index"]             # [S, L]; the spare row where there is no pair
        hq, d = ctx.query.shape[1], ctx.query.shape[3]
        s = store.segments
        g = hq // store.kv_heads
        q = ctx.query[:, :, -1].float().reshape(s, g, d)
        new = torch.bmm(q, view["keys"].float().transpose(1, 2)).mean(1) * ctx.scaling   # [S, L]
        if self.score_estimator == "ema":
            old = store.pair_state("logit", rows)
            fresh = old == 0
            store.set_pair_state("logit", rows, torch.where(fresh, new, self.ema_decay * old + (1 - self.ema_decay) * new))
        else:
            state: KeepKVState = ctx.state
            slot = state.step % self.score_window
            state.step += 1
            hist = store.pair_state("logit_hist", rows)               # [S, L, score_window]
            count = store.pair_state("logit_count", rows)
            drop = torch.where(count >= self.score_window, hist[..., slot], torch.zeros_like(new))
            store.set_pair_state("logit_sum", rows, store.pair_state("logit_sum", rows) + (new - drop))
            store.set_pair_state("logit_count", rows, (count + 1).clamp(max=self.score_window))
            hist[..., slot] = new
            store.set_pair_state("logit_hist", rows, hist)
