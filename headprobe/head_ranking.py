"""Ranking heads by score with ties broken the same way everywhere: the lower (layer, head) ranks higher."""

from __future__ import annotations

import numpy as np


def rank_order(scores) -> np.ndarray:
    """Flat indices of ``scores`` from the highest score to the lowest.

    Parameters
    ----------
    scores
        ``[layers][heads]`` (any shape; ranked flat, row-major).

    Returns
    -------
    np.ndarray
        ``int64 [layers * heads]``; equal scores keep row-major order, so the lower (layer, head) first.
    """
    flat = np.asarray(scores, dtype=np.float64).ravel()
    return np.lexsort((np.arange(flat.size), -flat))


def top_heads(scores, k: int) -> list[tuple[int, int]]:
    """The ``k`` highest-scoring ``(layer, head)`` of ``scores [layers, heads]`` (ties: lower index first)."""
    s = np.asarray(scores, dtype=np.float64)
    return [divmod(int(i), s.shape[1]) for i in rank_order(s)[:max(k, 0)]]
