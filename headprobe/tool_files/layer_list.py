"""Per-layer budget lists, for engines and presses that take one budget per layer.

JSON ``{"format": "headprobe.layer_budgets", "version": 1, "model", "fingerprint", "window", "sink",
"per_head": [layers], "per_layer_total": [layers], "total"}``: ``per_layer_total`` is the budget map's
per-layer sum (exact); ``per_head`` is the budget of every head of a layer when all heads of a layer
must share one number, apportioned so that ``sum(per_head) · heads`` equals the map's total when it
divides. A ``.txt`` path gets ``per_head`` alone, one integer a line.

kvpress' ``PerLayerCompressionPress`` takes per-layer *removal ratios* instead:
:func:`kvpress_layer_ratios` turns ``per_head`` into ratios for a given context length ``N`` such that
kvpress keeps exactly ``per_head[l]`` tokens per head of layer ``l`` (``int(N · (1 − r)) = per_head[l]``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..budget_arithmetic import largest_remainder
from ..budget_map import BudgetMap
from ..errors import FileFormatError, HeadprobeError, param
from ..files.jsonio import atomic_write_json, atomic_write_text, read_headprobe_file, require
from ..files.overwrite import check_overwrite

LAYER_BUDGETS_FORMAT = "headprobe.layer_budgets"
KVPRESS_RATIOS_FORMAT = "headprobe.kvpress_layer_ratios"


def check_budgets_keep_window(bm: BudgetMap) -> None:
    """Refuse to export a budget map in which a head keeps less than the map's own window (or nothing).

    Every head keeps at least its window whatever the budget says (``generate --budget`` refuses such a
    map for the same reason); an export would otherwise tell the engine to drop more (a map of zeros:
    compression ratios of 1.0, every token dropped).

    Raises
    ------
    HeadprobeError
        Naming the head, its budget and the window.
    """
    b = np.asarray(bm.budgets, dtype=np.int64)
    window = bm.method.get("window")
    least = window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else 1
    if b.size and b.min() < least:
        layer, head = (int(i) for i in np.unravel_index(int(np.argmin(b)), b.shape))
        what = f"smaller than its window ({window} tokens)" if least == window else "so it keeps no token"
        raise HeadprobeError(f"the budget map gives head {layer}-{head} (budgets[{layer}][{head}]) {b.min()} tokens, "
                             f"{what}: every head keeps its window whatever the budget (generate --budget refuses "
                             "this map too); allocate the map again")


def layer_budgets(bm: BudgetMap) -> dict:
    """The per-layer list of a budget map (see module docs)."""
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
    """Write the per-layer budget list (JSON, or one integer a line for a ``.txt`` path).

    Raises
    ------
    HeadprobeError
        An existing file without ``force``, or a head budget below the map's window
        (:func:`check_budgets_keep_window`).
    """
    path = check_overwrite(path, force)
    check_budgets_keep_window(bm)
    data = layer_budgets(bm)
    if path.suffix == ".txt":
        return atomic_write_text(path, "".join(f"{x}\n" for x in data["per_head"]), overwrite=force)
    return atomic_write_json(path, data, overwrite=force)


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


def removal_ratio(kept: int, prompt_len: int) -> float:
    """The largest ratio ``r`` with ``int(prompt_len · (1 − r)) == kept`` (kvpress' kept-token count).

    ``(N − kept) / N`` where floating point allows, else the next smaller float until the count is exact.
    """
    if not 0 <= kept <= prompt_len:
        raise ValueError(f"kept tokens {kept} must be within the context length {prompt_len}")
    r = (prompt_len - kept) / prompt_len
    while r > 0 and int(prompt_len * (1 - r)) < kept:
        r = float(np.nextafter(r, 0.0))
    return r


def kvpress_layer_ratios(bm: BudgetMap, prompt_len: int | None = None) -> dict:
    """Per-layer removal ratios for kvpress' ``PerLayerCompressionPress``, exact at ``prompt_len``.

    Parameters
    ----------
    bm
        A KV-head budget map; each layer keeps ``per_head[l]`` tokens a head (:func:`layer_budgets`).
    prompt_len
        Tokens of the context kvpress compresses (its ``k_len``); default the map's ``prompt_len``.

    Returns
    -------
    dict
        ``{"format": "headprobe.kvpress_layer_ratios", "version": 1, "model", "fingerprint",
        "prompt_len", "kept_per_head": [layers], "compression_ratios": [layers], "compression_ratio"}``,
        the last being kvpress' mean ratio (what ``PerLayerCompressionPress.compression_ratio`` reports).

    Raises
    ------
    HeadprobeError
        No context length, a layer whose budget exceeds it, or a head budget below the map's window.
    """
    if prompt_len is None:
        prompt_len = bm.method.get("prompt_len")
    if not isinstance(prompt_len, (int, np.integer)) or isinstance(prompt_len, bool) or prompt_len <= 0:
        raise HeadprobeError(f"kvpress ratios are shares of a context length: pass {param('prompt_len')} "
                             "(the context tokens kvpress compresses)")
    if bm.granularity != "kv_head":
        raise HeadprobeError("kvpress compresses per KV head; this budget map is per query head "
                             f"(made with {param('compat', 'headkv')})")
    check_budgets_keep_window(bm)
    per_head = layer_budgets(bm)["per_head"]
    if max(per_head) > prompt_len:
        layer = int(np.argmax(per_head))
        raise HeadprobeError(
            f"layer {layer} keeps {per_head[layer]} tokens a head, more than {param('prompt_len', prompt_len)}; "
            f"allocate for that length ({param('prompt_len', prompt_len)} with {param('clamp', True)}) or give a "
            "longer context")
    ratios = [removal_ratio(int(k), int(prompt_len)) for k in per_head]
    return {"format": KVPRESS_RATIOS_FORMAT, "version": 1, "model": bm.model.name,
            "fingerprint": bm.model.fingerprint, "prompt_len": int(prompt_len), "kept_per_head": per_head,
            "compression_ratios": ratios, "compression_ratio": sum(ratios) / len(ratios)}


def write_kvpress_ratios(bm: BudgetMap, path: str | Path, prompt_len: int | None = None,
                         force: bool = False) -> Path:
    """Write :func:`kvpress_layer_ratios` as JSON."""
    path = check_overwrite(path, force)
    return atomic_write_json(path, kvpress_layer_ratios(bm, prompt_len), overwrite=force)


__all__ = ("KVPRESS_RATIOS_FORMAT", "LAYER_BUDGETS_FORMAT", "check_budgets_keep_window", "kvpress_layer_ratios",
           "layer_budgets", "read_layer_list", "removal_ratio", "write_kvpress_ratios", "write_layer_list")
