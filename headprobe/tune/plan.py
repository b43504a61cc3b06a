"""How many trials a tune spends, at most, stage by stage: the bound behind its total ETA.

A race over ``c`` candidates runs rung ``r`` on the first ``m_r`` calibration items
(:func:`~headprobe.tune.halving.rung_items`); at most ``ceil(c_{r-1} / eta)`` candidates go on to a rung
(the race may drop more), and each runs only the items it has no trials on yet. So a race costs at most
``Σ_r c_r · (m_r − m_{r−1}) · cells`` trials, ``cells`` being the lengths × depths of one item. The
allocation stage's carried selections already ran every calibration item in the selection stage and cost
nothing more; the held-out eval runs the full cache, the presets and one chosen setting per capacity on
every held-out item.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from .halving import rung_items


def race_trials(candidates: int, sizes: list[int], eta: int, cells: int) -> int:
    """The most trials a race of ``candidates`` spends over rungs of ``sizes`` items (``cells`` trials an item)."""
    total, alive, done = 0, candidates, 0
    for m in sizes:
        total += alive * (m - done) * cells
        done = m
        alive = math.ceil(alive / eta)
    return total


@dataclass(frozen=True)
class TrialPlan:
    """At most this many trials per stage (all capacities), and in all.

    Attributes
    ----------
    selection, allocation, holdout
        Trials of the selection race, the allocation race and the held-out eval.
    rungs
        Calibration items of each rung.
    cells
        Trials per item (lengths × depths).
    """

    selection: int
    allocation: int
    holdout: int
    rungs: list[int]
    cells: int

    @property
    def total(self) -> int:
        return self.selection + self.allocation + self.holdout

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}

    def describe(self) -> str:
        return (f"at most {self.total} trials: selection {self.selection}, allocation {self.allocation}, "
                f"held-out {self.holdout} ({self.cells} a item; rungs of {', '.join(map(str, self.rungs))} items)")


def plan_trials(request: Any, selections_per_capacity: int, allocation_candidates: int) -> TrialPlan:
    """The :class:`TrialPlan` of ``request`` (a :class:`~headprobe.tune.request.TuneRequest`) with this many
    selections per capacity and allocation-stage candidates per capacity (carried selections included, as
    :func:`~headprobe.tune.space.count_candidates` counts them)."""
    task, rule = request.task, request.rule
    cells = len(task.lengths) * len(task.depths)
    calibration, holdout = list(request.split.calibration), list(request.split.holdout)
    sizes = rung_items(len(calibration), rule.eta) if calibration else []
    caps = len(request.capacities)
    carried = min(request.space.keep_selections, selections_per_capacity)
    selection = caps * race_trials(selections_per_capacity, sizes, rule.eta, cells)
    allocation = caps * race_trials(max(allocation_candidates - carried, 0), sizes, rule.eta, cells)
    held_settings = 1 + caps * (len(request.presets) + 1)
    return TrialPlan(selection, allocation, held_settings * len(holdout) * cells, sizes, cells)
