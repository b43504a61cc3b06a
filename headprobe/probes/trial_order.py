"""An order of the trial grid in which every prefix is spread over lengths, depths and needles.

Early stopping (:mod:`headprobe.probes.early_stop`) runs trials in this order and may stop after any
prefix, so each prefix should look like a small version of the whole grid: :func:`spread_order` picks,
one trial at a time, a trial whose length, depth, needle and seed have been used least so far (and,
after that, whose length-depth, needle-length and needle-depth pairs have), ties broken by a seeded
shuffle. Every length, depth and needle comes once before any comes twice, and in every prefix the
counts of one axis's values differ by at most 2 (tested on HeadKV's grid shapes). The order depends
only on the grid and the seed, so a resumed run continues it exactly.
"""

from __future__ import annotations

import numpy as np

from .trial_grid import TrialSpec


def spread_order(trials: list[TrialSpec], seed: int = 0) -> list[TrialSpec]:
    """``trials`` reordered so that every prefix covers the grid's lengths, depths and needles evenly.

    Parameters
    ----------
    trials
        The grid (any order; the result does not depend on it).
    seed
        Seed of the tie-breaking shuffle.
    """
    trials = sorted(trials)
    n = len(trials)
    if n == 0:
        return []
    axes = {
        "length": [t.length for t in trials], "depth": [t.depth for t in trials],
        "needle": [t.needle_id for t in trials], "seed": [t.seed for t in trials],
    }
    singles = [_codes(axes[a]) for a in ("length", "depth", "needle", "seed")]
    pairs = [_codes(list(zip(axes[a], axes[b], strict=True))) for a, b in (("length", "depth"), ("needle", "length"),
                                                               ("needle", "depth"))]
    single_counts = [np.zeros(c.max() + 1) for c in singles]
    pair_counts = [np.zeros(c.max() + 1) for c in pairs]
    tiebreak = np.random.default_rng(seed).permutation(n) / n
    remaining = np.ones(n, dtype=bool)
    order = []
    for _ in range(n):
        cost = sum(counts[codes] for counts, codes in zip(single_counts, singles, strict=True)) * (n + 1) ** 2
        cost = cost + sum(counts[codes] for counts, codes in zip(pair_counts, pairs, strict=True)) * (n + 1) + tiebreak
        cost[~remaining] = np.inf
        pick = int(np.argmin(cost))
        remaining[pick] = False
        order.append(trials[pick])
        for counts, codes in zip(single_counts + pair_counts, singles + pairs, strict=True):
            counts[codes[pick]] += 1
    return order


def _codes(values: list) -> np.ndarray:
    """Integer codes of ``values`` (equal values, equal codes)."""
    index: dict = {}
    return np.array([index.setdefault(v, len(index)) for v in values])
