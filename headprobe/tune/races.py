"""A tune's races: per capacity and stage, the candidates that can run raced rung by rung over the calibration
items (successive halving, :mod:`headprobe.tune.halving`), the races of every capacity together so that a
prompt forward serves all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import HeadprobeError
from ..eval.settings import EvalSetting
from .halving import HalvingRule, Standing, rank_rung, rung_items
from .space import UNIFORM, dedupe, selection_of

if TYPE_CHECKING:
    from .trial_runs import TuneRuns


@dataclass
class Race:
    """One capacity's race in one stage.

    Attributes
    ----------
    capacity
        Tokens per KV head.
    candidates
        The settings raced (in the order generated).
    origin
        Label → ``"generated"``, ``"preset"`` or ``"carried"`` (a stage-1 selection with uniform budgets).
    skipped
        Label → why a generated setting could not run (never raced).
    skipped_settings
        Label → the setting skipped (as the report records it).
    rungs
        Per rung: ``{"rung", "items", "trials", "standings": [Standing, ...]}``.
    """

    capacity: int
    candidates: list[EvalSetting]
    origin: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    rungs: list[dict[str, Any]] = field(default_factory=list)
    skipped_settings: dict[str, EvalSetting] = field(default_factory=dict)

    def alive(self) -> list[EvalSetting]:
        if not self.rungs:
            return list(self.candidates)
        kept = {s.label for s in self.rungs[-1]["standings"] if s.kept}
        return [c for c in self.candidates if c.label in kept]

    def final(self) -> list[Standing]:
        return list(self.rungs[-1]["standings"]) if self.rungs else []

    def ranking(self) -> list[str]:
        """Every raced label, best first: by the last rung it ran on (later first), then its rank there."""
        last: dict[str, tuple[int, int]] = {}
        for r in self.rungs:
            for st in r["standings"]:
                last[st.label] = (r["rung"], st.rank)
        return sorted(last, key=lambda lab: (-last[lab][0], last[lab][1]))


def run_races(runs: TuneRuns, stage: str, races: list[Race], calibration: Sequence[str], rule: HalvingRule) -> None:
    """Run the races of every capacity of a stage rung by rung, the trials of all capacities together."""
    task = runs.request.task
    sizes = rung_items(len(calibration), rule.eta)
    for r, m in enumerate(sizes):
        last = r == len(sizes) - 1
        ids = list(calibration[:m])
        keys = task.trial_keys(ids)
        fields_ = [race.alive() for race in races]
        ensure_trials(runs, f"{stage}-r{r}", [c for f in fields_ for c in f], ids)
        for race, field_ in zip(races, fields_, strict=True):
            labels = [c.label for c in field_]
            scores = np.array([runs.store.scores(lab, keys) for lab in labels])
            standings = rank_rung(labels, scores, rule, last, {lab: runs.store.mean_bytes(lab) for lab in labels})
            race.rungs.append({"rung": r, "items": m, "trials": len(keys), "standings": standings})


def ensure_trials(runs: TuneRuns, name: str, settings: Sequence[EvalSetting], ids: Sequence[str]) -> None:
    """Run every setting on the items of ``ids`` it has no trials on yet; settings missing the same items run
    together (one eval run each such group, ``<name>[-k].json``)."""
    task = runs.request.task
    groups: dict[tuple[str, ...], list[EvalSetting]] = {}
    seen: set[str] = set()
    for s in settings:
        if s.label in seen:
            continue
        seen.add(s.label)
        missing = tuple(i for i in ids if not runs.store.has(s.label, task.trial_keys([i])))
        if missing:
            groups.setdefault(missing, []).append(s)
    for k, (missing, group) in enumerate(sorted(groups.items(), key=lambda g: (-len(g[0]), g[0]))):
        runs.run(name if k == 0 else f"{name}-{k}", name, group, missing)


def checked_settings(runs: TuneRuns, settings: Sequence[EvalSetting], windows: dict[str, int], skipped: dict[str, str],
             race: Race | None = None) -> list[EvalSetting]:
    """The settings that can run (:func:`~headprobe.tune.candidates.setting_problem`, each checked once and its budget kept in
    ``runs.budgets``, a preset also raced included); why the others cannot goes in ``skipped`` (and the
    settings in ``race.skipped_settings``)."""
    ok = []
    for s in settings:
        problem = runs.pool.problem(runs.lm, s, runs.request.task, windows)
        if problem is None:
            ok.append(s)
        else:
            skipped[s.label] = problem
            if race is not None:
                race.skipped_settings[s.label] = s
    return ok


def selection_race(runs: TuneRuns, cap: int, windows: dict[str, int]) -> Race:
    """The selection stage's race at capacity ``cap``: every selection with uniform budgets that can run.

    Raises
    ------
    HeadprobeError
        No selection of the space can run at ``cap``.
    """
    race = Race(cap, [])
    race.candidates = checked_settings(runs, runs.pool.selection_stage(cap), windows, race.skipped, race)
    race.origin = {c.label: "generated" for c in race.candidates}
    if not race.candidates:
        raise HeadprobeError(f"capacity {cap}: no selection of the space can run ("
                             + "; ".join(f"{k}: {v}" for k, v in list(race.skipped.items())[:2]) + ")")
    return race


def allocation_race(runs: TuneRuns, race1: Race, windows: dict[str, int]) -> Race:
    """The allocation stage's race at ``race1``'s capacity: its best ``keep_selections`` selections (carried,
    with their trials) crossed with every allocation, plus the preset candidates that can run."""
    pool, cap = runs.pool, race1.capacity
    by_label = {c.label: c for c in race1.candidates}
    carried = [by_label[lab] for lab in race1.ranking()[:runs.request.space.keep_selections]]
    race = Race(cap, [])
    seeds = pool.seeds(cap)
    generated = [pool.candidate(selection_of(c), a, cap) for c in carried for a in pool.allocations if a != UNIFORM]
    entrants = dedupe([*carried, *seeds, *generated])
    origin = {c.label: "carried" for c in carried}
    for seed in seeds:
        origin.setdefault(seed.label, "preset")
    ok = checked_settings(runs, [c for c in entrants if origin.get(c.label) != "carried"], windows, race.skipped,
                          race)
    race.candidates = [c for c in entrants if origin.get(c.label) == "carried" or c in ok]
    race.origin = {c.label: origin.get(c.label, "generated") for c in race.candidates}
    return race


__all__ = ("Race", "allocation_race", "checked_settings", "ensure_trials", "run_races", "selection_race")
