"""A tune's eval runs: each batch of trials run as one eval run in the tune's run folder (rank-aware,
resumable, one progress bar over every stage), and every trial finished so far kept by setting and key.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..distributed.eval_ranks import run_dataset_eval_on_ranks, run_eval_on_ranks
from ..distributed.tune_ranks import share_from_main
from ..eval.runner import EvalRequest
from ..eval.settings import EvalSetting
from .takeover import finish_staging, start_folder

if TYPE_CHECKING:
    from ..models.loading import LoadedModel
    from .candidates import CandidatePool
    from .plan import TrialPlan
    from .request import TuneRequest

#: ``progress(description, total)`` → a callable advanced by the trials just finished.
ProgressFactory = Callable[[str, int], Callable[[int], None]]


def runs_dir(out: str | Path) -> Path:
    """``<dir>/<stem>.runs``: the folder of a tune's eval runs, beside its report."""
    out = Path(out)
    return out.with_name(out.stem + ".runs")


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


__all__ = ("ProgressFactory", "RunRecord", "TrialStore", "TuneRuns", "runs_dir")
