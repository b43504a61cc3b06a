"""``run_tune``: eval run as a search, in two stages of successive-halving races, then a held-out eval.

Every trial is an eval trial and every batch of trials an eval run (:func:`~headprobe.eval.run_eval`, or
:func:`~headprobe.eval.run_dataset_eval` for a dataset), written as an eval result and cell log in the
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

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import HeadprobeError
from ..eval.presets import PRESETS, QUESTION_WINDOW
from ..eval.settings import EvalSetting, SettingSpec, expand_specs, parse_settings, parse_spec
from .candidates import CandidatePool, found_profiles, question_windows, setting_problem
from .halving import HalvingRule, Standing, rank_rung, rung_items
from .plan import TrialPlan, plan_trials
from .space import UNIFORM, SearchSpace, canonical, count_candidates, dedupe, selection_of
from .split import Split
from .takeover import finish_staging, start_folder

if TYPE_CHECKING:
    from ..models.loading import LoadedModel

#: ``progress(description, total)`` → a callable advanced by the trials just finished.
ProgressFactory = Callable[[str, int], Callable[[int], None]]


@dataclass
class TuneTask:
    """What the candidates are asked: eval items over a length × depth grid, or dataset examples.

    Attributes
    ----------
    kind
        ``needle``, ``babi``, ``dataset`` or ``ruler``.
    items
        :class:`~headprobe.eval.EvalItem` of a grid task (``None`` for a dataset).
    examples
        :class:`~headprobe.eval.QAExample` of a dataset (``None`` for a grid).
    lengths, depths
        The grid (a dataset: ``[max_length]`` and ``[None]``).
    haystack
        The haystack of a grid task.
    description
        The eval result's ``task`` block.
    answer_task
        How a dataset's examples are prompted and scored (``None``: LongBench QA;
        :class:`~headprobe.eval.ruler_task.RulerTask` for RULER).
    generation
        RULER: the calibration and held-out :class:`~headprobe.eval.ruler_generate.GenerationRequest`, whose
        samples :meth:`generate` makes once the tokenizer is loaded (``examples`` is ``None`` until then).
    """

    kind: str
    lengths: list[int]
    depths: list[float | None]
    description: dict[str, Any]
    items: list[Any] | None = None
    examples: list[Any] | None = None
    haystack: Any = None
    answer_task: Any = None
    generation: tuple[Any, Any] | None = None

    @classmethod
    def needles(cls, path: str | Path, ids: Sequence[str] | None, lengths: Sequence[int], depths: Sequence[float],
                haystack: Any) -> TuneTask:
        """The needle task: the needles of ``path`` (``ids`` of them, or all) over a length × depth grid.

        The description names the needle file portably (a shipped file by its place among the shipped
        haystacks, with its fingerprint), so a run resumes from its logs wherever the files lie.
        """
        from ..eval.items import items_from_needles
        from ..haystack.needles import load_needles, needle_set_record
        from ..probes.log_settings import portable_file_name

        needles = load_needles(path, list(ids) if ids else None)
        description = {"kind": "needle", "needles": needle_set_record([Path(path)], needles, portable_file_name),
                       **_haystack_record(haystack)}
        return cls("needle", list(lengths), list(depths), description, items=items_from_needles(needles),
                   haystack=haystack)

    @classmethod
    def babi(cls, count: int, tasks: Sequence[str], seed: int, lengths: Sequence[int], depths: Sequence[float],
             haystack: Any) -> TuneTask:
        """bAbI-style questions (:func:`~headprobe.eval.babi.generate_questions`) over a length × depth grid."""
        from ..eval.babi import generate_questions
        from ..eval.items import items_from_babi

        items = items_from_babi(generate_questions(count, list(tasks), seed))
        description = {"kind": "babi", "count": count, "tasks": list(tasks), "seed": seed,
                       **_haystack_record(haystack)}
        return cls("babi", list(lengths), list(depths), description, items=items, haystack=haystack)

    @classmethod
    def dataset(cls, examples: Sequence[Any], name: str, max_length: int) -> TuneTask:
        """Rows of a QA dataset (:func:`~headprobe.eval.load_qa_dataset`), each prompt cut to ``max_length``."""
        return cls("dataset", [max_length], [None], {"dataset": name}, examples=list(examples))

    @classmethod
    def ruler(cls, calibration: Any, holdout: Any, max_new_tokens: int | None = None) -> TuneTask:
        """RULER's samples made by its own generator for the model's tokenizer: the calibration items from
        ``calibration``, the held-out ones from ``holdout`` (two
        :class:`~headprobe.eval.ruler_generate.GenerationRequest` that differ in their seed), so the held-out
        report is on samples the search never saw. Item ids are ``s<seed>/TASK/LENGTH/INDEX``."""
        from ..eval.ruler_task import RulerTask

        if calibration.seed == holdout.seed:
            raise HeadprobeError(f"RULER tune: the held-out samples need another seed than the calibration's "
                                 f"({calibration.seed})")
        record = {"generated": calibration.to_json(), "holdout_generated": holdout.to_json()}
        return cls("ruler", [0], [None], {"dataset": "ruler", **record}, answer_task=RulerTask(record, max_new_tokens),
                   generation=(calibration, holdout))

    @staticmethod
    def ruler_ids(request: Any) -> list[str]:
        """The item ids of the samples ``request`` makes (``s<seed>/TASK/LENGTH/INDEX``)."""
        return [f"s{request.seed}/{t}/{L}/{i}" for L in request.lengths for t in request.tasks
                for i in range(request.samples)]

    def generate(self, tokenizer: Any, max_context: int | None) -> None:
        """Make a RULER task's samples for ``tokenizer`` (nothing for other tasks); ``max_context`` (the
        model's context) becomes the prompt bound.

        Raises
        ------
        HeadprobeError
            The generator failing, or samples other than the ids announced (:meth:`ruler_ids`).
        """
        if self.generation is None or self.examples is not None:
            return
        from ..eval.ruler_data import load_ruler_dir
        from ..eval.ruler_generate import generate

        examples = []
        for request in self.generation:
            with tempfile.TemporaryDirectory(prefix="headprobe-ruler-") as folder:
                generate(request, tokenizer, folder)
                examples += [replace(ex, id=f"s{request.seed}/{ex.id}")
                             for ex in load_ruler_dir(folder, list(request.tasks))]
        wanted = [i for r in self.generation for i in self.ruler_ids(r)]
        if sorted(ex.id for ex in examples) != sorted(wanted):
            raise HeadprobeError(f"RULER's generator made {len(examples)} samples, not the {len(wanted)} announced")
        self.examples = examples
        self.lengths = [max_context or 2**31 - 1]

    @property
    def ids(self) -> list[str]:
        if self.generation is not None and self.examples is None:
            return [i for r in self.generation for i in self.ruler_ids(r)]
        return [i.id for i in (self.items if self.items is not None else self.examples)]

    def subset(self, ids: Sequence[str]) -> list[Any]:
        chosen = set(ids)
        return [i for i in (self.items if self.items is not None else self.examples) if i.id in chosen]

    def trial_keys(self, ids: Sequence[str]) -> list[tuple[str, int, float | None]]:
        """``(item, length, depth)`` of every trial of ``ids``, sorted (the order the bootstrap reads them in)."""
        return sorted(((i, L, d) for i in ids for L in self.lengths for d in self.depths),
                      key=lambda k: (k[0], k[1], -1.0 if k[2] is None else k[2]))


def _haystack_record(haystack: Any) -> dict[str, Any]:
    return {"haystack": haystack.name, "haystack_fingerprint": haystack.fingerprint}


@dataclass
class TuneRequest:
    """What to tune.

    Attributes
    ----------
    capacities
        Mean tokens per KV head to tune for.
    space
        The search space.
    split
        Calibration and held-out items.
    task
        The task.
    rule
        How races drop candidates.
    presets
        Settings evaluated on the held-out items beside the chosen settings (default: every preset), parsed
        once (:func:`~headprobe.eval.settings.parse_settings`); settings as written are parsed as the request
        is made.
    max_new_tokens, chat_template, share_prefill, profile_dirs
        As in :class:`~headprobe.eval.EvalRequest`.
    memory
        The memory target the capacity came from (:func:`~headprobe.tune.memory.capacity_for`), if any.
    """

    capacities: list[int]
    space: SearchSpace
    split: Split
    task: TuneTask
    rule: HalvingRule = field(default_factory=HalvingRule)
    presets: list[SettingSpec] = field(default_factory=lambda: parse_settings(list(PRESETS)))
    max_new_tokens: int = 24
    chat_template: bool = True
    share_prefill: bool = True
    profile_dirs: list[Path] | None = None
    memory: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.presets = [p if isinstance(p, SettingSpec) else parse_spec(p) for p in self.presets]


def runs_dir(out: str | Path) -> Path:
    """``<dir>/<stem>.runs``: the folder of a tune's eval runs, beside its report."""
    out = Path(out)
    return out.with_name(out.stem + ".runs")


# ---- the trials found so far --------------------------------------------------------------------------

class TrialStore:
    """Every trial finished so far, by setting label, then by ``(item, length, depth)``."""

    def __init__(self) -> None:
        self.trials: dict[str, dict[tuple[str, int, float | None], dict[str, Any]]] = {}

    def add_cells(self, cells: Sequence[dict[str, Any]]) -> None:
        for cell in cells:
            of_setting = self.trials.setdefault(cell["setting"], {})
            for t in cell["trials"]:
                of_setting[(t["item"], cell["length"], cell["depth"])] = t

    def has(self, label: str, keys: Sequence[tuple]) -> bool:
        of_setting = self.trials.get(label, {})
        return all(k in of_setting for k in keys)

    def scores(self, label: str, keys: Sequence[tuple]) -> list[float]:
        of_setting = self.trials[label]
        return [float(of_setting[k]["score"]) for k in keys]

    def of(self, label: str) -> list[tuple[tuple, dict[str, Any]]]:
        """Every trial of ``label``, sorted by key."""
        found = list(self.trials.get(label, {}).items())
        return sorted(found, key=lambda kt: (kt[0][0], kt[0][1], -1.0 if kt[0][2] is None else kt[0][2]))

    def mean_bytes(self, label: str) -> float:
        trials = [t for _, t in self.of(label)]
        return float(np.mean([t["cache_bytes"] for t in trials])) if trials else 0.0


# ---- one eval run ---------------------------------------------------------------------------------------

@dataclass
class RunRecord:
    """One eval run of the tune: which settings on which items, its file and what it cost here."""

    name: str
    stage: str
    settings: int
    items: list[str]
    trials: int
    wall_s: float
    cpu_s: float

    def to_json(self) -> dict[str, Any]:
        return {"file": self.name, "stage": self.stage, "settings": self.settings, "items": self.items,
                "trials": self.trials, "wall_s": round(self.wall_s, 2), "cpu_s": round(self.cpu_s, 2)}


class TuneRuns:
    """Runs eval over the tune's run folder, rank-aware, and keeps every trial in a :class:`TrialStore`."""

    def __init__(self, lm: LoadedModel, request: TuneRequest, out: str | Path, ranks: Any, resume: bool, force: bool,
                 progress: ProgressFactory | None, pool: CandidatePool) -> None:
        self.lm, self.request, self.ranks, self.pool = lm, request, ranks, pool
        self.out = Path(out)
        # a forced run over an earlier one stages its runs until the first is logged (headprobe.tune.takeover)
        self.folder, self.staged = start_folder(runs_dir(out), resume, force, ranks.is_main)
        self.resume, self.force, self.progress = resume, force, progress
        self.store = TrialStore()
        self.budgets = pool.budgets               # label -> budget resolved as the setting was checked (once)
        self.records: list[RunRecord] = []
        self.plan: TrialPlan | None = None
        self._total: Callable[[int], None] | None = None
        self._counted = 0

    def start_total(self, plan: TrialPlan) -> None:
        """One progress bar over every stage, at most ``plan.total`` trials (its ETA is the whole tune's)."""
        self.plan = plan
        if self.progress and self.ranks.is_main:
            self._total = self.progress(f"tune, all stages (at most {plan.total} trials)", plan.total)

    def finish_total(self) -> None:
        """Close the all-stages bar (the races may have spent fewer trials than the plan's bound)."""
        if self._total is not None and self.plan is not None and self._counted < self.plan.total:
            self._total(self.plan.total - self._counted)
        self._total = None

    def _advance_both(self, advance: Callable[[int], None] | None) -> Callable[[int], None] | None:
        if self._total is None:
            return advance

        def both(n: int) -> None:
            if advance is not None:
                advance(n)
            n = min(n, self.plan.total - self._counted)
            if n > 0:
                self._counted += n
                self._total(n)
        return both

    def run(self, name: str, stage: str, settings: list[EvalSetting], ids: Sequence[str]) -> list[dict[str, Any]]:
        """Run ``settings`` on the items ``ids`` as one eval run ``<runs>/<name>.json``; every rank gets the
        merged cells."""
        from ..distributed.eval_ranks import run_dataset_eval_on_ranks, run_eval_on_ranks
        from ..distributed.tune_ranks import share_from_main
        from ..eval.runner import EvalRequest

        req, task = self.request, self.request.task
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{name}.json"
        items = task.subset(ids)
        total = len(items) * len(settings) * len(task.lengths) * len(task.depths)
        advance = self._advance_both(self.progress(f"{stage} ({len(settings)} settings, {len(items)} items)", total)
                                     if self.progress and self.ranks.is_main else None)
        wall, cpu = time.perf_counter(), time.process_time()
        budgets = {s.label: self.budgets[s.label] for s in settings if s.label in self.budgets}
        if task.examples is not None:
            # a dataset eval resolves from the default profile folders: the budgets checked here only when those
            # are the ones the tune reads
            result = run_dataset_eval_on_ranks(self.lm, items, settings, path, self.ranks, task.lengths[0],
                                               req.max_new_tokens, str(task.description.get("dataset")),
                                               req.chat_template, self.resume, self.force, advance,
                                               share_prefill=req.share_prefill, answer_task=task.answer_task,
                                               budgets=budgets if req.profile_dirs is None else None)
        else:
            request = EvalRequest(settings, items, list(task.lengths), list(task.depths), task.haystack,
                                  dict(task.description), req.max_new_tokens, req.chat_template, req.profile_dirs,
                                  req.share_prefill, budgets)
            result = run_eval_on_ranks(self.lm, request, path, self.ranks, resume=self.resume, force=self.force,
                                       progress=advance)
        self.folder, self.staged = finish_staging(self.ranks, self.out, self.folder, self.staged)
        cells = share_from_main(self.ranks, result.cells)
        self.store.add_cells(cells)
        trials = sum(len(c["trials"]) for c in cells)
        self.records.append(RunRecord(path.name, stage, len(settings), list(ids), trials,
                                      time.perf_counter() - wall, time.process_time() - cpu))
        return cells


# ---- races ------------------------------------------------------------------------------------------------

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


def _run_races(runs: TuneRuns, stage: str, races: list[Race], calibration: Sequence[str], rule: HalvingRule) -> None:
    """Run the races of every capacity of a stage rung by rung, the trials of all capacities together."""
    task = runs.request.task
    sizes = rung_items(len(calibration), rule.eta)
    for r, m in enumerate(sizes):
        last = r == len(sizes) - 1
        ids = list(calibration[:m])
        keys = task.trial_keys(ids)
        fields_ = [race.alive() for race in races]
        _ensure(runs, f"{stage}-r{r}", [c for f in fields_ for c in f], ids)
        for race, field_ in zip(races, fields_, strict=True):
            labels = [c.label for c in field_]
            scores = np.array([runs.store.scores(lab, keys) for lab in labels])
            standings = rank_rung(labels, scores, rule, last, {lab: runs.store.mean_bytes(lab) for lab in labels})
            race.rungs.append({"rung": r, "items": m, "trials": len(keys), "standings": standings})


def _ensure(runs: TuneRuns, name: str, settings: Sequence[EvalSetting], ids: Sequence[str]) -> None:
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


# ---- the whole tune ---------------------------------------------------------------------------------------

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


def _checked(runs: TuneRuns, settings: Sequence[EvalSetting], windows: dict[str, int], skipped: dict[str, str],
             race: Race | None = None) -> list[EvalSetting]:
    """The settings that can run (:func:`setting_problem`, each checked once and its budget kept in
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


def run_tune(lm: LoadedModel, request: TuneRequest, out: str | Path, ranks: Any = None, resume: bool = False,
             force: bool = False, progress: ProgressFactory | None = None,
             candidates: CandidatePool | None = None) -> TuneOutcome:
    """Search the space on the calibration items, then evaluate the chosen settings and the presets on the
    held-out ones. Writes the eval runs into :func:`runs_dir` of ``out`` (the report is written by
    :func:`headprobe.tune.report.write_outputs`).

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
        What :func:`~headprobe.tune.space_check.check_space` made before the model loaded: its candidates,
        their problems and budgets are taken, not made again, when it was made for a model of this identity,
        this space and these profile folders (otherwise, and without it, the run makes its own).

    Raises
    ------
    HeadprobeError
        ``resume`` and ``force`` together, no candidate can run at a capacity, lengths the model or haystack
        cannot hold, or an eval run's refusal (a log made with other settings, held by another run, ...).
    """
    from ..distributed.ranks import Ranks

    if resume and force:
        raise HeadprobeError("resume and force: a run either continues its logs (resume) or replaces them "
                             "(force), not both")
    ranks = ranks or Ranks()
    wall, cpu = time.perf_counter(), time.process_time()
    space, task, rule = request.space, request.task, request.rule
    task.generate(lm.tokenizer, lm.identity.max_context)        # RULER's samples, for this tokenizer
    windows = question_windows(lm, task)
    pool = candidates
    if pool is None or not pool.serves(lm, space, request.profile_dirs):
        pool = CandidatePool(lm.identity, space, request.profile_dirs, found_profiles(lm.identity, request.profile_dirs))
    runs = TuneRuns(lm, request, out, ranks, resume, force, progress, pool)
    calibration = list(request.split.calibration)

    stage1 = [_selection_race(runs, cap, windows) for cap in request.capacities]
    runs.start_total(plan_trials(request, max(len(r.candidates) for r in stage1),
                                 count_candidates(space, pool.profiles)[1]))
    _run_races(runs, "selection", stage1, calibration, rule)
    stage2 = [_allocation_race(runs, race1, windows) for race1 in stage1]
    _run_races(runs, "allocation", stage2, calibration, rule)
    chosen = {race.capacity: next(c for c in race.candidates if c.label == race.final()[0].label) for race in stage2}

    holdout_skipped: dict[str, str] = {}
    full = [EvalSetting("full", "full")]         # the full cache is always held out (the setting "full" names)
    presets = _checked(runs, expand_specs(request.presets, list(request.capacities)), windows, holdout_skipped)
    holdout = dedupe([*full, *presets, *chosen.values()])
    same = {canonical(s): s.label for s in holdout}
    held_as = {cap: same[canonical(c)] for cap, c in chosen.items()}     # a preset's label when it is one
    _ensure(runs, "holdout", holdout, list(request.split.holdout))
    runs.finish_total()
    return TuneOutcome(request, stage1, stage2, chosen, holdout, holdout_skipped, windows, runs.records, runs.store,
                       time.perf_counter() - wall, time.process_time() - cpu, held_as, runs.plan)


def _selection_race(runs: TuneRuns, cap: int, windows: dict[str, int]) -> Race:
    """The selection stage's race at capacity ``cap``: every selection with uniform budgets that can run.

    Raises
    ------
    HeadprobeError
        No selection of the space can run at ``cap``.
    """
    race = Race(cap, [])
    race.candidates = _checked(runs, runs.pool.selection_stage(cap), windows, race.skipped, race)
    race.origin = {c.label: "generated" for c in race.candidates}
    if not race.candidates:
        raise HeadprobeError(f"capacity {cap}: no selection of the space can run ("
                             + "; ".join(f"{k}: {v}" for k, v in list(race.skipped.items())[:2]) + ")")
    return race


def _allocation_race(runs: TuneRuns, race1: Race, windows: dict[str, int]) -> Race:
    """The allocation stage's race at ``race1``'s capacity: its best ``keep_selections`` selections (carried,
    with their trials) crossed with every allocation, plus the preset candidates that can run."""
    pool, cap = runs.pool, race1.capacity
    by_label = {c.label: c for c in race1.candidates}
    carried = [by_label[lab] for lab in race1.ranking()[:runs.request.space.keep_selections]]
    race = Race(cap, [])
    seeds = pool.seeds(cap)
    generated = [pool.candidate(selection_of(c), a, cap) for c in carried for a in pool.allocations if a != UNIFORM]
    pool = dedupe([*carried, *seeds, *generated])
    origin = {c.label: "carried" for c in carried}
    for seed in seeds:
        origin.setdefault(seed.label, "preset")
    ok = _checked(runs, [c for c in pool if origin.get(c.label) != "carried"], windows, race.skipped, race)
    race.candidates = [c for c in pool if origin.get(c.label) == "carried" or c in ok]
    race.origin = {c.label: origin.get(c.label, "generated") for c in race.candidates}
    return race


__all__ = ("QUESTION_WINDOW", "Race", "TrialStore", "TuneOutcome", "TuneRequest", "TuneRuns", "TuneTask",
           "found_profiles", "question_windows", "run_tune", "runs_dir", "setting_problem")
