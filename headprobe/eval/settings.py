"""Eval settings: which policy, which allocation (and its profiles), with which options, at which capacity.

A setting is written ``NAME`` (a preset, see :data:`EVAL_PRESETS`: each method at its published setting) or
``POLICY[:ALLOCATION[:PROFILE,...]]`` where ``PROFILE`` is a profile kind (``retrieval``,
``retrieval_reasoning``, ``enhanced_retrieval``, ``layer_retention``; the newest matching profile is used)
or a profile file, optionally followed by options in brackets: ``keepkv[key_merge=zip]``,
``snapkv:headkv:retrieval[beta=1.01,window=32]``, ``headkv-r[beta=1.01]``, ``headkv-r[window=question]``
(the observation window set to the question of each prompt, :data:`QUESTION_WINDOW`). Each key goes to the
policy or to the allocation, whichever declares it (the policy class's fields, the allocator's options
dataclass); a key neither declares, one both declare, or one given twice is refused. Every setting except
``full`` is run once per capacity (mean tokens per KV head), or only at the capacities pinned after ``@``:
``headkv-r[window=32]@64,128``.

A budget-map file in the allocation's place, ``POLICY:FILE.json[OPTIONS]`` (a ``headprobe.budget`` file:
written by ``headprobe allocate`` or ``headprobe tune``, or converted by ``headprobe explain --to budget``),
runs the map as it is (:data:`MAP_ALLOCATION`): the map must fit the model, its capacity is its own mean
tokens per KV head (so the setting takes no ``@`` capacity), and the policy options the map records under
``method.run_with`` (for the same policy) are the setting's defaults, its brackets overriding them.

``kvpress:PRESS[OPTIONS]`` runs one of kvpress's presses through kvpress's own pipeline
(:mod:`headprobe.library_bridges.press_settings`): its options are the press's, checked by the press.

A setting's label (``name@capacity``) names every option it runs with beyond its preset's, so
:meth:`EvalSetting.parse` reads a label back to the same setting, and :func:`make_setting` builds a
setting from its parts under such a label.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..allocation.layer_split_choice import split_budget_map
from ..allocation.options import format_option_value, spelled_as_setting_options
from ..allocation.registry import ALLOCATORS, check_allocator_options
from ..errors import HeadprobeError, param
from ..library_bridges.press_settings import KVPRESS, check_press, press_spec
from ..library_bridges.press_settings import PRESSES as KVPRESS_PRESSES
from ..profile_kinds import PROFILE_KINDS
from .presets import EVAL_PRESETS, QUESTION_WINDOW

#: The ``allocation`` of a setting that runs a budget-map file (``POLICY:FILE.json``); its ``profiles`` hold
#: the file.
MAP_ALLOCATION = "map"


def is_map_file(part: str) -> bool:
    """Whether an allocation slot names a budget-map file rather than an allocation method."""
    return part not in ALLOCATORS and (part.endswith(".json") or Path(part).is_file())


def load_setting_map(path: str, written: str) -> Any:
    """The budget map a setting names, checked as the runtime needs it (KV-head budgets).

    Raises
    ------
    HeadprobeError
        A missing or invalid file, or a map per query head.
    """
    # the runtime (torch) loads here: settings parse, and `headprobe --help` runs, without it
    from ..runtime.split_budget import load_budget_file

    if not Path(path).is_file():
        raise HeadprobeError(f"{param('spec', written)}: budget map {path!r}: no such file")
    bm = load_budget_file(path)            # a layer split runs as its budget map (its windows, layer_window)
    if not hasattr(bm, "budgets"):
        bm = split_budget_map(bm)
    if bm.granularity != "kv_head":
        raise HeadprobeError(f"{param('spec', written)}: budget map {path} has budgets per query head "
                             "(compat=headkv); the cache keeps budgets per KV head")
    return bm


def map_capacity(bm: Any) -> int:
    """A budget map's capacity: the mean tokens per KV head it was allocated at (``method.capacity``), else
    its total over its heads, rounded."""
    recorded = bm.method.get("capacity")
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 1:
        return recorded
    heads = len(bm.budgets) * len(bm.budgets[0])
    return max(1, round(bm.total / heads))


def map_run_with(bm: Any, policy: str) -> dict[str, Any]:
    """The policy options a budget map says it runs with (``method.run_with``), when that is ``policy``."""
    run = bm.method.get("run_with")
    if isinstance(run, Mapping) and run.get("policy") == policy and isinstance(run.get("options"), Mapping):
        return dict(run["options"])
    return {}


@dataclass(frozen=True)
class EvalSetting:
    """One (allocation, policy, capacity) setting.

    Attributes
    ----------
    name
        The preset name or the spec as written.
    policy
        Runtime policy name.
    allocation
        Allocation method (``None``: the policy's own uniform budget).
    profiles
        Profile kinds or files the allocation reads.
    capacity
        Mean tokens per KV head; ``None`` for the full cache, and for a setting as :func:`parse_setting` reads
        it, before its capacities.
    options
        Policy options.
    allocation_options
        Options of the allocation method (its options dataclass, ``Allocator.options``), e.g. ``beta``.
    """

    name: str
    policy: str
    allocation: str | None = None
    profiles: tuple[str, ...] = ()
    capacity: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    allocation_options: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``name@capacity`` (the name alone for the full cache): names every option the setting runs with
        beyond its preset's; :meth:`parse` reads it back."""
        return self.name if self.capacity is None else f"{self.name}@{self.capacity}"

    @classmethod
    def parse(cls, label: str, policies: tuple[str, ...] | None = None) -> EvalSetting:
        """The setting a label names: ``EvalSetting.parse(s.label) == s`` for every setting
        :func:`expand_settings` or :func:`make_setting` returns.

        Raises
        ------
        HeadprobeError
            A bad setting, or a label with no capacity (or several) for a setting that needs one.
        """
        pinned = split_capacities(label)[1]
        if pinned is not None and len(pinned) != 1:
            raise HeadprobeError(f"{param('spec', label)}: a label names one capacity")
        return expand_settings([label], [], policies=policies)[0]

    def to_json(self) -> dict[str, Any]:
        """What result files and cell logs record (``allocation_options`` only when there are any, so that
        settings without them are recorded as before they existed)."""
        out = {"label": self.label, "name": self.name, "policy": self.policy, "allocation": self.allocation,
               "profiles": list(self.profiles), "capacity": self.capacity, "options": dict(self.options)}
        if self.allocation_options:
            out["allocation_options"] = dict(self.allocation_options)
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> EvalSetting:
        """The setting :meth:`to_json` recorded."""
        return cls(obj["name"], obj["policy"], obj.get("allocation"), tuple(obj.get("profiles") or ()),
                   obj.get("capacity"), dict(obj.get("options") or {}), dict(obj.get("allocation_options") or {}))

    @property
    def is_kvpress(self) -> bool:
        """Whether kvpress's own pipeline runs the setting (``kvpress:PRESS``,
        :mod:`headprobe.library_bridges.press_settings`)."""
        return self.policy == KVPRESS

    @property
    def question_window(self) -> bool:
        """Whether the observation window is the question of each prompt (``window=question``)."""
        return self.options.get("window") == QUESTION_WINDOW

    def window(self) -> int | str:
        """The observation window the setting's policy runs with: its ``window`` option, else the
        policy's default (:data:`QUESTION_WINDOW` when it is set per prompt)."""
        if "window" in self.options:
            return self.options["window"]
        # the runtime (torch) loads here: settings parse, and `headprobe --help` runs, without it
        from ..runtime.policies import POLICIES

        return POLICIES[self.policy].window

    def with_window(self, window: int) -> EvalSetting:
        """The same setting (same label) with a fixed window, as one trial runs it."""
        return replace(self, options={**self.options, "window": int(window)})

    @functools.cached_property
    def runtime_policy(self) -> Any:
        """The setting's :class:`~headprobe.runtime.policies.Policy`, built once (:func:`built_policy`: one
        instance per policy and options, so a question-window setting builds one per window it runs with,
        :meth:`with_window`); every trial's cache runs this instance (policies keep no state of a run).

        Raises
        ------
        HeadprobeError
            A kvpress setting (its press is no policy), a window still set per prompt, or what building the
            policy refuses.
        """
        if self.policy == KVPRESS:
            raise HeadprobeError(f"setting {self.label}: kvpress runs the press, not a headprobe policy")
        if self.question_window:
            raise HeadprobeError(f"setting {self.label}: its window is set per prompt; run it with_window(size)")
        return built_policy(self.policy, self.options)

    def check_policy(self) -> None:
        """Build the setting's policy once, so that a bad option is refused in one line before any trial
        (a question window is checked as the policy's default window; its size is known per prompt).

        Raises
        ------
        HeadprobeError
            An unknown policy, an option it does not have, or a value it cannot take.
        """
        from ..runtime.policies import POLICIES  # the runtime loads torch; parsing a setting does not

        if self.policy == KVPRESS:
            check_press(self.profiles[0], self.options, self.name)
            return
        if not self.question_window:
            self.runtime_policy  # noqa: B018 (built and kept: the trials run it)
            return
        if self.policy not in POLICIES:
            raise HeadprobeError(f"unknown policy {self.policy!r}")
        built_policy(self.policy, {**self.options, "window": POLICIES[self.policy].window})


#: Policies built by :func:`built_policy`, by policy class and options.
_BUILT_POLICIES: dict[tuple[Any, ...], Any] = {}


def built_policy(policy: str, options: Mapping[str, Any]) -> Any:
    """The policy ``policy`` with ``options`` (:func:`~headprobe.runtime.generate.make_policy`), built once per policy
    class and options (each value's type included: ``5`` and ``5.0`` build two) and shared after that: a
    policy is a dataclass of its options that keeps nothing of a run (the cache holds the run's state).

    Raises
    ------
    HeadprobeError
        An unknown policy, an option it does not have, or a value it cannot take.
    """
    # the runtime (torch) loads here: settings parse, and `headprobe --help` runs, without it
    from ..runtime.generate import make_policy
    from ..runtime.policies import POLICIES

    try:
        key = (POLICIES.get(policy), policy, *sorted((k, type(v), v) for k, v in options.items()))
        hash(key)
    except TypeError:                     # an unhashable option value: built, not kept
        return make_policy(policy, **options)
    if key not in _BUILT_POLICIES:
        _BUILT_POLICIES[key] = make_policy(policy, **options)
    return _BUILT_POLICIES[key]


def _split_brackets(spec: str) -> tuple[str, str | None]:
    """``"keepkv[key_merge=zip]"`` → ``("keepkv", "key_merge=zip")``; no brackets: ``(spec, None)``."""
    if not (spec.endswith("]") and "[" in spec):
        return spec, None
    base, inner = spec[:-1].split("[", 1)
    return base, inner


def _bracket_options(inner: str | None, allocation: str | None, written: str) -> dict[str, Any]:
    """The options in a setting's brackets, values read as ``--option`` reads them (ints, floats,
    true/false, else strings). A part after a comma that is not ``KEY=VALUE`` continues the value of an
    option declared to hold commas (a task mix ``task=qa:0.7,code:0.3``).

    Raises
    ------
    HeadprobeError
        A part that is not ``KEY=VALUE``, or a key given twice.
    """
    if inner is None:
        return {}
    # the runtime (torch) loads here: settings parse, and `headprobe --help` runs, without it
    from ..runtime.generate import parse_policy_options

    allocator = ALLOCATORS.get(allocation) if allocation is not None else None
    commas = {i.name for i in allocator.options.infos() if i.commas} if allocator is not None else set()
    items: list[str] = []
    for part in inner.split(","):
        if not part.strip():
            continue
        if "=" not in part and items and items[-1].split("=", 1)[0] in commas:
            items[-1] += "," + part
        else:
            items.append(part)
    keys = [item.split("=", 1)[0] for item in items if "=" in item]
    for key in keys:
        if keys.count(key) > 1:
            raise HeadprobeError(f"{param('spec', written)}: option {key!r} given twice")
    return parse_policy_options(items, f"{param('spec', written)}:")


def _preset_or_parts(spec: str, policies: tuple[str, ...] | None
                     ) -> tuple[str, str | None, tuple[str, ...], dict[str, Any]]:
    """``(policy, allocation, profiles, preset options)`` of a setting without its brackets."""
    # the runtime (torch) loads here: settings parse, and `headprobe --help` runs, without it
    from ..runtime.policies import POLICIES

    if spec in EVAL_PRESETS:
        policy, alloc, profs, opts = EVAL_PRESETS[spec]
        return policy, alloc, profs, dict(opts)
    parts = spec.split(":")
    if parts[0] == KVPRESS:
        if len(parts) != 2 or not parts[1]:
            raise HeadprobeError(f"{param('spec', spec)}: expected kvpress:PRESS, PRESS one of "
                                 f"{', '.join(KVPRESS_PRESSES)}")
        press_spec(parts[1], spec)
        return KVPRESS, None, (parts[1],), {}
    if len(parts) > 3 or not parts[0]:
        raise HeadprobeError(f"{param('spec', spec)}: expected a preset ({', '.join(EVAL_PRESETS)}) or "
                             "POLICY[:ALLOCATION[:PROFILE,...]]")
    policy = parts[0]
    known = tuple(POLICIES) if policies is None else policies
    if policy not in known or policy not in POLICIES:
        raise HeadprobeError(f"{param('spec', spec)}: unknown policy {policy!r} and no such preset; presets: "
                             f"{', '.join(EVAL_PRESETS)}; policies: {', '.join(sorted(known))}")
    alloc = parts[1] if len(parts) > 1 and parts[1] else None
    if alloc is not None and is_map_file(alloc):
        if len(parts) > 2:
            raise HeadprobeError(f"{param('spec', spec)}: a budget map takes no profiles (POLICY:FILE.json)")
        return policy, MAP_ALLOCATION, (alloc,), {}
    if alloc is not None and alloc not in ALLOCATORS:
        raise HeadprobeError(f"{param('spec', spec)}: unknown allocation {alloc!r}; expected one of "
                             f"{', '.join(ALLOCATORS)}")
    if alloc is not None and ALLOCATORS[alloc].policy not in (None, policy):
        raise HeadprobeError(f"{param('spec', spec)}: allocation {alloc} runs under the {ALLOCATORS[alloc].policy} "
                             f"policy only (an engine's rule), not {policy}")
    if alloc is not None and ALLOCATORS[alloc].policy is not None:    # a split is one context's, not a capacity's
        raise HeadprobeError(f"{param('spec', spec)}: allocation {alloc} makes a layer split for one context and "
                             f"window; make it with `headprobe allocate --method {alloc} --window W --prompt-len N "
                             f"-o split.json` and run {ALLOCATORS[alloc].policy}:split.json")
    profs = tuple(p for p in parts[2].split(",") if p) if len(parts) > 2 else ()
    for p in profs:
        if p not in PROFILE_KINDS and not Path(p).is_file():
            raise HeadprobeError(f"{param('spec', spec)}: profile {p!r} is neither a profile kind "
                                 f"({', '.join(PROFILE_KINDS)}) nor a file")
    if alloc is not None and not profs:
        profs = ALLOCATORS[alloc].default_kinds
    return policy, alloc, profs, {}


def _route(written: str, policy: str, allocation: str | None,
           given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split options between the policy and the allocation, by which of the two declares each key.

    Raises
    ------
    HeadprobeError
        A key neither declares or both declare, or allocation options the allocator refuses.
    """
    # the runtime (torch) loads here: settings parse, and `headprobe --help` runs, without it
    from ..runtime.policies import POLICIES

    policy_keys = POLICIES[policy].option_names()
    allocator = ALLOCATORS.get(allocation) if allocation is not None else None
    alloc_keys = allocator.options.names() if allocator is not None else ()
    to_policy: dict[str, Any] = {}
    to_alloc: dict[str, Any] = {}
    for key, value in given.items():
        if key in policy_keys and key in alloc_keys:
            raise HeadprobeError(f"{param('spec', written)}: option {key!r} is declared by both policy {policy} "
                                 f"and allocation {allocation}, so the setting cannot tell which it is for")
        if key in alloc_keys:
            to_alloc[key] = value
        elif key in policy_keys:
            to_policy[key] = value
        else:
            if allocator is None:
                raise HeadprobeError(f"{param('spec', written)}: option {key!r} is not an option of policy {policy} "
                                     f"({', '.join(policy_keys)}), and the setting has no allocation")
            raise HeadprobeError(f"{param('spec', written)}: option {key!r} is an option of neither policy {policy} "
                                 f"({', '.join(policy_keys)}) nor allocation {allocation} "
                                 f"({', '.join(alloc_keys) or 'none'})")
    if allocator is not None:
        try:
            with spelled_as_setting_options():
                check_allocator_options(allocator, to_alloc)
        except HeadprobeError as exc:
            raise HeadprobeError(f"{param('spec', written)}: {exc}") from None
    return to_policy, to_alloc


def _named(written: str, extra: Mapping[str, Any]) -> str:
    """``written`` with ``extra`` options appended inside its brackets."""
    if not extra:
        return written
    items = ",".join(f"{k}={format_option_value(v)}" for k, v in extra.items())
    base, inner = _split_brackets(written)
    return f"{base}[{inner},{items}]" if inner and inner.strip() else f"{base}[{items}]"


def parse_setting(spec: str, policies: tuple[str, ...] | None = None,
                  extra: Mapping[str, Any] | None = None) -> EvalSetting:
    """Parse one setting spec (without ``@`` capacities): the setting without a capacity, its name the setting as
    written with the options given for every setting (``extra``) that change it appended to its brackets.

    Parameters
    ----------
    spec
        A preset or ``POLICY[:ALLOCATION[:PROFILE,...]]``, optionally with bracketed options.
    policies
        The policies allowed (default: every registered policy).
    extra
        Options for the setting that its brackets do not set (``--option``); those that change what the
        setting runs with are appended to its name.

    Raises
    ------
    HeadprobeError
        Unknown preset, policy, allocation method or profile kind (files must exist); an option neither
        the policy nor the allocation declares, or both do; an option given twice; a bad allocation option.
    """
    written = spec.strip()
    base, inner = _split_brackets(written)
    policy, alloc, profs, preset_options = _preset_or_parts(base, policies)
    bracket = _bracket_options(inner, alloc, written)
    if policy == "full":
        return EvalSetting(written, policy)
    if policy == KVPRESS:           # kvpress's own options, checked by the press (EvalSetting.check_policy)
        return EvalSetting(written, policy, None, profs, None, bracket)
    if alloc == MAP_ALLOCATION:        # the map's own policy options are the defaults its name implies
        bm = load_setting_map(profs[0], written)
        if "layer_split" in bm.method and policy != "layer_window":
            raise HeadprobeError(f"{param('spec', written)}: {profs[0]} is a layer split; it runs under the "
                                 f"layer_window policy only (an engine's rule), not {policy}")
        preset_options = map_run_with(bm, policy)
    more = {k: v for k, v in (extra or {}).items()          # the preset's own values are implied by its name
            if k not in bracket and (k not in preset_options or preset_options[k] != v)}
    name = _named(written, more)
    to_policy, to_alloc = _route(name, policy, alloc, {**more, **bracket})
    return EvalSetting(name, policy, alloc, profs, None, {**preset_options, **to_policy}, to_alloc)


_ABSENT = object()
_PINNED = re.compile(r"(.+)@(\d+(?:,\d+)*)")


def split_capacities(spec: str) -> tuple[str, list[int] | None]:
    """``"headkv-r[window=32]@64,128"`` → ``("headkv-r[window=32]", [64, 128])``; no ``@``: ``None``."""
    m = _PINNED.fullmatch(spec.strip())
    if m is None:
        return spec.strip(), None
    return m.group(1).strip(), [int(c) for c in m.group(2).split(",")]


@dataclass(frozen=True)
class SettingSpec:
    """One setting as written, parsed once, with the capacities pinned after its ``@``: what
    :func:`parse_settings` returns and :func:`expand_specs` expands at capacities without parsing again.

    Attributes
    ----------
    written
        The setting as given (its ``@`` capacities included), as refusals name it.
    parsed
        Its parse (:func:`parse_setting`, without the ``@``).
    pinned
        The capacities pinned after ``@``; ``None`` when it pins none.
    """

    written: str
    parsed: EvalSetting
    pinned: tuple[int, ...] | None = None

    @property
    def spec(self) -> str:
        """The setting as written without its ``@`` capacities."""
        return split_capacities(self.written)[0]


def parse_spec(written: str, options: Mapping[str, Any] | None = None,
               policies: tuple[str, ...] | None = None) -> SettingSpec:
    """Parse one setting as written, ``@`` capacities included (:func:`parse_setting`, :func:`split_capacities`).

    Raises
    ------
    HeadprobeError
        A bad setting (:func:`parse_setting`).
    """
    spec, pinned = split_capacities(written)
    return SettingSpec(written, parse_setting(spec, policies, options), None if pinned is None else tuple(pinned))


def parse_settings(specs: Sequence[str], options: Mapping[str, Any] | None = None,
                   policies: tuple[str, ...] | None = None) -> list[SettingSpec]:
    """Parse settings as written once, at the edge; :func:`expand_specs` expands them at capacities.

    Raises
    ------
    HeadprobeError
        No settings, or a bad one (:func:`parse_setting`).
    """
    if not specs:
        raise HeadprobeError(f"{param('specs')}: give at least one setting")
    return [parse_spec(written, options, policies) for written in specs]


def _expand_one(spec: SettingSpec, capacities: Sequence[int]) -> list[EvalSetting]:
    """The settings of one parsed spec: at its pinned capacities, else at ``capacities`` (``full`` and a
    press without a ratio once, a budget map at its own capacity).

    Raises
    ------
    HeadprobeError
        A capacity pinned where there is none to pin (or other than a map's own), a capacity below 1, or none.
    """
    parsed, written, pinned = spec.parsed, spec.written, spec.pinned
    if parsed.policy == "full" or (parsed.policy == KVPRESS and not press_spec(parsed.profiles[0], spec.spec).ratio):
        if pinned is not None:
            raise HeadprobeError(f"{param('spec', written)}: {'the full cache' if parsed.policy == 'full' else 'this press'}"
                                 " has no capacity to pin")
        return [EvalSetting(parsed.name, parsed.policy, None, parsed.profiles, None, dict(parsed.options))]
    if parsed.allocation == MAP_ALLOCATION:
        caps = [map_capacity(load_setting_map(parsed.profiles[0], written))]
        if pinned is not None and list(pinned) != caps:      # a label names the map's own capacity
            raise HeadprobeError(f"{param('spec', written)}: a budget map's capacity is its own ({caps[0]} "
                                 "tokens per KV head); pin none after @")
    else:
        caps = list(capacities) if pinned is None else list(pinned)
    if any(c < 1 for c in caps):
        raise HeadprobeError(f"{param('spec', written)}: expected positive token counts per head after @")
    if not caps:
        raise HeadprobeError(f"{param('spec', spec.spec)}: needs {param('capacities')}")
    return [EvalSetting(parsed.name, parsed.policy, parsed.allocation, parsed.profiles, int(c),
                        dict(parsed.options), dict(parsed.allocation_options)) for c in caps]


def expand_specs(specs: Iterable[SettingSpec], capacities: Sequence[int]) -> list[EvalSetting]:
    """Settings parsed once (:func:`parse_settings`) at every capacity (``full`` once), or at the capacities
    pinned after their ``@``, without parsing them again.

    Raises
    ------
    HeadprobeError
        No specs, no capacities, a capacity below 1, or a duplicate setting.
    """
    if not specs:
        raise HeadprobeError(f"{param('specs')}: give at least one setting")
    if any(c < 1 for c in capacities):
        raise HeadprobeError(f"{param('capacities', capacities)}: expected positive token counts per head")
    out = [s for spec in specs for s in _expand_one(spec, capacities)]
    labels = [s.label for s in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise HeadprobeError(f"{param('specs')}: {', '.join(dup)} given twice")
    return out


def expand_settings(specs: list[str], capacities: list[int], options: dict[str, Any] | None = None,
                    policies: tuple[str, ...] | None = None) -> list[EvalSetting]:
    """Every spec at every capacity (``full`` once), or at the capacities pinned after its ``@``;
    ``options`` override the presets' options and a spec's own bracketed options override both (the
    ``options`` that change a setting are named in its label).

    Raises
    ------
    HeadprobeError
        A bad spec (:func:`parse_setting`), no capacities, a capacity below 1, or a duplicate setting.
    """
    if not specs:
        raise HeadprobeError(f"{param('specs')}: give at least one setting")
    # parsed one at a time as they expand: the first bad setting, parsed or expanded, is refused
    return expand_specs((parse_spec(written, options, policies) for written in specs), capacities)


def make_setting(base: str, capacity: int | None = None, options: Mapping[str, Any] | None = None,
                 allocation_options: Mapping[str, Any] | None = None) -> EvalSetting:
    """A setting built from its parts, named so that :meth:`EvalSetting.parse` of its label gives it back.

    Parameters
    ----------
    base
        A preset or ``POLICY[:ALLOCATION[:PROFILE,...]]``, without brackets or ``@``.
    capacity
        Mean tokens per KV head (``None`` only for ``full``).
    options
        Policy options; those equal to the preset's are implied by its name and not written.
    allocation_options
        Options of the allocation (its options dataclass), all written.

    Examples
    --------
    >>> make_setting("headkv-r", 64, allocation_options={"beta": 1.01}).label
    'headkv-r[beta=1.01]@64'

    Raises
    ------
    HeadprobeError
        A bad base, an option the policy or the allocation does not declare (or a bad value), or a value
        that cannot be written in a setting (a string that reads back as a number, one holding ``]``).
    """
    base = base.strip()
    if _split_brackets(base)[1] is not None or "@" in base:
        raise HeadprobeError(f"{param('spec', base)}: give the options and the capacity apart from the base")
    plain = parse_setting(base)
    options, allocation_options = dict(options or {}), dict(allocation_options or {})
    written = {k: v for k, v in options.items() if k not in plain.options or plain.options[k] != v}
    written.update(allocation_options)
    name = _named(base, written)
    label = name if capacity is None else f"{name}@{capacity}"
    read = {k: _read_back(name, plain.allocation, k, v) for k, v in written.items()}
    if plain.policy == KVPRESS:           # the press's own options, checked by the press (as parse_setting)
        to_policy, to_alloc = read, {}
    else:
        to_policy, to_alloc = _route(name, plain.policy, plain.allocation, read) if plain.policy != "full" else ({}, {})
    parsed = EvalSetting(name, plain.policy, plain.allocation, plain.profiles, None, {**plain.options, **to_policy},
                         to_alloc)
    [setting] = _expand_one(SettingSpec(label, parsed, None if capacity is None else (int(capacity),)), [])
    if setting.policy == "full":
        return setting
    got = {"policy": setting.options, "allocation": setting.allocation_options}
    wanted = {"policy": {**plain.options, **options}, "allocation": allocation_options}
    for what, other in (("policy", "allocation"), ("allocation", "policy")):
        for key, value in wanted[what].items():
            found = got[what].get(key, _ABSENT)
            if found != value or type(found) is not type(value):
                reads = f"{'an' if other == 'allocation' else 'a'} {other} option" if key in got[other] else repr(found)
                raise HeadprobeError(f"{param('spec', label)}: {what} option {key}={value!r} does not read back from "
                                     f"the setting's name (it reads {reads})")
    return setting


def _read_back(name: str, allocation: str | None, key: str, value: Any) -> Any:
    """What a setting's brackets read for ``key=value`` as :func:`_named` writes it: the value written
    (:func:`~headprobe.allocation.options.format_option_value`) read by the bracket parser
    (:func:`_bracket_options`), so a setting built from its parts is checked value by value, not parsed again.

    Raises
    ------
    HeadprobeError
        A value the brackets cannot hold (as the bracket parser refuses it), or one that reads as more than
        one option.
    """
    got = _bracket_options(f"{key}={format_option_value(value)}", allocation, name)
    if set(got) != {key}:
        raise HeadprobeError(f"{param('spec', name)}: option {key}={value!r} does not read back from the "
                             f"setting's name (it reads {', '.join(f'{k}={v!r}' for k, v in got.items())})")
    return got[key]
