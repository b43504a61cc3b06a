"""The search space of ``headprobe tune``: every candidate is an eval setting.

A candidate is a *selection* (a policy that takes a budget map, with the options that decide what a
budget keeps) and an *allocation* (how the budget is split over layers and heads), at one capacity:

- selections: every policy of :data:`~headprobe.runtime.policies.POLICIES` that reads budgets, crossed with the
  values of :data:`POLICY_SEARCH` for the options it declares (the observation window only for the
  policies that observe one, ``observes_window``);
- allocations: every registered allocator (:data:`~headprobe.allocation.registry.ALLOCATORS`) whose
  profiles exist for the model (each head-profile kind found for a head-score allocator), crossed with the
  values its options dataclass declares for the search (``option(..., search=...)``; an option declared
  without ``search`` stays at its default). A new allocator option reaches the space by its declaration.

``--values KEY=V1,V2`` replaces the values of any policy or allocation option. Candidates are built with
:func:`~headprobe.eval.settings.make_setting`, so each one's label reads back to it; a candidate equal to a
preset (same policy, allocation, profiles and options once defaults are filled in) takes the preset's name.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..allocation.allocator import NEEDS
from ..allocation.registry import ALLOCATORS
from ..errors import HeadprobeError, param
from ..eval.presets import EVAL_PRESETS, QUESTION_WINDOW
from ..eval.settings import EvalSetting, SettingSpec, expand_specs, make_setting, parse_spec
from ..profile_kinds import HEAD_SCORE_KINDS
from ..runtime.generate import make_policy
from ..runtime.policies import POLICIES

#: The policy options ``headprobe tune`` searches, and the values it tries (each where the policy declares
#: it): the observation window (HeadKV's 8, SnapKV's 32, the question of each prompt), the pooling kernel
#: (kvpress' 5, SnapKV's and HeadKV's 7) and the pooling type.
POLICY_SEARCH: dict[str, tuple[Any, ...]] = {"window": (8, 32, QUESTION_WINDOW), "kernel_size": (5, 7),
                                             "pooling": ("max", "avg")}

def budget_policies() -> tuple[str, ...]:
    """The policies that read a budget (and so can run a budget map), in registry order."""
    return tuple(name for name, cls in POLICIES.items() if cls.uses_budgets)


def default_policies() -> tuple[str, ...]:
    """The policies searched by default: those that read a budget and prefill with plain attention (one
    recorded prompt forward serves them all; KeyDiff's block-wise prefill runs alone, so it is searched
    only when named)."""
    return tuple(name for name in budget_policies() if POLICIES[name].full_prefill)


def _freeze(options: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(options.items()))


@dataclass(frozen=True)
class Selection:
    """A policy and the options that decide what a budget keeps.

    Attributes
    ----------
    policy
        Runtime policy name.
    options
        ``((name, value), ...)`` the searched options (sorted by name).
    """

    policy: str
    options: tuple[tuple[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "options": dict(self.options)}


@dataclass(frozen=True)
class Allocation:
    """An allocation method with its profiles and option values.

    Attributes
    ----------
    method
        Allocator name (``uniform``: the policy's own even budget).
    profiles
        Profile kinds it reads, in the order of its needs.
    options
        ``((name, value), ...)`` the allocator's options (sorted by name).
    """

    method: str
    profiles: tuple[str, ...] = ()
    options: tuple[tuple[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "profiles": list(self.profiles), "options": dict(self.options)}


UNIFORM = Allocation("uniform")


def parse_tune_values(items: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """``["window=8,32,question", "beta=1.01,1.2"]`` → ``{"window": (8, 32, "question"), ...}``: ints,
    floats, ``true``/``false``, ``none`` (an option's unset value), else text.

    Raises
    ------
    HeadprobeError
        An item that is not ``KEY=V1[,V2...]``, an empty value, or a key given twice.
    """
    out: dict[str, tuple[Any, ...]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or not text.strip():
            raise HeadprobeError(f"{param('values', item)}: expected KEY=V1[,V2,...]")
        if key in out:
            raise HeadprobeError(f"{param('values', item)}: option {key!r} given twice")
        parts = [p.strip() for p in text.split(",")]
        if any(not p for p in parts):
            raise HeadprobeError(f"{param('values', item)}: an empty value")
        out[key] = tuple(dict.fromkeys(_value(p) for p in parts))
    return out


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            continue
    words = {"true": True, "false": False, "none": None}
    return words.get(text.lower(), text)


@dataclass(frozen=True)
class SearchSpace:
    """What ``headprobe tune`` searches.

    Attributes
    ----------
    policies
        Policies that read a budget (default :func:`default_policies`).
    allocations
        Allocator names (default: every registered one).
    values
        Option name → values, replacing :data:`POLICY_SEARCH` or an allocator option's declared values.
    head_kinds
        Head-profile kinds head-score allocators may read (default: every kind found for the model).
    keep_selections
        Selections carried from the first stage to the second (see :mod:`headprobe.tune.runner`).
    presets
        Add the presets whose policy is searched as candidates of the second stage.
    """

    policies: tuple[str, ...] = ()
    allocations: tuple[str, ...] = ()
    values: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    head_kinds: tuple[str, ...] = ()
    keep_selections: int = 2
    presets: bool = True

    def __post_init__(self) -> None:
        if not self.policies:
            object.__setattr__(self, "policies", default_policies())
        if not self.allocations:
            object.__setattr__(self, "allocations", tuple(a for a, x in ALLOCATORS.items() if x.policy is None))
        object.__setattr__(self, "values", {k: tuple(v) for k, v in dict(self.values).items()})

    def to_json(self) -> dict[str, Any]:
        return {"policies": list(self.policies), "allocations": list(self.allocations),
                "values": {k: list(v) for k, v in self.values.items()}, "head_kinds": list(self.head_kinds),
                "keep_selections": self.keep_selections, "presets": self.presets,
                "policy_search": {k: list(v) for k, v in POLICY_SEARCH.items()}}

    def check(self) -> None:
        """Refuse, before the model loads, a space with a policy that reads no budget, an unknown allocation
        or head kind, or ``values`` for an option nothing searched declares or with a value it refuses.

        Raises
        ------
        HeadprobeError
            Naming the parameter and what was expected.
        """
        allowed = budget_policies()
        for p in self.policies:
            if p not in allowed:
                what = "reads no budget" if p in POLICIES else "is no policy"
                raise HeadprobeError(f"{param('policies', p)}: {what}; expected some of {', '.join(allowed)}")
        for a in self.allocations:
            if a not in ALLOCATORS:
                raise HeadprobeError(f"{param('allocations', a)}: expected some of {', '.join(ALLOCATORS)}")
            if ALLOCATORS[a].policy is not None:
                raise HeadprobeError(f"{param('allocations', a)}: makes a layer split for one context, which tune "
                                     f"does not search; make one with `headprobe allocate --method {a}` and "
                                     f"compare it held out with --presets {ALLOCATORS[a].policy}:split.json")
        for k in self.head_kinds:
            if k not in HEAD_SCORE_KINDS:
                raise HeadprobeError(f"{param('head_kinds', k)}: expected some of {', '.join(HEAD_SCORE_KINDS)}")
        if self.keep_selections < 1:
            raise HeadprobeError(f"{param('keep_selections', self.keep_selections)}: expected 1 or more")
        policy_keys = {k for p in self.policies for k in searched_policy_options(p)}
        alloc_keys = {i.name for a in self.allocations for i in ALLOCATORS[a].options.infos()}
        for key, values in self.values.items():
            if key not in policy_keys and key not in alloc_keys:
                raise HeadprobeError(
                    f"{param('values', key)}: no searched policy or allocation has option {key!r} (policy options: "
                    f"{', '.join(sorted(policy_keys)) or 'none'}; allocation options: "
                    f"{', '.join(sorted(alloc_keys)) or 'none'})")
            for value in values:
                self._check_value(key, value)

    def _check_value(self, key: str, value: Any) -> None:
        for p in self.policies:
            if key in searched_policy_options(p):
                if key == "window" and value == QUESTION_WINDOW:
                    continue
                try:
                    make_policy(p, **{key: value})
                except HeadprobeError as exc:
                    raise HeadprobeError(f"{param('values', f'{key}={value}')}: {exc}") from None
        for a in self.allocations:
            allocator = ALLOCATORS[a]
            if key in allocator.options.names():
                try:
                    allocator.check_options({key: value})
                except HeadprobeError as exc:
                    raise HeadprobeError(f"{param('values', f'{key}={value}')}: {exc}") from None

    @functools.cached_property
    def preset_specs(self) -> list[SettingSpec]:
        """The presets whose policy, allocation and head-profile kinds the space searches, parsed once for
        every capacity (:func:`preset_seeds`)."""
        kinds = self.head_kinds or HEAD_SCORE_KINDS
        out = []
        for name, (policy, alloc, profiles, _options) in EVAL_PRESETS.items():
            if policy == "full" or policy not in self.policies or (alloc or "uniform") not in self.allocations:
                continue
            if any(p in HEAD_SCORE_KINDS and p not in kinds for p in profiles):
                continue
            out.append(parse_spec(name))
        return out

    def search_values(self, name: str, declared: Sequence[Any]) -> tuple[Any, ...]:
        """The values tried for option ``name``: ``values[name]`` when given, else ``declared``."""
        return tuple(self.values[name]) if name in self.values else tuple(declared)


def searched_policy_options(policy: str) -> tuple[str, ...]:
    """The options of :data:`POLICY_SEARCH` that ``policy`` declares (the window only where it observes)."""
    cls = POLICIES[policy]
    names = cls.option_names()
    return tuple(k for k in POLICY_SEARCH if k in names and (k != "window" or cls.observes_window))


def selections(space: SearchSpace) -> list[Selection]:
    """Every policy of the space with every combination of its searched option values."""
    out = []
    for policy in space.policies:
        keys = searched_policy_options(policy)
        grids = [space.search_values(k, POLICY_SEARCH[k]) for k in keys]
        for combo in itertools.product(*grids):
            out.append(Selection(policy, _freeze(dict(zip(keys, combo, strict=True)))))
    return out


def allocations(space: SearchSpace, profiles: Mapping[str, Any]) -> list[Allocation]:
    """Every allocation of the space the found profiles allow, with every combination of its option values.

    Parameters
    ----------
    profiles
        Profile kind → the :class:`~headprobe.profile.Profile` found for the model (kinds not found are
        absent; an allocator that needs one of them is left out).
    """
    out: list[Allocation] = []
    heads = [k for k in (space.head_kinds or HEAD_SCORE_KINDS) if k in profiles]
    for name in space.allocations:
        allocator = ALLOCATORS[name]
        choices = [heads if need == "head_scores" else [NEEDS[need].default_kind] for need in allocator.needs]
        for kinds in itertools.product(*choices):
            if any(k not in profiles for k in kinds):
                continue
            found = [profiles[k] for k in kinds]
            infos = allocator.options.infos()
            grids = [space.search_values(i.name, i.search_values(found)) for i in infos]
            for combo in itertools.product(*grids):
                chosen = {i.name: v for i, v in zip(infos, combo, strict=True) if v != i.default}
                out.append(Allocation(name, tuple(kinds), _freeze(chosen)))
    return out


def _policy_defaults(policy: str) -> dict[str, Any]:
    return {f.name: f.default for f in fields(POLICIES[policy])}


def candidate(selection: Selection, allocation: Allocation, capacity: int) -> EvalSetting:
    """The eval setting of a selection and an allocation at ``capacity`` (its label reads back to it)."""
    options = dict(selection.options)
    if allocation.method == "uniform":
        base = selection.policy             # the policy's preset: its own options are implied by its name
        implied = dict(EVAL_PRESETS[base][3]) if base in EVAL_PRESETS and EVAL_PRESETS[base][1] in (None, "uniform") else {}
    else:
        base = f"{selection.policy}:{allocation.method}" + (f":{','.join(allocation.profiles)}"
                                                           if allocation.profiles else "")
        implied = {}
    defaults = {**_policy_defaults(selection.policy), **implied}
    written = {k: v for k, v in options.items() if k not in defaults or defaults[k] != v}
    return make_setting(base, capacity, written, dict(allocation.options))


def canonical(setting: EvalSetting) -> str:
    """What a setting runs, with every default filled in: equal for two settings that run the same."""
    alloc = setting.allocation or "uniform"
    alloc_options: dict[str, Any] = {}
    if alloc in ALLOCATORS:
        alloc_options = {i.name: i.default for i in ALLOCATORS[alloc].options.infos()}
    alloc_options.update(setting.allocation_options)
    options = {**_policy_defaults(setting.policy), **setting.options}
    def plain(values: dict[str, Any]) -> dict[str, Any]:       # 5 and 5.0 run the same
        return {k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in values.items()}

    key = {"policy": setting.policy, "options": plain(options), "allocation": alloc, "profiles": list(setting.profiles),
           "allocation_options": plain(alloc_options), "capacity": setting.capacity}
    return json.dumps(key, sort_keys=True, default=str)


def preset_seeds(space: SearchSpace, capacity: int) -> list[EvalSetting]:
    """The presets at ``capacity`` whose policy, allocation and head-profile kinds the space searches
    (:attr:`SearchSpace.preset_specs`, parsed once); whether their profiles exist for the model is the
    caller's to check."""
    return expand_specs(space.preset_specs, [capacity]) if space.preset_specs else []


def count_candidates(space: SearchSpace, profiles: Mapping[str, Any]) -> tuple[int, int]:
    """Candidates per capacity of each stage, at most: ``(selections, allocation-stage settings)``."""
    n_alloc = len([a for a in allocations(space, profiles) if a != UNIFORM])
    seeds = len(preset_seeds(space, 1)) if space.presets else 0
    n_sel = len(selections(space))
    return n_sel, min(space.keep_selections, n_sel) * (n_alloc + 1) + seeds


def selection_of(setting: EvalSetting) -> Selection:
    """A setting's selection: its policy and the searched options it runs with."""
    options = {**_policy_defaults(setting.policy), **setting.options}
    return Selection(setting.policy, _freeze({k: options[k] for k in searched_policy_options(setting.policy)}))


def dedupe(settings: Sequence[EvalSetting]) -> list[EvalSetting]:
    """``settings`` without those that run the same as an earlier one (the first keeps its name)."""
    seen: dict[str, EvalSetting] = {}
    for s in settings:
        seen.setdefault(canonical(s), s)
    return list(seen.values())


__all__ = ("POLICY_SEARCH", "UNIFORM", "Allocation", "SearchSpace", "Selection", "allocations",
           "budget_policies", "candidate", "canonical", "count_candidates", "dedupe", "default_policies",
           "parse_tune_values", "preset_seeds", "searched_policy_options", "selection_of", "selections")
