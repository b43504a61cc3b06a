"""Bootstrap over trials: per-head confidence intervals and how stable the top-k head set is.

A profile's head scores are means over its passing trials. Resampling those trials with replacement
(``resamples`` times, a fixed seed) gives the spread of each head's mean (:func:`head_intervals`) and of
the top-k set (:func:`top_k_jaccard`: the mean Jaccard index between each resample's top-k heads and the
profile's own). Ties are broken as everywhere in headprobe: the lower (layer, head) ranks higher.

The resampling sees the trials as a set: before drawing, the trials are put in one canonical order (by
their scores, :func:`canonical_order`), so a grid run in one process, split over ``torchrun`` ranks, run
in another batch order or merged from shard logs gives the same intervals and the same Jaccard indices,
as it gives the same scores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import HeadprobeError, param
from ..head_ranking import rank_order


@dataclass(frozen=True)
class BootstrapSettings:
    """How trials are resampled.

    Attributes
    ----------
    resamples
        Number of bootstrap resamples.
    level
        Coverage of the per-head intervals (0.9: the 5th to the 95th percentile of the resampled means).
    seed
        Seed of the resampling (a profile's intervals are reproducible from its trial log).
    """

    resamples: int = 200
    level: float = 0.9
    seed: int = 0


def resample_means(scores: np.ndarray, settings: BootstrapSettings) -> np.ndarray:
    """Means of ``scores`` ``[trials, ...]`` over ``settings.resamples`` resamples of the trials:
    ``[resamples, ...]`` float64. Each resample draws ``trials`` trials with replacement."""
    scores = np.asarray(scores, dtype=np.float64)
    n = scores.shape[0]
    if n == 0:
        raise HeadprobeError("bootstrap: no trials to resample")
    scores = scores[canonical_order(scores)]
    rng = np.random.default_rng(settings.seed)
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=settings.resamples)      # [resamples, trials]
    flat = scores.reshape(n, -1)
    return (counts @ flat / n).reshape((settings.resamples,) + scores.shape[1:])


def canonical_order(scores: np.ndarray) -> np.ndarray:
    """An order of the trials ``scores`` ``[trials, ...]`` that depends on their scores alone: ascending
    by the first score, then the second, and so on (trials with equal scores are interchangeable).

    Resampling in this order makes the bootstrap a function of the set of trials, not of the order in
    which a run logged them or the shards that ran them.
    """
    flat = np.asarray(scores, dtype=np.float64).reshape(len(scores), -1)
    if flat.shape[1] == 0:
        return np.arange(len(flat))
    return np.lexsort(flat.T[::-1])


def head_intervals(scores: np.ndarray, settings: BootstrapSettings) -> tuple[np.ndarray, np.ndarray]:
    """Per-head bootstrap interval of the mean: ``(low, high)``, each shaped like ``scores[0]``.

    Parameters
    ----------
    scores
        ``[trials, layers, heads]`` per-trial head scores.
    settings
        Resamples, coverage level and seed.
    """
    means = resample_means(scores, settings)
    tail = (1.0 - settings.level) / 2
    return np.quantile(means, tail, axis=0), np.quantile(means, 1.0 - tail, axis=0)


def top_k_sets(means: np.ndarray, k: int) -> np.ndarray:
    """``[rows, k]`` flat indices of the ``k`` top heads of each row of ``means`` ``[rows, layers, heads]``."""
    flat = means.reshape(means.shape[0], -1)
    return np.stack([rank_order(row)[:k] for row in flat])


def top_k_jaccard(scores: np.ndarray, k: int, settings: BootstrapSettings) -> float:
    """Mean Jaccard index between the top-``k`` heads of each bootstrap resample and of all trials.

    1.0 means every resample picks the same ``k`` heads; with ``k = 20``, 0.9 is about one head in twenty
    differing on average.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if k < 1:
        raise HeadprobeError(f"{param('stable_k', k)}: expected a positive number of heads")
    reference = set(rank_order(scores.mean(axis=0))[:k].tolist())
    values = []
    for row in top_k_sets(resample_means(scores, settings), k):
        chosen = set(row.tolist())
        values.append(len(chosen & reference) / len(chosen | reference))
    return float(np.mean(values))


def interval_block(scores: np.ndarray, settings: BootstrapSettings, ks: tuple[int, ...] = (10, 20)) -> dict:
    """The ``intervals`` block of a profile: query-head intervals and top-k Jaccard indices.

    Parameters
    ----------
    scores
        ``[passing trials, layers, query_heads]``.
    """
    low, high = head_intervals(scores, settings)
    return {"method": "bootstrap", **asdict(settings), "trials": int(np.asarray(scores).shape[0]),
            "low": np.round(low, 6).tolist(), "high": np.round(high, 6).tolist(),
            "top_k_jaccard": {str(k): round(top_k_jaccard(scores, k, settings), 4) for k in ks}}
