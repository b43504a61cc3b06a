"""Eval settings: which policy, which allocation (and its profiles), which capacity.

A setting is written ``NAME`` (a preset, see :data:`PRESETS`: each method at its published setting) or
``POLICY[:ALLOCATION[:PROFILE,...]]`` where ``PROFILE`` is a profile kind (``retrieval``,
``retrieval_reasoning``, ``enhanced_retrieval``, ``layer_retention``; the newest matching profile is used)
or a profile file, optionally followed by policy options in brackets: ``keepkv[key_merge=zip]``,
``snapkv:headkv[window=16,kernel_size=5]``, ``headkv-r[window=question]`` (the observation window set to
the question of each prompt, :data:`QUESTION_WINDOW`). Every setting except ``full`` is run once per
capacity (mean tokens per KV head), or only at the capacities pinned after ``@``: ``headkv-r[window=32]@64,128``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError, param
from ..probes.registry import PROFILE_KINDS
from .presets import PRESETS, QUESTION_WINDOW

ALLOCATIONS = ("uniform", "pyramid", "headkv", "dynamickv", "combined")


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
        Mean tokens per KV head; ``None`` for the full cache.
    options
        Policy options.
    """

    name: str
    policy: str
    allocation: str | None = None
    profiles: tuple[str, ...] = ()
    capacity: int | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name if self.capacity is None else f"{self.name}@{self.capacity}"

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "name": self.name, "policy": self.policy, "allocation": self.allocation,
                "profiles": list(self.profiles), "capacity": self.capacity, "options": dict(self.options)}

    @property
    def question_window(self) -> bool:
        """Whether the observation window is the question of each prompt (``window=question``)."""
        return self.options.get("window") == QUESTION_WINDOW

    def window(self) -> int | str:
        """The observation window the setting's policy runs with: its ``window`` option, else the
        policy's default (:data:`QUESTION_WINDOW` when it is set per prompt)."""
        if "window" in self.options:
            return self.options["window"]
        from ..runtime import POLICIES

        return POLICIES[self.policy].window

    def with_window(self, window: int) -> EvalSetting:
        """The same setting (same label) with a fixed window, as one trial runs it."""
        return replace(self, options={**self.options, "window": int(window)})

    def check_policy(self) -> None:
        """Build the setting's policy once, so that a bad option is refused in one line before any trial
        (a question window is checked as the policy's default window; its size is known per prompt).

        Raises
        ------
        HeadprobeError
            An unknown policy, an option it does not have, or a value it cannot take.
        """
        from ..runtime import POLICIES, make_policy

        options = dict(self.options)
        if self.question_window:
            if self.policy not in POLICIES:
                raise HeadprobeError(f"unknown policy {self.policy!r}")
            options["window"] = POLICIES[self.policy].window
        make_policy(self.policy, **options)


def split_options(spec: str) -> tuple[str, dict[str, Any]]:
    """``"keepkv[key_merge=zip]"`` → ``("keepkv", {"key_merge": "zip"})``."""
    spec = spec.strip()
    if not (spec.endswith("]") and "[" in spec):
        return spec, {}
    from ..runtime.generate import parse_policy_options

    base, inner = spec[:-1].split("[", 1)
    return base, parse_policy_options([x for x in inner.split(",") if x.strip()], f"{param('spec', spec)}:")


def parse_setting(spec: str, policies: tuple[str, ...] | None = None) -> tuple[str, str, str | None,
                                                                               tuple[str, ...], dict[str, Any]]:
    """Parse one setting spec into ``(name, policy, allocation, profiles, options)``.

    Raises
    ------
    HeadprobeError
        Unknown preset, policy, allocation method or profile kind (files must exist).
    """
    name = spec.strip()
    spec, bracket = split_options(name)
    if spec in PRESETS:
        policy, alloc, profs, opts = PRESETS[spec]
        return name, policy, alloc, profs, {**opts, **bracket}
    parts = spec.split(":")
    if len(parts) > 3 or not parts[0]:
        raise HeadprobeError(f"{param('spec', spec)}: expected a preset ({', '.join(PRESETS)}) or "
                             "POLICY[:ALLOCATION[:PROFILE,...]]")
    policy = parts[0]
    if policies is not None and policy not in policies:
        raise HeadprobeError(f"{param('spec', spec)}: unknown policy {policy!r} and no such preset; presets: "
                             f"{', '.join(PRESETS)}; policies: {', '.join(sorted(policies))}")
    alloc = parts[1] if len(parts) > 1 and parts[1] else None
    if alloc is not None and alloc not in ALLOCATIONS:
        raise HeadprobeError(f"{param('spec', spec)}: unknown allocation {alloc!r}; expected one of "
                             f"{', '.join(ALLOCATIONS)}")
    profs = tuple(p for p in parts[2].split(",") if p) if len(parts) > 2 else ()
    for p in profs:
        if p not in PROFILE_KINDS and not Path(p).is_file():
            raise HeadprobeError(f"{param('spec', spec)}: profile {p!r} is neither a profile kind "
                                 f"({', '.join(PROFILE_KINDS)}) nor a file")
    if alloc in ("headkv", "combined", "dynamickv") and not profs:
        profs = {"headkv": ("retrieval_reasoning",), "dynamickv": ("layer_retention",),
                 "combined": ("retrieval_reasoning", "layer_retention")}[alloc]
    return name, policy, alloc, profs, bracket


_PINNED = re.compile(r"(.+)@(\d+(?:,\d+)*)")


def split_capacities(spec: str) -> tuple[str, list[int] | None]:
    """``"headkv-r[window=32]@64,128"`` → ``("headkv-r[window=32]", [64, 128])``; no ``@``: ``None``."""
    m = _PINNED.fullmatch(spec.strip())
    if m is None:
        return spec.strip(), None
    return m.group(1).strip(), [int(c) for c in m.group(2).split(",")]


def expand_settings(specs: list[str], capacities: list[int], options: dict[str, Any] | None = None,
                    policies: tuple[str, ...] | None = None) -> list[EvalSetting]:
    """Every spec at every capacity (``full`` once), or at the capacities pinned after its ``@``;
    ``options`` override the presets' policy options and a spec's own bracketed options override both.

    Raises
    ------
    HeadprobeError
        A bad spec, no capacities, a capacity below 1, or a duplicate setting.
    """
    if not specs:
        raise HeadprobeError(f"{param('specs')}: give at least one setting")
    if any(c < 1 for c in capacities):
        raise HeadprobeError(f"{param('capacities', capacities)}: expected positive token counts per head")
    out: list[EvalSetting] = []
    for written in specs:
        spec, pinned = split_capacities(written)
        name, policy, alloc, profs, opts = parse_setting(spec, policies)
        opts = {**opts, **(options or {}), **split_options(spec)[1]}   # brackets win over ``options``
        if policy == "full":
            if pinned is not None:
                raise HeadprobeError(f"{param('spec', written)}: the full cache has no capacity to pin")
            out.append(EvalSetting(name, policy, None, (), None, {}))
            continue
        caps = capacities if pinned is None else pinned
        if any(c < 1 for c in caps):
            raise HeadprobeError(f"{param('spec', written)}: expected positive token counts per head after @")
        if not caps:
            raise HeadprobeError(f"{param('spec', spec)}: needs {param('capacities')}")
        out.extend(EvalSetting(name, policy, alloc, profs, int(c), dict(opts)) for c in caps)
    labels = [s.label for s in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise HeadprobeError(f"{param('specs')}: {', '.join(dup)} given twice")
    return out
