"""The rule that drops weak candidates early: successive halving, with a paired bootstrap race.

Every candidate of a race is scored on the same trials: rung ``r`` covers the first ``m_r`` calibration
items (every length and depth of each), ``m_r`` growing by a factor ``eta`` up to all of them
(:func:`rung_items`). After each rung but the last, the candidates are ranked by mean score over the rung's
trials and

- a candidate whose paired bootstrap interval of the difference to the leader lies wholly below zero is
  dropped (the difference is real: a *race*, as in Hoeffding races, with bootstrap intervals);
- of the others, the top ``ceil(n / eta)`` go on (successive halving); the rest are dropped.

Halving bounds the cost in advance (each rung costs about as much as the first), the race frees the
budget of candidates that are already clearly worse. At the last rung the candidates are ranked on every
calibration trial; the first is chosen. Ties in mean are broken by fewer cache bytes, then by label.

The bootstrap resamples trials with replacement, the same resample for every candidate (paired: the
trial-to-trial spread that all candidates share cancels in the differences), seeded, over the trials
sorted by id: the result does not depend on the order in which trials ran or on how they were split over
ranks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import HeadprobeError, param


@dataclass(frozen=True)
class HalvingRule:
    """How a race drops candidates.

    Attributes
    ----------
    eta
        Items grow, and candidates shrink, by this factor from rung to rung.
    level
        Coverage of the bootstrap intervals (0.9: the 5th to the 95th percentile).
    resamples
        Bootstrap resamples.
    seed
        Seed of the resampling.
    """

    eta: int = 3
    level: float = 0.9
    resamples: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.eta, bool) or not isinstance(self.eta, int) or self.eta < 2:
            raise HeadprobeError(f"{param('eta', self.eta)}: expected an integer of 2 or more")
        if not 0 < self.level < 1:
            raise HeadprobeError(f"{param('level', self.level)}: expected a coverage between 0 and 1")
        if self.resamples < 100:
            raise HeadprobeError(f"{param('resamples', self.resamples)}: expected 100 or more")

    def to_json(self) -> dict[str, Any]:
        return {"rule": "successive halving with a paired bootstrap race", **asdict(self)}


def rung_items(n_items: int, eta: int) -> list[int]:
    """Calibration items each rung covers: ``[..., ceil(n / eta²), ceil(n / eta), n]``, from 1.

    >>> rung_items(9, 3), rung_items(8, 3), rung_items(3, 3), rung_items(1, 3)
    ([1, 3, 9], [1, 3, 8], [1, 3], [1])
    """
    if n_items < 1:
        raise HeadprobeError("tune: no calibration items")
    sizes = [n_items]
    while sizes[-1] > 1:
        sizes.append(math.ceil(sizes[-1] / eta))
    return sorted(set(sizes))


@dataclass(frozen=True)
class Standing:
    """One candidate after a rung.

    Attributes
    ----------
    label
        The candidate's setting label.
    mean
        Mean score over the rung's trials.
    interval
        Bootstrap interval of that mean.
    diff
        Bootstrap interval of ``mean - leader's mean`` (paired); ``(0, 0)`` for the leader.
    rank
        1 for the leader.
    kept
        Whether it goes on to the next rung (at the last rung: whether it is chosen).
    reason
        Why it was dropped (``""`` when kept).
    """

    label: str
    mean: float
    interval: tuple[float, float]
    diff: tuple[float, float]
    rank: int
    kept: bool
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "mean": round(self.mean, 6), "interval": [round(x, 6) for x in self.interval],
                "diff_to_leader": [round(x, 6) for x in self.diff], "rank": self.rank, "kept": self.kept,
                "reason": self.reason}


def bootstrap_means(scores: np.ndarray, rule: HalvingRule) -> np.ndarray:
    """``[resamples, candidates]`` means of ``scores`` ``[candidates, trials]`` over resampled trials (the
    same resample for every candidate)."""
    scores = np.asarray(scores, dtype=np.float64)
    n = scores.shape[1]
    if n == 0:
        raise HeadprobeError("tune: a rung without trials")
    rng = np.random.default_rng(rule.seed)
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=rule.resamples)          # [resamples, trials]
    return counts @ scores.T / n


def interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """The central ``level`` interval of ``samples`` (along axis 0)."""
    tail = (1.0 - level) / 2
    lo, hi = np.quantile(samples, [tail, 1.0 - tail], axis=0)
    return float(lo), float(hi)


def mean_interval(scores: Sequence[float], rule: HalvingRule) -> tuple[float, float]:
    """Bootstrap interval of the mean of one candidate's trial scores."""
    return interval(bootstrap_means(np.asarray([list(scores)]), rule)[:, 0], rule.level)


def rank_rung(labels: Sequence[str], scores: np.ndarray, rule: HalvingRule, last: bool,
              bytes_: Mapping[str, float] | None = None) -> list[Standing]:
    """Rank a rung's candidates and decide who goes on.

    Parameters
    ----------
    labels
        The candidates.
    scores
        ``[candidates, trials]`` every candidate's score on the rung's trials, trials in one fixed order
        (sorted by id).
    last
        The last rung: nobody is dropped, the first is chosen.
    bytes_
        Mean cache bytes per label, the first tie-break.

    Returns
    -------
    list of Standing
        In rank order.
    """
    scores = np.asarray(scores, dtype=np.float64)
    means = scores.mean(axis=1)
    bytes_ = bytes_ or {}
    order = sorted(range(len(labels)), key=lambda i: (-round(float(means[i]), 12), bytes_.get(labels[i], 0.0),
                                                       labels[i]))
    boot = bootstrap_means(scores, rule)
    leader = order[0]
    keep = len(labels) if last else max(1, math.ceil(len(labels) / rule.eta))
    out = []
    for rank, i in enumerate(order, start=1):
        own = interval(boot[:, i], rule.level)
        diff = (0.0, 0.0) if i == leader else interval(boot[:, i] - boot[:, leader], rule.level)
        if last:
            kept, reason = rank == 1, ""
        elif i == leader:
            kept, reason = True, ""
        elif diff[1] < 0:
            kept, reason = False, (f"clearly worse than {labels[leader]}: difference "
                                   f"[{diff[0]:+.3f}, {diff[1]:+.3f}] at {rule.level:.0%}")
        elif rank <= keep:
            kept, reason = True, ""
        else:
            kept, reason = False, f"below the top {keep} of {len(labels)} (rank {rank})"
        out.append(Standing(labels[i], float(means[i]), own, diff, rank, kept, reason))
    return out


__all__ = ("HalvingRule", "Standing", "bootstrap_means", "interval", "mean_interval", "rank_rung", "rung_items")
