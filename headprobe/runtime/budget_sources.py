"""Where per-(layer, KV head) budgets come from: a budget file, a uniform capacity, or a ratio.

Every source resolves, once the prompt lengths are known, to ``[batch, layers, kv_heads]`` token counts
(the policy window included), clamped to what each prompt can hold with the excess redistributed.
Online allocation (DynamicKV) starts from a uniform source and rebalances inside its policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..budget_map import BudgetMap
from ..errors import HeadprobeError
from ..models.identity import ModelIdentity

if TYPE_CHECKING:  # pragma: no cover
    from .cache import CompressedCache
    from .policies.base import Policy


def distribute(total: int, weights: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Integer split of ``total`` proportional to ``weights`` with ``x_i <= caps_i`` (clamp and redistribute).

    Heads that reach their cap keep it and the excess goes to the others in proportion to their weights;
    remainders go to the largest fractional parts, ties to the lower index. The result sums to
    ``min(total, caps.sum())`` exactly.
    """
    weights = np.asarray(weights, dtype=np.float64).ravel()
    caps = np.asarray(caps, dtype=np.int64).ravel()
    total = int(min(total, caps.sum()))
    alloc = np.zeros_like(caps)
    active = caps > 0
    while True:
        remaining = total - int(alloc.sum())
        if remaining <= 0 or not active.any():
            return alloc
        w = np.where(active, weights, 0.0)
        if w.sum() <= 0:
            w = active.astype(np.float64)
        ideal = remaining * w / w.sum()
        over = active & (alloc + ideal >= caps)
        if over.any():
            alloc[over] = caps[over]
            active &= ~over
            continue
        base = np.floor(ideal).astype(np.int64)
        extra = remaining - int(base.sum())
        frac = np.where(active, ideal - base, -1.0)
        order = np.lexsort((np.arange(len(frac)), -frac))
        base[order[:extra]] += 1
        return alloc + base


class BudgetSource:
    """Resolves per-head budgets for the prompts of a batch."""

    def resolve(self, cache: CompressedCache, prompt_lengths: torch.Tensor, policy: Policy) -> torch.Tensor:
        """``[batch, layers, kv_heads]`` int64 budgets (window included)."""
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


def _check_window(capacity: int, policy: Policy, what: str) -> None:
    window = getattr(policy, "window", 0) or 0
    if type(policy).uses_budgets and capacity < window:
        raise HeadprobeError(f"{what} {capacity} is smaller than the {policy.name} window ({window} tokens)")


@dataclass
class UniformBudget(BudgetSource):
    """The same number of tokens for every head (SnapKV-style ``capacity``)."""

    capacity: int

    def resolve(self, cache, prompt_lengths, policy):
        _check_window(self.capacity, policy, "capacity")
        b = prompt_lengths.shape[0]
        # Not clamped to the prompt: policies with a constant-size cache grow up to the capacity.
        return torch.full((b, cache.num_layers, cache.num_kv_heads), self.capacity, dtype=torch.long)

    def describe(self) -> str:
        return f"capacity {self.capacity}"


@dataclass
class RatioBudget(BudgetSource):
    """A fraction of each prompt for every head (``ceil(ratio · prompt_len)``, at least the window)."""

    ratio: float

    def resolve(self, cache, prompt_lengths, policy):
        if not 0 < self.ratio <= 1:
            raise HeadprobeError(f"ratio {self.ratio}: expected a number in (0, 1]")
        window = getattr(policy, "window", 0) or 0
        lengths = prompt_lengths.cpu()
        per_row = torch.tensor([max(math.ceil(self.ratio * int(n)), window) for n in lengths], dtype=torch.long)
        per_row = torch.minimum(per_row, lengths)
        return per_row[:, None, None].expand(-1, cache.num_layers, cache.num_kv_heads).clone()

    def describe(self) -> str:
        return f"ratio {self.ratio}"


@dataclass
class MapBudget(BudgetSource):
    """Budgets from a budget file, rescaled to each prompt.

    Each head gets the window, and the rest of the total (``capacity · layers · kv_heads`` when
    ``capacity`` is given, else the file's own total) is split by the file's ``shares``, clamped to the
    prompt length with the excess redistributed (:func:`distribute`). On models with sliding-window layers
    (Gemma 3), which keep their window whatever the budget, the same mean per head is split over the
    cached (full-attention) layers only, so a budget map and a uniform capacity hold the same bytes.

    Parameters
    ----------
    budget_map
        A loaded :class:`~headprobe.budget_map.BudgetMap` (``granularity = "kv_head"``).
    capacity
        Mean tokens per head to rescale to; ``None`` keeps the file's total.
    identity
        The model's identity; when given, a file made for another model is refused.
    """

    budget_map: BudgetMap
    capacity: int | None = None
    identity: ModelIdentity | None = None

    def check(self, num_layers: int, num_kv_heads: int) -> None:
        bm = self.budget_map
        if self.identity is not None:
            bm.model.check_fits(self.identity, what="budget file")
        if bm.granularity != "kv_head":
            raise HeadprobeError("budget file has query-head budgets (compat mode); the runtime needs kv_head "
                                 "granularity")
        if len(bm.budgets) != num_layers or any(len(r) != num_kv_heads for r in bm.budgets):
            raise HeadprobeError(
                f"budget file was made for {bm.model.name} ({bm.model.num_layers} layers × "
                f"{bm.model.num_kv_heads} KV heads) but the model has {num_layers} layers × {num_kv_heads} KV heads")

    def resolve(self, cache, prompt_lengths, policy):
        self.check(cache.num_layers, cache.num_kv_heads)
        window = getattr(policy, "window", 0) or 0
        bm = self.budget_map
        shape = (cache.num_layers, cache.num_kv_heads)
        heads = shape[0] * shape[1]
        if self.capacity is not None:
            _check_window(self.capacity, policy, "capacity")
            total = self.capacity * heads
        else:
            smallest = min(min(r) for r in bm.budgets)
            if smallest < window:
                raise HeadprobeError(f"budget file has a head budget of {smallest} tokens, smaller than the "
                                     f"{policy.name} window ({window} tokens)")
            total = bm.total
        from ..allocation.clamp import clamp_and_redistribute

        # Sliding-window layers keep their window whatever the budget says: what a map gives them would be
        # lost, so the same mean per head goes to the cached (full-attention) layers only, by their shares.
        cached = [i for i, t in enumerate(cache.layer_types) if t != "sliding_attention"]
        shares = np.asarray(bm.shares, dtype=np.float64)[cached]
        if shares.sum() <= 0:
            shares = np.ones_like(shares)
        sub_heads = len(cached) * shape[1]
        if self.capacity is None and len(cached) == shape[0]:
            target = np.asarray(bm.budgets, dtype=np.int64)          # the file's budgets as they are
        else:
            # The file's distribution at the requested total: the window for every head, the rest by shares.
            sub_total = int(round(total * sub_heads / heads))
            unbounded = np.full(sub_heads, np.iinfo(np.int64).max // (4 * sub_heads), dtype=np.int64)
            target = (distribute(max(sub_total - window * sub_heads, 0), shares.ravel(), unbounded)
                      + window).reshape(len(cached), shape[1])
        lengths = [int(n) for n in prompt_lengths.cpu().tolist()]
        clamped = clamp_and_redistribute(target, lengths, window=window, weights=shares)
        out = np.full((len(lengths), *shape), max(window, 1), dtype=np.int64)
        out[:, cached] = np.asarray(clamped, dtype=np.int64).reshape(len(lengths), len(cached), shape[1])
        return torch.as_tensor(out)

    def describe(self) -> str:
        cap = f", rescaled to capacity {self.capacity}" if self.capacity else ""
        return f"budget file ({self.budget_map.method.get('allocator', '?')}{cap})"
