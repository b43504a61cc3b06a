"""A tune's candidates checked against the model: why a setting cannot run (its budget resolved as its eval
runs would resolve it), the profiles found for the model, each prompt's question window, and the pool that
keeps all of it so that each candidate is made once and each budget resolved once per tune
(:class:`CandidatePool`, made before the model loads by :func:`~headprobe.tune.space_check.check_tune_space`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..allocation.api import find_profiles
from ..errors import HeadprobeError
from ..eval.runner import EvalRequest, GridPrompts, resolve_budgets
from ..eval.settings import EvalSetting
from ..profile_kinds import HEAD_SCORE_KINDS, KindNames
from .space import UNIFORM, allocations, candidate, dedupe, preset_seeds, selections

if TYPE_CHECKING:
    from ..models.identity import HasIdentity, ModelIdentity
    from ..models.loading import LoadedModel
    from .request import TuneTask
    from .space import SearchSpace


def setting_problem(lm: HasIdentity, setting: EvalSetting, task: TuneTask, profile_dirs: list[Path] | None,
                    windows: dict[str, int], resolved: dict[str, Any] | None = None) -> str | None:
    """Why ``setting`` cannot run on this model and task (``None`` when it can): its budget does not resolve
    (a missing profile, a capacity no larger than its window) or a question window does not fit. The budget
    resolved for the check is kept in ``resolved`` (by label), so the trials do not resolve it again."""
    try:
        setting.check_policy()
        budgets = resolve_budgets(lm, [setting], profile_dirs)
        if resolved is not None:
            resolved.update(budgets)
        if setting.question_window:
            if task.kind in ("dataset", "ruler"):
                return "window=question needs a prompt whose question the harness placed"
            for item, window in windows.items():
                try:
                    budgets[setting.label](window)
                except HeadprobeError as exc:
                    return f"{exc} (item {item})"
    except HeadprobeError as exc:
        return str(exc)
    return None


def question_windows(lm: LoadedModel, task: TuneTask) -> dict[str, int]:
    """Every item's question window (tokens from its question to the end of the prompt), measured on its
    prompt at the first length and depth; empty for a dataset."""
    if task.kind in ("dataset", "ruler"):
        return {}

    request = EvalRequest([], task.items, list(task.lengths), list(task.depths), task.haystack, {})
    prompts = GridPrompts(lm, request)
    prompts.check_lengths()
    return {i.id: prompts(i, task.lengths[0], task.depths[0]).question_window for i in task.items}


def tune_profiles(identity: ModelIdentity, profile_dirs: list[Path] | None = None) -> dict[str, Any]:
    """The newest profile of each kind the search space's allocations read (head scores of
    :data:`~headprobe.profile_kinds.HEAD_SCORE_KINDS`, then layer retention) that exists for the model
    ``identity``."""
    out = {}
    for kind in (*HEAD_SCORE_KINDS, *KindNames("layer_retention")):
        found = find_profiles(identity, kind, profile_dirs)
        if found:
            out[kind] = found[0].profile
    return out


@dataclass
class CandidatePool:
    """A tune's candidates and what was found about them, each made once: the check before the model loads
    (:func:`~headprobe.tune.space_check.check_tune_space`) makes them, the run (:func:`~headprobe.tune.runner.run_tune`) takes them and adds
    its own.

    A budget resolves from the model's shape and the profiles alone
    (:func:`~headprobe.eval.runner.resolve_budget` reads ``lm.identity``), so what was found for a
    :class:`~headprobe.tune.space_check.ShapeOnly` holds for the loaded model when its identity is equal (:meth:`serves`).

    Attributes
    ----------
    identity
        The :class:`~headprobe.models.identity.ModelIdentity` the budgets were resolved for.
    space
        The search space.
    profile_dirs
        The profile folders budgets resolve from (``None``: the default ones).
    profiles
        The profiles found for the model, by kind (:func:`tune_profiles`).
    problems
        Label → why the setting cannot run (``None``: it can), checked once (a setting whose window is the
        question only once the prompts are known).
    budgets
        Label → the budget resolved as the setting was checked.
    """

    identity: ModelIdentity
    space: SearchSpace
    profile_dirs: list[Path] | None
    profiles: dict[str, Any]
    problems: dict[str, str | None] = field(default_factory=dict)
    budgets: dict[str, Any] = field(default_factory=dict)
    _made: dict[tuple[Any, Any, int], EvalSetting] = field(default_factory=dict, repr=False)
    _stage1: dict[int, list[EvalSetting]] = field(default_factory=dict, repr=False)
    _seeds: dict[int, list[EvalSetting]] = field(default_factory=dict, repr=False)

    def serves(self, lm: LoadedModel, space: SearchSpace, profile_dirs: list[Path] | None) -> bool:
        """Whether what was found holds for ``lm`` (an equal identity), ``space`` and ``profile_dirs``."""
        return self.identity == lm.identity and self.space == space and self.profile_dirs == profile_dirs

    @functools.cached_property
    def selections(self) -> list[Any]:
        """Every selection of the space (:func:`~headprobe.tune.space.selections`)."""
        return selections(self.space)

    @functools.cached_property
    def allocations(self) -> list[Any]:
        """Every allocation the profiles allow (:func:`~headprobe.tune.space.allocations`)."""
        return allocations(self.space, self.profiles)

    def candidate(self, selection: Any, allocation: Any, capacity: int) -> EvalSetting:
        """The setting of ``selection`` and ``allocation`` at ``capacity`` (:func:`~headprobe.tune.space.candidate`),
        made once."""
        key = (selection, allocation, capacity)
        if key not in self._made:
            self._made[key] = candidate(selection, allocation, capacity)
        return self._made[key]

    def selection_stage(self, capacity: int) -> list[EvalSetting]:
        """Every selection with uniform budgets at ``capacity``, those that run the same as an earlier one left
        out."""
        if capacity not in self._stage1:
            self._stage1[capacity] = dedupe([self.candidate(s, UNIFORM, capacity) for s in self.selections])
        return self._stage1[capacity]

    def seeds(self, capacity: int) -> list[EvalSetting]:
        """The presets raced at ``capacity`` (:func:`~headprobe.tune.space.preset_seeds`; none when the space
        races no presets)."""
        if capacity not in self._seeds:
            self._seeds[capacity] = preset_seeds(self.space, capacity) if self.space.presets else []
        return self._seeds[capacity]

    def problem(self, lm: HasIdentity, setting: EvalSetting, task: Any, windows: Mapping[str, int]) -> str | None:
        """Why ``setting`` cannot run (:func:`setting_problem`), checked once; its budget
        is kept in :attr:`budgets`."""
        if setting.label not in self.problems:
            self.problems[setting.label] = setting_problem(lm, setting, task, self.profile_dirs, dict(windows),
                                                           self.budgets)
        return self.problems[setting.label]


__all__ = ("CandidatePool", "question_windows", "setting_problem", "tune_profiles")
