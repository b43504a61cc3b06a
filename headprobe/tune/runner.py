"""``run_tune``: eval run as a search, in two stages of successive-halving races, then a held-out eval.

Every trial is an eval trial and every batch of trials an eval run (:func:`~headprobe.eval.runner.run_eval`, or
:func:`~headprobe.eval.datasets.run_dataset_eval` for a dataset), written as an eval result and cell log in the
tune's run folder (``<out stem>.runs/``): one shared prompt forward per item serves every candidate of
every capacity whose policy prefills with plain attention, an interrupted run resumes cell by cell, and
torchrun ranks split each run as they split an eval.

1. **Selection stage**: every selection of the space (policy and the options that decide what a budget
   keeps) with uniform budgets, per capacity; a race (:mod:`headprobe.tune.halving`) over the calibration
   items ranks them.
2. **Allocation stage**: the best ``keep_selections`` selections of stage 1 crossed with every allocation
   of the space, plus the presets whose policy is searched; a second race chooses one setting per capacity.
3. **Held-out eval**: the full cache, every preset and the chosen settings on the held-out items.

Races of all capacities run rung by rung together, so a prompt forward serves all of them. Which trials
run next depends only on the scores of earlier ones, so a resumed run (or a run over several ranks) makes
the same decisions and asks for the same eval runs, which then resume from their logs: nothing finished
is run again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..distributed.ranks import Ranks
from ..errors import HeadprobeError
from ..eval.presets import QUESTION_WINDOW
from ..eval.settings import EvalSetting, expand_specs
from .candidates import CandidatePool, question_windows, setting_problem, tune_profiles
from .plan import TrialPlan, plan_trials
from .races import Race, allocation_race, checked_settings, ensure_trials, run_races, selection_race
from .request import TuneRequest, TuneTask
from .space import canonical, count_candidates, dedupe
from .trial_runs import ProgressFactory, RunRecord, TrialStore, TuneRuns, runs_dir

if TYPE_CHECKING:
    from ..models.loading import LoadedModel


@dataclass
class TuneOutcome:
    """What :func:`run_tune` found (the report is built from it, :mod:`headprobe.tune.report`).

    Attributes
    ----------
    request
        The request.
    stage1, stage2
        Races per capacity.
    chosen
        Capacity → the chosen setting.
    holdout
        The held-out eval's settings (:meth:`EvalSetting.to_json`) and trials by label.
    holdout_skipped
        Label → why a preset could not run.
    windows
        Item → question window (grid tasks).
    runs
        The eval runs, in order, with what they cost in this process.
    store
        Every trial.
    wall_s, cpu_s
        This process's wall and CPU seconds.
    held_as
        Capacity → the label the chosen setting ran under on the held-out items (a preset's when the chosen
        setting runs the same as a preset).
    plan
        The most trials each stage could spend (:mod:`headprobe.tune.plan`).
    """

    request: TuneRequest
    stage1: list[Race]
    stage2: list[Race]
    chosen: dict[int, EvalSetting]
    holdout_settings: list[EvalSetting]
    holdout_skipped: dict[str, str]
    windows: dict[str, int]
    runs: list[RunRecord]
    store: TrialStore
    wall_s: float = 0.0
    cpu_s: float = 0.0
    held_as: dict[int, str] = field(default_factory=dict)
    plan: TrialPlan | None = None


def run_tune(lm: LoadedModel, request: TuneRequest, out: str | Path, ranks: Any = None, resume: bool = False,
             force: bool = False, progress: ProgressFactory | None = None,
             candidates: CandidatePool | None = None) -> TuneOutcome:
    """Search the space on the calibration items, then evaluate the chosen settings and the presets on the
    held-out ones. Writes the eval runs into :func:`runs_dir` of ``out`` (the report is written by
    :func:`headprobe.tune.report.write_tune_outputs`).

    Parameters
    ----------
    lm
        A :class:`~headprobe.LoadedModel`.
    request
        What to tune.
    out
        The report's path (the run folder is beside it).
    ranks
        :class:`~headprobe.Ranks` of a torchrun launch (default: one process).
    resume, force
        Continue the eval runs from their logs, or replace them.
    progress
        ``progress(description, total)`` → a callable advanced by finished trials.
    candidates
        What :func:`~headprobe.tune.space_check.check_tune_space` made before the model loaded: its candidates,
        their problems and budgets are taken, not made again, when it was made for a model of this identity,
        this space and these profile folders (otherwise, and without it, the run makes its own).

    Raises
    ------
    HeadprobeError
        ``resume`` and ``force`` together, no candidate can run at a capacity, lengths the model or haystack
        cannot hold, or an eval run's refusal (a log made with other settings, held by another run, ...).
    """
    if resume and force:
        raise HeadprobeError("resume and force: a run either continues its logs (resume) or replaces them "
                             "(force), not both")
    ranks = ranks or Ranks()
    wall, cpu = time.perf_counter(), time.process_time()
    space, task, rule = request.space, request.task, request.rule
    task.generate(lm.tokenizer, lm.identity.max_context)        # RULER's samples, for this tokenizer
    windows = question_windows(lm, task)
    pool = _pool(lm, request, candidates)
    runs = TuneRuns(lm, request, out, ranks, resume, force, progress, pool)
    calibration = list(request.split.calibration)

    stage1 = [selection_race(runs, cap, windows) for cap in request.capacities]
    runs.start_total(plan_trials(request, max(len(r.candidates) for r in stage1),
                                 count_candidates(space, pool.profiles)[1]))
    run_races(runs, "selection", stage1, calibration, rule)
    stage2 = [allocation_race(runs, race1, windows) for race1 in stage1]
    run_races(runs, "allocation", stage2, calibration, rule)
    chosen = {race.capacity: next(c for c in race.candidates if c.label == race.final()[0].label) for race in stage2}

    holdout, holdout_skipped, held_as = _held_out(runs, chosen, windows)
    runs.finish_total()
    return TuneOutcome(request, stage1, stage2, chosen, holdout, holdout_skipped, windows, runs.records, runs.store,
                       time.perf_counter() - wall, time.process_time() - cpu, held_as, runs.plan)


def _pool(lm: LoadedModel, request: TuneRequest, given: CandidatePool | None) -> CandidatePool:
    """``given`` when it was made for a model of ``lm``'s identity, the request's space and profile folders (its
    candidates and budgets hold for this run), else a new pool for ``lm``."""
    if given is not None and given.serves(lm, request.space, request.profile_dirs):
        return given
    return CandidatePool(lm.identity, request.space, request.profile_dirs,
                         tune_profiles(lm.identity, request.profile_dirs))


def _held_out(runs: TuneRuns, chosen: dict[int, EvalSetting],
              windows: dict[str, int]) -> tuple[list[EvalSetting], dict[str, str], dict[int, str]]:
    """Run the held-out eval: the full cache, every preset that can run and the chosen settings on the
    held-out items. Returns the settings run, why presets were skipped, and the label each chosen setting ran
    under (a preset's when it runs the same as one)."""
    request = runs.request
    holdout_skipped: dict[str, str] = {}
    full = [EvalSetting("full", "full")]         # the full cache is always held out (the setting "full" names)
    presets = checked_settings(runs, expand_specs(request.presets, list(request.capacities)), windows, holdout_skipped)
    holdout = dedupe([*full, *presets, *chosen.values()])
    same = {canonical(s): s.label for s in holdout}
    held_as = {cap: same[canonical(c)] for cap, c in chosen.items()}     # a preset's label when it is one
    ensure_trials(runs, "holdout", holdout, list(request.split.holdout))
    return holdout, holdout_skipped, held_as


__all__ = (
    "QUESTION_WINDOW",
    "Race",
    "TrialStore",
    "TuneOutcome",
    "TuneRequest",
    "TuneRuns",
    "TuneTask",
    "question_windows",
    "run_tune",
    "runs_dir",
    "setting_problem",
    "tune_profiles",
)
