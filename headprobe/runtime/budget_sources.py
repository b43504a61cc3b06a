"""Where per-(layer, KV head) budgets come from: a budget file, a uniform capacity, or a ratio.

Every source resolves, once the prompt lengths are known, to ``[batch, layers, kv_heads]`` token counts
(the policy window included), clamped to what each prompt can hold with the excess redistributed.
Online allocation (DynamicKV) starts from a uniform source and rebalances inside its policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..budget_arithmetic import clamp_and_redistribute, largest_remainder
from ..budget_map import BudgetMap
from ..errors import HeadprobeError, param
from ..models.identity import ModelIdentity
from .policies.base import Policy
from .shape import CacheShape


class BudgetSource:
    """Resolves per-head budgets for the prompts of a batch."""

    def resolve(self, shape: CacheShape, prompt_lengths: torch.Tensor, policy: Policy) -> torch.Tensor:
        """``[batch, layers, kv_heads]`` int64 budgets (window included).

        Parameters
        ----------
        shape
            Layers, KV heads and layer types of the cache.
        prompt_lengths
            ``[batch]`` real (unpadded) prompt tokens.
        policy
            The policy the budgets are for (its ``window`` is kept by every head).
        """
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


def _check_window(capacity: int, policy: Policy, what: str) -> None:
    if type(policy).uses_budgets and capacity < policy.window:
        raise HeadprobeError(f"{param(what, capacity)} is smaller than the {policy.name} window "
                             f"({policy.window} tokens)")


@dataclass
class UniformBudget(BudgetSource):
    """The same number of tokens for every head (SnapKV-style ``capacity``)."""

    capacity: int

    def resolve(self, shape, prompt_lengths, policy):
        _check_window(self.capacity, policy, "capacity")
        b = prompt_lengths.shape[0]
        # Not clamped to the prompt: policies with a constant-size cache grow up to the capacity.
        return torch.full((b, shape.num_layers, shape.num_kv_heads), self.capacity, dtype=torch.long)

    def describe(self) -> str:
        return f"capacity {self.capacity}"


@dataclass
class RatioBudget(BudgetSource):
    """A fraction of each prompt for every head (``ceil(ratio · prompt_len)``, at least the window)."""

    ratio: float

    def resolve(self, shape, prompt_lengths, policy):
        if not 0 < self.ratio <= 1:
            raise HeadprobeError(f"{param('ratio', self.ratio)}: expected a number in (0, 1]")
        lengths = prompt_lengths.cpu()
        per_row = torch.tensor([max(math.ceil(self.ratio * int(n)), policy.window) for n in lengths],
                               dtype=torch.long)
        per_row = torch.minimum(per_row, lengths)
        return per_row[:, None, None].expand(-1, shape.num_layers, shape.num_kv_heads).clone()

    def describe(self) -> str:
        return f"ratio {self.ratio}"


@dataclass
class MapBudget(BudgetSource):
    """Budgets from a budget file, rescaled to each prompt.

    Each head gets the window, and the rest of the total (``capacity · layers · kv_heads`` when
    ``capacity`` is given, else the file's own total) is split by the file's ``shares``, clamped to the
    prompt length with the excess redistributed
    (:func:`~headprobe.budget_arithmetic.clamp_and_redistribute`). On models with sliding-window layers
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

    def check(self, shape: CacheShape) -> None:
        """Refuse a file made for another model or with budgets the runtime cannot use."""
        bm = self.budget_map
        if self.identity is not None:
            bm.check_fits(self.identity, what="budget file")      # once per map and model
        if bm.granularity != "kv_head":
            raise HeadprobeError("budget file has query-head budgets (compat mode); the runtime needs kv_head "
                                 "granularity")
        layers, kv_heads = shape.num_layers, shape.num_kv_heads
        if len(bm.budgets) != layers or any(len(r) != kv_heads for r in bm.budgets):
            raise HeadprobeError(
                f"budget file was made for {bm.model.name} ({bm.model.num_layers} layers × "
                f"{bm.model.num_kv_heads} KV heads) but the model has {layers} layers × {kv_heads} KV heads")

    def resolve(self, shape, prompt_lengths, policy):
        self.check(shape)
        window = policy.window
        bm = self.budget_map
        if self.capacity is not None:
            _check_window(self.capacity, policy, "capacity")
            total = self.capacity * shape.heads
        else:
            smallest = min(min(r) for r in bm.budgets)
            if smallest < window:
                raise HeadprobeError(f"budget file has a head budget of {smallest} tokens, smaller than the "
                                     f"{policy.name} window ({window} tokens)")
            total = bm.total
        # Sliding-window layers keep their window whatever the budget says: what a map gives them would be
        # lost, so the same mean per head goes to the cached (full-attention) layers only, by their shares.
        cached = shape.cached_layers
        shares = np.asarray(bm.shares, dtype=np.float64)[cached]
        if shares.sum() <= 0:
            shares = np.ones_like(shares)
        sub_heads = len(cached) * shape.num_kv_heads
        if self.capacity is None and len(cached) == shape.num_layers:
            target = np.asarray(bm.budgets, dtype=np.int64)          # the file's budgets as they are
        else:
            # The file's distribution at the requested total: the window for every head, the rest by shares.
            sub_total = round(total * sub_heads / shape.heads)
            target = largest_remainder(shares, max(sub_total - window * sub_heads, 0)) + window
        lengths = [int(n) for n in prompt_lengths.cpu().tolist()]
        clamped = clamp_and_redistribute(target, lengths, window=window, weights=shares)
        out = np.full((len(lengths), shape.num_layers, shape.num_kv_heads), max(window, 1), dtype=np.int64)
        out[:, cached] = np.asarray(clamped, dtype=np.int64).reshape(len(lengths), len(cached), shape.num_kv_heads)
        return torch.as_tensor(out)

    def describe(self) -> str:
        cap = f", rescaled to capacity {self.capacity}" if self.capacity else ""
        return f"budget file ({self.budget_map.method.get('allocator', '?')}{cap})"
