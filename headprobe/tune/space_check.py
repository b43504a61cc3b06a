"""Refuse a search space none of whose candidates can run, before any eval run (and, where the model's shape
and the profiles found tell, before the model loads).

A candidate that cannot run is skipped and listed in the report; a *space* that leaves nothing to race is an
input error, as is a ``values`` entry every candidate that carries it refuses (``task=bogus``). The checks
resolve every candidate's budget as the eval runs would (:func:`~headprobe.tune.candidates.setting_problem`),
which reads only the model's shape: the loaded model, or its :class:`~headprobe.models.identity.ModelIdentity`
before it loads. Settings whose window is each prompt's question are checked once the prompts are known
(``windows``); before that they count as runnable.

What the check builds (the candidates, why each cannot run, the budgets resolved) is kept in a
:class:`~headprobe.tune.candidates.CandidatePool` that the run takes (:func:`~headprobe.tune.runner.run_tune`), so a tune generates each
candidate once and resolves each budget once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..allocation.registry import ALLOCATORS
from ..errors import HeadprobeError, param
from ..eval.settings import EvalSetting
from .candidates import CandidatePool
from .space import UNIFORM, dedupe, selection_of

if TYPE_CHECKING:
    from ..models.identity import HasIdentity, ModelIdentity


@dataclass(frozen=True)
class ShapeOnly:
    """Stands in for a loaded model where only its shape is read (budgets resolve from ``identity``).

    Attributes
    ----------
    identity
        The model's :class:`~headprobe.models.identity.ModelIdentity`.
    """

    identity: ModelIdentity


def _problems(pool: CandidatePool, lm: HasIdentity, request: Any, settings: Sequence[EvalSetting],
              windows: Mapping[str, int] | None) -> dict[str, str | None]:
    """Label → why the setting cannot run, ``None`` when it can; without ``windows``, a setting whose window
    is the question cannot be checked yet and is left out."""
    return {s.label: pool.problem(lm, s, request.task, windows or {})
            for s in settings if windows is not None or not s.question_window}


def _reasons(problems: Mapping[str, str | None]) -> str:
    failed = [(k, v) for k, v in problems.items() if v][:2]
    return "; ".join(v if v.startswith(f"setting {k}") else f"{k}: {v}" for k, v in failed)


def _allocation_probes(pool: CandidatePool, runnable: Sequence[EvalSetting], capacity: int) -> list[EvalSetting]:
    """Every allocation of the space (uniform aside) with each runnable selection of another window, and the
    preset candidates: what the allocation stage could race at ``capacity``."""
    by_window: dict[Any, EvalSetting] = {}
    for s in runnable:
        by_window.setdefault(s.window(), s)
    allocs = [a for a in pool.allocations if a != UNIFORM]
    probes = [pool.candidate(selection_of(s), a, capacity) for s in by_window.values() for a in allocs]
    return dedupe([*probes, *pool.seeds(capacity)])


def _check_values(space: Any, settings: Sequence[EvalSetting], problems: Mapping[str, str | None]) -> None:
    """Refuse a ``values`` entry of an allocation option that every candidate carrying it refuses, or that
    no candidate carries (its allocations need profiles the model has none of)."""
    readers: dict[str, list[str]] = {}             # allocation option -> the searched allocations that read it
    for name in space.allocations:
        for info in ALLOCATORS[name].options.infos():
            readers.setdefault(info.name, []).append(name)
    for key, values in space.values.items():
        if key in readers and not any(s.allocation in readers[key] and problems.get(s.label) is None
                                      for s in settings):
            raise HeadprobeError(f"{param('values', key)}: no candidate of the space reads {key} (read by "
                                 f"{', '.join(readers[key])}; none of their candidates can run for this model)")
        for value in values:
            carrying = [s for s in settings if key in s.allocation_options and s.allocation_options[key] == value
                        and s.label in problems]
            if carrying and all(problems[s.label] for s in carrying):
                raise HeadprobeError(f"{param('values', f'{key}={value}')}: {problems[carrying[0].label]}")


def check_tune_space(lm: HasIdentity, request: Any, profiles: Mapping[str, Any],
                windows: Mapping[str, int] | None = None) -> CandidatePool:
    """Refuse a space that leaves nothing to race at a capacity, or a ``values`` entry nothing can run with;
    return the candidates made and what was found about them, for the run to take.

    Parameters
    ----------
    lm
        The loaded model, or :class:`ShapeOnly` before it loads.
    request
        The :class:`~headprobe.tune.request.TuneRequest`.
    profiles
        The profiles found for the model (:func:`~headprobe.tune.candidates.tune_profiles`).
    windows
        Item → question window, once the prompts are known; ``None`` before (question-window settings then
        count as runnable).

    Returns
    -------
    CandidatePool
        For :func:`~headprobe.tune.runner.run_tune` (``candidates=``).

    Raises
    ------
    HeadprobeError
        ``capacity C: no selection of the space can run (...)``, ``capacity C: no allocation of the space can
        run (...)`` or ``--values KEY=VALUE: <why every candidate with it is skipped>``.
    """
    space = request.space
    pool = CandidatePool(lm.identity, space, request.profile_dirs, dict(profiles))
    allocation_stage: list[EvalSetting] = []
    problems: dict[str, str | None] = {}
    for cap in request.capacities:
        stage1 = pool.selection_stage(cap)
        first = _problems(pool, lm, request, stage1, windows)
        runnable = [s for s in stage1 if first.get(s.label) is None]      # unchecked question windows count
        if not runnable:
            raise HeadprobeError(f"capacity {cap}: no selection of the space can run ({_reasons(first)})")
        probes = _allocation_probes(pool, runnable, cap)
        second = _problems(pool, lm, request, probes, windows)
        if len(second) == len(probes) > 0 and all(second.values()) and set(space.allocations) != {"uniform"}:
            raise HeadprobeError(f"capacity {cap}: no allocation of the space can run ({_reasons(second)})")
        allocation_stage += probes
        problems.update(second)
    _check_values(space, allocation_stage, problems)
    return pool


__all__ = ("ShapeOnly", "check_tune_space")
