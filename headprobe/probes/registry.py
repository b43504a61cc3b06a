"""The probe passes by name: the one list every other list of probes, passes and profile kinds comes from.

A pass runs one kind of trial and keeps one trial log (``<stem>.<pass>.trials.jsonl``); each of its
profile kinds is a probe a user asks for (``probes=[...]``, ``--probe``) and a profile it writes
(``<stem>.<kind>.json``). ``run_profile``'s passes come from here; registering a pass adds its kinds to
the profile file type's table (:mod:`headprobe.profile_kinds`), from which :data:`PROFILE_KINDS`, the
command line's ``--probe`` and ``import --kind`` choices, what a profile file may say it holds and which
profiles an allocator can read all come.

A pass is declared here in one line: its name, its profile kinds, what its profiles hold, and where its
steps are (:class:`~headprobe.probes.pass_steps.PassSteps`: read the input, describe the settings, run
the trials by mode, average the log into profiles), as ``"module:attribute"`` under
``headprobe.probes``. The steps are imported when a run first needs them, so this module imports
nothing but the error types and the kinds table: ``import headprobe`` imports it (so the built-in kinds
are registered before any profile is read) without loading torch or NumPy, and the modules that run a
pass (which write profiles) stay above the profile file type.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import HeadprobeError, param
from ..profile_kinds import HOLDS, PROFILE_KINDS, add_kinds, profile_kinds, remove_kinds


@dataclass(frozen=True)
class ProbePass:
    """One probe pass.

    Attributes
    ----------
    name
        The pass: names its trial log and is ``settings.pass`` in it.
    kinds
        Its profile kinds, in order: a probe is asked for by one of these names, and the pass writes one
        profile per kind asked for.
    holds
        What its profiles hold: ``"head_scores"`` (``[layers][query_heads]`` scores) or
        ``"layer_retention"`` (per task, each layer's share).
    steps
        Where its steps are: ``"module:attribute"`` of a :class:`~headprobe.probes.pass_steps.PassSteps`
        under ``headprobe.probes`` (imported on first use), or the object itself.
    description
        One line for help texts.
    """

    name: str
    kinds: tuple[str, ...]
    holds: str
    steps: Any
    description: str = ""

    @property
    def implementation(self) -> Any:
        """The pass's steps, a :class:`~headprobe.probes.pass_steps.PassSteps` (imported the first time they
        are needed; this module names no other so that it stays below every module that uses it)."""
        if not isinstance(self.steps, str):
            return self.steps
        loaded = _LOADED.get(self.steps)
        if loaded is None:
            module_name, _, attribute = self.steps.partition(":")
            loaded = getattr(importlib.import_module(f"{__package__}.{module_name}"), attribute)
            _LOADED[self.steps] = loaded
        return loaded


#: The built-in passes, in the order their kinds are listed and their logs are run. A new pass: a module
#: that defines its steps, and one line here.
BUILTIN_PASSES = (
    ProbePass("retrieval", ("retrieval", "enhanced_retrieval"), "head_scores", "needle_pass:RETRIEVAL",
              "copy and attention-weight scores of retrieval needles"),
    ProbePass("reasoning", ("retrieval_reasoning",), "head_scores", "needle_pass:REASONING",
              "attention-weight scores of two-fact reasoning needles with a distractor"),
    ProbePass("layer_retention", ("layer_retention",), "layer_retention", "retention_pass:LAYER_RETENTION",
              "each layer's share of the top-ranked tokens of task prompts"),
    ProbePass("contexts", ("context_retrieval", "context_enhanced_retrieval"), "head_scores", "context_pass:CONTEXTS",
              "copy and attention-weight scores of the answer's span in the user's own contexts"),
    ProbePass("query_focus", ("query_focus",), "head_scores", "query_focus_pass:QUERY_FOCUS",
              "attention of the question's tokens to the evidence in the user's own contexts (QRHead)"),
)

_LOADED: dict[str, Any] = {}
_PASSES: dict[str, ProbePass] = {}


def register_pass(probe_pass: ProbePass) -> ProbePass:
    """Add a pass: its kinds become probes ``run_profile`` runs and profile kinds files may hold.

    Raises
    ------
    ValueError
        A pass of that name, or a pass that writes one of its kinds, is already registered; or ``holds``
        is not one of :data:`HOLDS`.
    """
    if probe_pass.name in _PASSES:
        raise ValueError(f"a probe pass named {probe_pass.name!r} is already registered")
    taken = set(profile_kinds()) & set(probe_pass.kinds)
    if taken or not probe_pass.kinds:
        raise ValueError(f"probe pass {probe_pass.name!r}: kinds {', '.join(sorted(taken)) or '(none)'} "
                         "are taken or missing; each kind belongs to one pass")
    if probe_pass.holds not in HOLDS:
        raise ValueError(f"probe pass {probe_pass.name!r}: holds {probe_pass.holds!r}, expected one of {HOLDS}")
    _PASSES[probe_pass.name] = probe_pass
    add_kinds(probe_pass.kinds, probe_pass.holds)
    return probe_pass


def unregister_pass(name: str) -> None:
    """Remove the pass ``name`` (a pass registered for a while, e.g. in a test)."""
    removed = _PASSES.pop(name, None)
    if removed is None:
        return
    remove_kinds(removed.kinds)
    if isinstance(removed.steps, str):
        _LOADED.pop(removed.steps, None)


def probe_passes() -> tuple[ProbePass, ...]:
    """Every registered pass, in registration order."""
    return tuple(_PASSES.values())


def get_pass(name: str) -> ProbePass | None:
    """The pass named ``name`` (``settings.pass`` of a trial log), or ``None``."""
    return _PASSES.get(name)


def pass_of_kind(kind: str) -> ProbePass:
    """The pass that writes profiles of ``kind``.

    Raises
    ------
    HeadprobeError
        ``kind`` is no pass's (named as the ``probes`` parameter).
    """
    for probe_pass in _PASSES.values():
        if kind in probe_pass.kinds:
            return probe_pass
    raise HeadprobeError(f"{param('probes', kind)}: unknown probe; expected one of {', '.join(profile_kinds())}")


def passes_for(probes: Iterable[str]) -> list[ProbePass]:
    """The passes that run ``probes`` (profile kinds), in the order the probes first name them."""
    return list(dict.fromkeys(pass_of_kind(p) for p in probes))


#: The probes ``run_profile`` and ``headprobe profile --probe`` take: every registered pass's profile kinds.
PROBES = PROFILE_KINDS

for _builtin in BUILTIN_PASSES:
    register_pass(_builtin)
