"""Uniform allocation (SnapKV): every KV head keeps the same number of tokens."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..budget_map import BudgetMap
from ..models.identity import ModelIdentity
from .allocator import Allocator, Source
from .clamp import clamp_for_model
from .common import build_budget_map, method_block, resolve_capacity
from .options import AllocatorOptions, CapacityOptions


def uniform_budgets(layers: int, heads: int, capacity: int) -> np.ndarray:
    """``int64 [layers][heads]`` filled with ``capacity``."""
    return np.full((layers, heads), int(capacity), dtype=np.int64)


def allocate_uniform(model: ModelIdentity, *, capacity: int | None = 128, window: int = 8, sink: int = 0,
                     ratio: float | None = None, prompt_len: int | None = None, clamp: bool = False) -> BudgetMap:
    """SnapKV's budget map: ``capacity`` tokens (window included) for every KV head."""
    cap = resolve_capacity(capacity, window, sink, ratio, prompt_len)
    budgets = uniform_budgets(model.num_layers, model.num_kv_heads, cap.capacity)
    if clamp:
        budgets = clamp_for_model(budgets, cap, prompt_len, model)
    method = method_block("uniform", cap, floor=cap.capacity, clamped_to=prompt_len if clamp else None)
    return build_budget_map(model, budgets, method)


def _run(model: ModelIdentity, sources: Sequence[Source], capacity: CapacityOptions,  # noqa: ARG001 (every allocator takes the same arguments)
         options: AllocatorOptions) -> BudgetMap:  # noqa: ARG001 (every allocator takes the same arguments)
    return allocate_uniform(model, **capacity.as_dict())


ALLOCATOR = Allocator("uniform", (), "SnapKV: the same budget for every KV head", AllocatorOptions, _run)

__all__: Sequence[str] = ("ALLOCATOR", "allocate_uniform", "uniform_budgets")
