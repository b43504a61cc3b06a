"""Budget arithmetic: split an integer total exactly, clamp per-head budgets to a prompt and redistribute.

Plain NumPy on integer budgets, no model and no file: allocation's methods (which write budget maps) and the
runtime (which fits a map's budgets to each prompt) both compute with these, so the module sits below both.

A head cannot keep more tokens than the prompt has. HeadKV's code lets a head "own" 1273 slots of a
900-token prompt and the rest of the total is lost; here the slots a head cannot use go to the heads
that still have room, in proportion to their budgets, so the cache holds as many tokens as it may.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Split the integer ``total`` in proportion to ``weights`` exactly.

    Parameters
    ----------
    weights
        Any shape, non-negative, not all zero (all zero splits evenly).
    total
        Non-negative integer.

    Returns
    -------
    np.ndarray
        ``int64`` of the same shape summing to ``total``. Each entry is the floor of its quota plus one
        for the entries with the largest remainders; equal remainders go to the lower flat index, i.e.
        to the lower (layer, head).
    """
    w = np.asarray(weights, dtype=np.float64)
    if total < 0:
        raise ValueError(f"total must be non-negative, got {total}")
    flat = w.ravel()
    if flat.size == 0:
        return np.zeros(w.shape, dtype=np.int64)
    if not np.all(np.isfinite(flat)):
        raise ValueError("weights must be finite")
    with np.errstate(over="ignore"):
        s = flat.sum()
    if not np.isfinite(s):   # finite weights whose sum overflows: the same proportions, scaled down
        flat = flat / flat.max()
        s = flat.sum()
    if s <= 0:
        flat = np.ones_like(flat)
        s = float(flat.size)
    quota = flat / s * total
    base = np.floor(quota).astype(np.int64)
    # Guard against float drift: never exceed the total.
    while base.sum() > total:
        base[np.argmax(base)] -= 1
    left = int(total - base.sum())
    if left:
        rem = quota - base
        order = np.lexsort((np.arange(flat.size), -rem))  # largest remainder first, then lowest index
        base[order[:left]] += 1
    return base.reshape(w.shape)



def clamp_and_redistribute(budgets, prompt_len, window: int = 0, sink: int = 0, weights=None, limits=None):
    """Clamp budgets to a prompt length and redistribute the excess exactly.

    Parameters
    ----------
    budgets
        ``[layers][heads]`` or ``[batch][layers][heads]`` non-negative integer token budgets (window and
        sink included), as nested lists or a NumPy array.
    prompt_len
        An ``int``, or one length per batch row (a sequence or 1-D array of ``batch`` ints). With a 2-D
        ``budgets`` and several lengths, the same budgets are clamped once per row.
    window, sink
        Tokens every head always keeps (the last ``window`` and the first ``sink`` prompt tokens). Each
        head ends with at least ``min(window + sink, its limit)``; budgets below that floor are an error.
    weights
        Optional ``[layers][heads]`` non-negative weights deciding who gets the excess; default: the
        budgets themselves (a head that was given more gets more of the excess).
    limits
        Optional ``[layers]`` per-layer caps on top of the prompt length (e.g. a sliding-window size;
        ``None`` entries mean no cap).

    Returns
    -------
    Same kind as ``budgets`` (nested lists of ``int`` or an ``int64`` array): ``[layers][heads]`` for one
    prompt length, ``[batch][layers][heads]`` for several. For each row, every head holds at most
    ``min(prompt_len, limit)`` tokens and the total equals ``min(sum(budgets), heads_total_room)``:
    nothing is lost unless the whole prompt fits everywhere. Ties go to the lower (layer, head).

    Examples
    --------
    >>> clamp_and_redistribute([[100, 20], [20, 20]], prompt_len=50)
    [[50, 37], [37, 36]]
    """
    as_list = not isinstance(budgets, np.ndarray)
    b, rows, lens, scalar_len = _budget_rows(budgets, prompt_len)
    layers, heads = rows.shape[1:]
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    if w is not None and w.shape != (layers, heads):
        raise ValueError(f"weights must have shape {(layers, heads)}, got {w.shape}")
    lim = _layer_limits(limits, layers)
    out = np.stack([_clamp_one(r, int(n), window + sink, w, lim) for r, n in zip(rows, lens, strict=True)])
    if scalar_len and b.ndim == 2:
        out = out[0]
    return out.tolist() if as_list else out


def _budget_rows(budgets, prompt_len) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """The checked budgets and one ``[layers][heads]`` row of them per prompt length.

    Returns
    -------
    budgets, rows, lengths, scalar
        ``budgets`` as an ``int64`` array, its ``[batch][layers][heads]`` rows (2-D budgets repeated for
        each length), the prompt lengths (one per row) and whether ``prompt_len`` was one ``int``.
    """
    b = np.asarray(budgets, dtype=np.int64)
    if b.ndim not in (2, 3):
        raise ValueError(f"budgets must be [layers][heads] or [batch][layers][heads], got shape {b.shape}")
    if np.any(b < 0):
        raise ValueError("budgets must be non-negative")
    lens = np.atleast_1d(np.asarray(prompt_len, dtype=np.int64))
    scalar_len = np.ndim(prompt_len) == 0
    if lens.ndim != 1 or np.any(lens < 0):
        raise ValueError(f"prompt_len must be a non-negative int or a 1-D sequence of them, got {prompt_len!r}")
    if b.ndim == 3:
        if scalar_len:
            lens = np.full(b.shape[0], int(lens[0]))
        elif len(lens) != b.shape[0]:
            raise ValueError(f"{b.shape[0]} budget rows but {len(lens)} prompt lengths")
        rows = b
    else:
        rows = np.broadcast_to(b, (len(lens), *b.shape))
    return b, rows, lens, scalar_len


def _layer_limits(limits, layers: int) -> np.ndarray:
    """Per-layer caps as ``int64`` (no cap: the largest ``int64``)."""
    if limits is None:
        return np.full(layers, np.iinfo(np.int64).max, dtype=np.int64)
    if len(limits) != layers:
        raise ValueError(f"limits must have one entry per layer ({layers}), got {len(limits)}")
    return np.array([np.iinfo(np.int64).max if x is None else int(x) for x in limits], dtype=np.int64)


def _clamp_one(b: np.ndarray, prompt_len: int, floor: int, weights: np.ndarray | None,
               limits: np.ndarray) -> np.ndarray:
    room = np.minimum(prompt_len, limits)[:, None].repeat(b.shape[1], axis=1)
    if np.any(b < np.minimum(floor, room)):
        raise ValueError(f"a budget is below the floor of {floor} tokens (window + sink)")
    return redistribute(b, room, weights)


def redistribute(budgets, room, weights=None) -> np.ndarray:
    """Clamp integer budgets to each entry's room and give what was cut to the entries with room left.

    Parameters
    ----------
    budgets
        Non-negative integers, any shape.
    room
        The most each entry may hold, same shape.
    weights
        Non-negative, same shape: the excess goes to the entries with room left in proportion to these;
        default the budgets themselves. Open entries with zero total weight share it evenly.

    Returns
    -------
    np.ndarray
        ``int64`` of the same shape: every entry ``<= room``, no entry below ``min(budget, room)``, summing
        to ``min(budgets.sum(), room.sum())`` exactly. The split is computed in real numbers and rounded
        once (largest remainder, ties to the lower flat index).
    """
    b = np.asarray(budgets, dtype=np.int64)
    w = b if weights is None else weights
    return _fill_and_round(b.astype(np.float64), room, w, int(b.sum()))


def split_with_caps(total: int, weights, caps) -> np.ndarray:
    """Integer split of ``total`` in proportion to ``weights`` with every entry ``<= caps`` (same shape).

    Entries whose share would pass their cap hold the cap and the rest is split again over the others
    (water filling), then rounded once; sums to ``min(total, caps.sum())`` exactly.

    Examples
    --------
    >>> split_with_caps(100, [1, 1, 1, 5], [10, 50, 50, 30]).tolist()
    [10, 30, 30, 30]
    """
    w = np.asarray(weights, dtype=np.float64)
    share = w if w.sum() > 0 else np.ones_like(w)
    return _fill_and_round(int(total) * share / max(share.sum(), 1e-300), caps, w, int(total))


def _fill_and_round(start: np.ndarray, room, weights, total: int) -> np.ndarray:
    """Clamp ``start`` (real) to ``room``, hand the excess to open entries by ``weights`` until none is cut,
    then round to integers summing to ``min(total, room.sum())``."""
    room = np.asarray(room, dtype=np.int64).reshape(start.shape)
    w = np.asarray(weights, dtype=np.float64).reshape(start.shape)
    target = min(int(total), int(room.sum()))
    cur = np.minimum(start, room)
    excess = float(start.sum()) - float(cur.sum())
    while excess > 1e-9:
        open_ = cur < room
        if not open_.any():
            break
        ow = np.where(open_, w, 0.0)
        if ow.sum() <= 0:
            ow = open_.astype(np.float64)
        cur = cur + excess * ow / ow.sum()
        over = np.maximum(cur - room, 0.0)
        cur = cur - over
        excess = float(over.sum())
    base = np.minimum(np.floor(cur + 1e-9).astype(np.int64), room)
    left = target - int(base.sum())
    if left > 0:
        frac = np.where(base < room, np.round(cur - base, 9), -np.inf).ravel()   # equal up to float noise: a tie
        order = np.lexsort((np.arange(frac.size), -frac))      # largest remainder first, then lowest index
        order = order[np.isfinite(frac[order])]                # entries at their room take no more
        flat = base.ravel()
        flat[order[:left]] += 1
        base = flat.reshape(base.shape)
    return base


def scale_to_prompt(shares, prompt_len: int, ratio: float, window: int = 0, sink: int = 0) -> np.ndarray:
    """Budgets for one prompt from a map's ``shares``: ``ratio · prompt_len`` tokens per head on average.

    Parameters
    ----------
    shares
        ``[layers][heads]`` summing to 1 (``BudgetMap.shares``).

    Returns
    -------
    np.ndarray
        ``int64 [layers][heads]``: at least ``window + sink`` per head, summing exactly to
        ``max(round(ratio·prompt_len), window + sink) · layers · heads`` before clamping, then clamped
        to the prompt with :func:`clamp_and_redistribute`.
    """
    s = np.asarray(shares, dtype=np.float64)
    n = s.size
    floor = window + sink
    per_head = max(int(np.floor(ratio * prompt_len + 0.5)), floor)
    total = per_head * n
    b = floor + largest_remainder(np.clip(s, 0, None), total - floor * n)
    return clamp_and_redistribute(b, prompt_len, window=window, sink=sink)


__all__: Sequence[str] = ("clamp_and_redistribute", "largest_remainder", "redistribute", "scale_to_prompt",
                          "split_with_caps")
