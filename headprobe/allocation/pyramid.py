"""PyramidKV allocation: layer budgets fall linearly from the first layer to the last.

As in PyramidKV's code, with ``b = capacity − window``: the last layer gets ``b / β_p`` (``β_p`` = 20 by
default), the first ``2b − b/β_p``, the layers between lie on the line, so the mean stays ``b``. Here the
line is turned into exact integers (largest remainder) summing to ``b · L · H_kv`` and spread evenly
over each layer's KV heads; the window and sink are added to every head.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..budget_map import BudgetMap
from ..errors import HeadprobeError
from ..models.identity import ModelIdentity
from .clamp import clamp_for_model
from .common import build_budget_map, largest_remainder, method_block, resolve_capacity
from .dynamickv_offline import spread_evenly

DEFAULT_PYRAMID_BETA = 20.0


def pyramid_layer_weights(layers: int, beta: float = DEFAULT_PYRAMID_BETA) -> np.ndarray:
    """``[layers]`` linear weights from ``2 − 1/β`` (layer 0) down to ``1/β`` (last layer), mean 1."""
    if not beta > 1:
        raise HeadprobeError(f"pyramid beta must be larger than 1, got {beta!r}")
    lo, hi = 1.0 / beta, 2.0 - 1.0 / beta
    if layers == 1:
        return np.ones(1)
    return np.linspace(hi, lo, layers)


def allocate_pyramid(model: ModelIdentity, *, capacity: int | None = 128, window: int = 8, sink: int = 0,
                     beta: float = DEFAULT_PYRAMID_BETA, ratio: float | None = None,
                     prompt_len: int | None = None, clamp: bool = False) -> BudgetMap:
    """PyramidKV's budget map at KV-head granularity, summing exactly to ``capacity · L · H_kv``."""
    cap = resolve_capacity(capacity, window, sink, ratio, prompt_len)
    weights = pyramid_layer_weights(model.num_layers, beta)
    pools = largest_remainder(weights, cap.base * model.num_layers * model.num_kv_heads)
    budgets = spread_evenly(pools, model.num_kv_heads) + cap.window + cap.sink
    if clamp:
        budgets = clamp_for_model(budgets, cap, prompt_len, model)
    method = method_block("pyramid", cap, beta=float(beta), floor=cap.window + cap.sink,
                          clamped_to=prompt_len if clamp else None)
    return build_budget_map(model, budgets, method)


__all__: Sequence[str] = ("allocate_pyramid", "pyramid_layer_weights")
