"""Early stopping: run the trial grid in a spread order until the top-k heads stop changing.

Trials run in :func:`~headprobe.probes.trial_order.spread_order`, ``check_every`` at a time. After each
chunk the passing trials are resampled (:mod:`headprobe.probes.bootstrap`); the run stops when, for every
score kind of the pass, the mean Jaccard index between the resamples' top-``k`` heads and the profile's
own is at least ``jaccard`` (and at least ``min_passed`` trials passed). Checks happen when the number
of finished trials of the order is a multiple of ``check_every``, so a run resumed from its trial log
stops where the uninterrupted run would have.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import HeadprobeError, param
from .bootstrap import BootstrapSettings, top_k_jaccard
from .trial_grid import TrialSpec


@dataclass(frozen=True)
class StopRule:
    """When a run with early stopping stops.

    Attributes
    ----------
    k
        Size of the top head set that must be stable.
    jaccard
        Least mean Jaccard index between the bootstrap resamples' top-``k`` sets and the profile's.
    check_every
        Trials between two checks.
    min_passed
        Passing trials needed before the first check counts.
    bootstrap
        Resamples and seed of the check.
    order_seed
        Seed of the spread order's tie-breaking.
    """

    k: int = 20
    jaccard: float = 0.9
    check_every: int = 10
    min_passed: int = 20
    bootstrap: BootstrapSettings = field(default_factory=BootstrapSettings)
    order_seed: int = 0

    def __post_init__(self) -> None:
        check_stop_rule(self)

    def to_json(self) -> dict[str, Any]:
        """What the trial log and the profile record of the rule."""
        return {"k": self.k, "jaccard": self.jaccard, "check_every": self.check_every,
                "min_passed": self.min_passed, "resamples": self.bootstrap.resamples,
                "bootstrap_seed": self.bootstrap.seed, "order": "spread", "order_seed": self.order_seed}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> StopRule:
        return cls(k=obj["k"], jaccard=obj["jaccard"], check_every=obj["check_every"], min_passed=obj["min_passed"],
                   bootstrap=BootstrapSettings(resamples=obj["resamples"], seed=obj["bootstrap_seed"]),
                   order_seed=obj["order_seed"])


def check_stop_rule(rule: StopRule) -> None:
    """Refuse a rule that cannot work, naming the parameter."""
    if rule.k < 1:
        raise HeadprobeError(f"{param('stable_k', rule.k)}: expected a positive number of heads")
    if not 0.0 < rule.jaccard <= 1.0:
        raise HeadprobeError(f"{param('stable_jaccard', rule.jaccard)}: expected a Jaccard index in (0, 1]")
    if rule.check_every < 1:
        raise HeadprobeError(f"{param('check_every', rule.check_every)}: expected a positive number of trials")


def stability(records: list[dict[str, Any]], gates: dict[str, str], rule: StopRule) -> dict[str, float] | None:
    """Mean top-k Jaccard index per score kind over the passing trials, or ``None`` while fewer than
    ``rule.min_passed`` trials passed (for some kind).

    Parameters
    ----------
    records
        Trial log records.
    gates
        Score kind → the gate its trials must pass (``"published"`` or ``"likelihood"``).
    """
    values = {}
    for kind, gate in gates.items():
        passed = [r for r in records if r["gates"].get(gate)]
        if len(passed) < rule.min_passed:
            return None
        scores = np.array([r["scores"][kind] for r in passed], dtype=np.float64)
        values[kind] = top_k_jaccard(scores, rule.k, rule.bootstrap)
    return values


def is_stable(values: dict[str, float] | None, rule: StopRule) -> bool:
    return values is not None and all(v >= rule.jaccard for v in values.values())


@dataclass
class StopOutcome:
    """How a run with early stopping ended.

    Attributes
    ----------
    stable
        Whether the rule was met (``False``: the grid ran out first).
    trials
        Trials of the grid finished when it stopped.
    grid
        Trials in the grid.
    jaccard
        The last check's values per score kind (``None`` before ``min_passed`` trials passed).
    """

    stable: bool
    trials: int
    grid: int
    jaccard: dict[str, float] | None


def run_until_stable(order: list[TrialSpec], done: dict[str, dict[str, Any]],
                     run_chunk: Callable[[list[TrialSpec]], None], gates: dict[str, str],
                     rule: StopRule) -> StopOutcome:
    """Run ``order`` chunk by chunk until :func:`is_stable` (or the grid is done).

    Parameters
    ----------
    order
        The grid in spread order.
    done
        Finished trials by id (the trial log's); ``run_chunk`` adds to it.
    run_chunk
        Runs a list of trials and logs them.
    gates
        Score kind → gate (see :func:`stability`).
    rule
        The stopping rule.
    """
    ids = {t.id for t in order}
    values = None
    while True:
        finished = sum(1 for i in done if i in ids)
        if finished % rule.check_every == 0 or finished == len(order):
            values = stability([done[t.id] for t in order if t.id in done], gates, rule)
            if is_stable(values, rule):
                return StopOutcome(True, finished, len(order), values)
        if finished == len(order):
            return StopOutcome(False, finished, len(order), values)
        chunk = [t for t in order if t.id not in done][:rule.check_every - finished % rule.check_every]
        run_chunk(chunk)
        if not any(t.id in done for t in chunk):
            raise HeadprobeError("early stopping: a chunk of trials finished without logging any of them")
