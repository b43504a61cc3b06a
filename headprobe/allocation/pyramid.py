"""PyramidKV allocation: layer budgets fall linearly from the first layer to the last.

As in PyramidKV's code, with ``b = capacity − window``: the last layer gets ``b / taper`` (``taper`` = 20 by
default; PyramidKV's code calls it ``beta``, which is not HeadKV's β), the first ``2b − b/taper``, the
layers between lie on the line, so the mean stays ``b``. Here the line is turned into exact integers
(largest remainder) summing to ``b · L · H_kv`` and spread evenly over each layer's KV heads; the window
and sink are added to every head.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..budget_arithmetic import largest_remainder
from ..budget_map import BudgetMap
from ..errors import HeadprobeError
from ..models.identity import ModelIdentity
from .allocator import Allocator, Source
from .clamp import clamp_for_model
from .common import build_budget_map, method_block, resolve_capacity
from .dynamickv_offline import spread_evenly
from .options import AllocatorOptions, CapacityOptions, option, spelled

#: PyramidKV's taper when none is given (its ``PyramidKVCluster(beta=20)``).
DEFAULT_TAPER = 20.0
#: The tapers ``headprobe tune`` tries: a gentle slope, a steeper one and PyramidKV's own.
TAPER_SEARCH = (2.0, 5.0, DEFAULT_TAPER)


def check_taper(taper: float) -> float:
    """The taper must be a finite number above 1 (at 1 every layer gets ``b``, below 1 the line tips over)."""
    if isinstance(taper, bool) or not isinstance(taper, numbers.Real) or not math.isfinite(taper) or not taper > 1:
        raise HeadprobeError(f"{spelled('taper', taper)}: expected a number larger than 1 (the mean layer budget "
                             "over the last layer's)")
    return float(taper)


@dataclass(frozen=True)
class PyramidOptions(AllocatorOptions):
    """PyramidKV's option: how steeply the layer budgets fall. The budget map records it as ``beta``, the
    name PyramidKV's code gives it."""

    taper: float = option(DEFAULT_TAPER, "PyramidKV's slope > 1: the last layer keeps 1/taper of the mean budget "
                          "beyond the window, the first 2 − 1/taper of it", record="beta", filename="taper",
                          search=TAPER_SEARCH)

    def check(self) -> None:
        check_taper(self.taper)


def pyramid_layer_weights(layers: int, taper: float = DEFAULT_TAPER) -> np.ndarray:
    """``[layers]`` linear weights from ``2 − 1/taper`` (layer 0) down to ``1/taper`` (last layer), mean 1."""
    taper = check_taper(taper)
    lo, hi = 1.0 / taper, 2.0 - 1.0 / taper
    if layers == 1:
        return np.ones(1)
    return np.linspace(hi, lo, layers)


def allocate_pyramid(model: ModelIdentity, *, capacity: int | None = 128, window: int = 8, sink: int = 0,
                     taper: float = DEFAULT_TAPER, ratio: float | None = None,
                     prompt_len: int | None = None, clamp: bool = False) -> BudgetMap:
    """PyramidKV's budget map at KV-head granularity, summing exactly to ``capacity · L · H_kv``.

    The map's ``method.beta`` holds ``taper`` (PyramidKV's name for it).
    """
    cap = resolve_capacity(capacity, window, sink, ratio, prompt_len)
    weights = pyramid_layer_weights(model.num_layers, taper)
    pools = largest_remainder(weights, cap.base * model.num_layers * model.num_kv_heads)
    budgets = spread_evenly(pools, model.num_kv_heads) + cap.window + cap.sink
    if clamp:
        budgets = clamp_for_model(budgets, cap, prompt_len, model)
    method = method_block("pyramid", cap, beta=float(taper), floor=cap.window + cap.sink,
                          clamped_to=prompt_len if clamp else None)
    return build_budget_map(model, budgets, method)


def _run(model: ModelIdentity, sources: Sequence[Source], capacity: CapacityOptions,  # noqa: ARG001 (every allocator takes the same arguments)
         options: PyramidOptions) -> BudgetMap:
    return allocate_pyramid(model, taper=options.taper, **capacity.as_dict())


ALLOCATOR = Allocator("pyramid", (), f"PyramidKV: layer budgets falling linearly with depth (taper, default "
                      f"{DEFAULT_TAPER:g})", PyramidOptions, _run)

__all__: Sequence[str] = ("ALLOCATOR", "DEFAULT_TAPER", "PyramidOptions", "allocate_pyramid", "check_taper",
                          "pyramid_layer_weights")
