"""Eval settings: which policy, which allocation (and its profiles), which capacity.

A setting is written ``NAME`` (a preset, see :data:`PRESETS`) or ``POLICY[:ALLOCATION[:PROFILE,...]]``
where ``PROFILE`` is a profile kind (``retrieval``, ``retrieval_reasoning``, ``enhanced_retrieval``,
``layer_retention``; the newest matching profile is used) or a profile file, optionally followed by policy
options in brackets: ``keepkv[key_merge=zip]``, ``snapkv:headkv[window=16,kernel_size=5]``. Every setting
except ``full`` is run once per capacity (mean tokens per KV head).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError, param

#: name -> (policy, allocation, profiles, policy options)
PRESETS: dict[str, tuple[str, str | None, tuple[str, ...], dict[str, Any]]] = {
    "full": ("full", None, (), {}),
    "streaming": ("streaming", None, (), {}),
    "snapkv": ("snapkv", "uniform", (), {}),
    "pyramid": ("snapkv", "pyramid", (), {}),
    "dynamickv": ("dynamickv", None, (), {}),
    "headkv-r": ("snapkv", "headkv", ("retrieval",), {}),
    "headkv-er": ("snapkv", "headkv", ("enhanced_retrieval",), {}),
    "headkv-r2": ("snapkv", "headkv", ("retrieval_reasoning",), {}),
    "combined": ("snapkv", "combined", ("retrieval_reasoning", "layer_retention"), {}),
    "keydiff": ("keydiff", None, (), {"block_size": 128}),
    "morphkv": ("morphkv", None, (), {}),
    "keepkv": ("keepkv", None, (), {}),
}

PROFILE_KINDS = ("retrieval", "enhanced_retrieval", "retrieval_reasoning", "layer_retention")
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


def expand_settings(specs: list[str], capacities: list[int], options: dict[str, Any] | None = None,
                    policies: tuple[str, ...] | None = None) -> list[EvalSetting]:
    """Every spec at every capacity (``full`` once); ``options`` override the presets' policy options and
    a spec's own bracketed options override both.

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
    for spec in specs:
        name, policy, alloc, profs, opts = parse_setting(spec, policies)
        opts = {**opts, **(options or {}), **split_options(spec)[1]}   # brackets win over ``options``
        if policy == "full":
            out.append(EvalSetting(name, policy, None, (), None, {}))
            continue
        if not capacities:
            raise HeadprobeError(f"{param('spec', spec)}: needs {param('capacities')}")
        out.extend(EvalSetting(name, policy, alloc, profs, int(c), dict(opts)) for c in capacities)
    labels = [s.label for s in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise HeadprobeError(f"{param('specs')}: {', '.join(dup)} given twice")
    return out
