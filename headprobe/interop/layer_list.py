"""Per-layer budget lists, for engines that allow no per-head budgets (stock vLLM, SGLang).

JSON ``{"format": "headprobe.layer_budgets", "version": 1, "model", "fingerprint", "window", "sink",
"per_head": [layers], "per_layer_total": [layers], "total"}``: ``per_layer_total`` is the budget map's
per-layer sum (exact); ``per_head`` is the budget of every head of a layer when all heads of a layer
must share one number, apportioned so that ``sum(per_head) · heads`` equals the map's total when it
divides. A ``.txt`` path gets ``per_head`` alone, one integer a line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..budget_map import BudgetMap
from ..errors import FileFormatError
from ..files.jsonio import atomic_write_json, atomic_write_text, read_headprobe_file, require
from ..files.overwrite import check_overwrite

LAYER_BUDGETS_FORMAT = "headprobe.layer_budgets"


def layer_budgets(bm: BudgetMap) -> dict:
    """The per-layer list of a budget map (see module docs)."""
    from ..allocation.common import largest_remainder

    b = np.asarray(bm.budgets, dtype=np.int64)
    heads = b.shape[1]
    per_layer = b.sum(axis=1)
    per_head = largest_remainder(per_layer.astype(np.float64), int(per_layer.sum()) // heads)
    return {
        "format": LAYER_BUDGETS_FORMAT, "version": 1, "model": bm.model.name, "fingerprint": bm.model.fingerprint,
        "granularity": bm.granularity, "heads_per_layer": heads, "window": bm.method.get("window"),
        "sink": bm.method.get("sink"), "allocator": bm.method.get("allocator"),
        "per_head": per_head.tolist(), "per_layer_total": per_layer.tolist(), "total": int(per_layer.sum()),
    }


def write_layer_list(bm: BudgetMap, path: str | Path, force: bool = False) -> Path:
    """Write the per-layer budget list (JSON, or one integer a line for a ``.txt`` path)."""
    path = check_overwrite(path, force)
    data = layer_budgets(bm)
    if path.suffix == ".txt":
        return atomic_write_text(path, "".join(f"{x}\n" for x in data["per_head"]))
    return atomic_write_json(path, data)


def read_layer_list(path: str | Path) -> dict:
    """Read a layer-budget JSON file written by :func:`write_layer_list` (validated)."""
    obj = read_headprobe_file(path, LAYER_BUDGETS_FORMAT, 1)
    per_head = require(obj, "per_head", list, path)
    totals = require(obj, "per_layer_total", list, path)
    if len(per_head) != len(totals) or not all(isinstance(x, int) and x >= 0 for x in per_head + totals):
        raise FileFormatError(path, "per_head", "expected one non-negative integer per layer")
    if sum(totals) != require(obj, "total", int, path):
        raise FileFormatError(path, "total", "does not equal the sum of per_layer_total")
    return obj


__all__ = ("LAYER_BUDGETS_FORMAT", "layer_budgets", "read_layer_list", "write_layer_list")
