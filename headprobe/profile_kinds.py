"""The profile kinds a profile file may hold: a table the probe registry fills and the profile reader checks.

Each registered probe pass adds its kinds here with what their profiles hold (:data:`HOLDS`); the profile
file type (:mod:`headprobe.profile`) refuses a file whose ``kind`` is not in the table, and allocation,
tune and the command line list kinds from it. It imports nothing, so the file type, the probe registry
(:mod:`headprobe.probes.registry`, which registers the built-in passes when ``headprobe`` is imported) and
everything above read one list.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

#: What a profile holds: per-head scores, or per-layer retention (what allocation reads them for).
HOLDS = ("head_scores", "layer_retention")

_KINDS: dict[str, str] = {}     # kind -> what its profiles hold, in registration order


def add_kinds(kinds: Iterable[str], holds: str) -> None:
    """Add profile kinds whose profiles hold ``holds`` (one of :data:`HOLDS`); the caller checks that
    none is taken (:func:`~headprobe.probes.registry.register_pass`)."""
    for kind in kinds:
        _KINDS[kind] = holds


def remove_kinds(kinds: Iterable[str]) -> None:
    """Remove profile kinds (those of a pass unregistered again)."""
    for kind in kinds:
        _KINDS.pop(kind, None)


def profile_kinds(holds: str | None = None) -> tuple[str, ...]:
    """Every registered kind, in order (only those whose profiles hold ``holds``, when given)."""
    return tuple(k for k, h in _KINDS.items() if holds is None or h == holds)


class KindNames(Sequence[str]):
    """The registered profile kinds (only those whose profiles hold ``holds``, when given), read from the
    table each time (a pass registered later is in it): iterate it, test membership, index it, join it."""

    def __init__(self, holds: str | None = None) -> None:
        self.holds = holds

    def _names(self) -> tuple[str, ...]:
        return profile_kinds(self.holds)

    def __getitem__(self, index):  # type: ignore[override]
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, value: object) -> bool:
        return value in self._names()

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) and not isinstance(other, str) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._names())


#: Probe kinds a profile can hold: every registered pass's kinds. A probe is asked for by its kind, so
#: these are also the probes ``run_profile`` and ``headprobe profile --probe`` take.
PROFILE_KINDS = KindNames()
#: The kinds whose profiles hold head scores (what a head allocator reads, ``import --kind`` writes and
#: ``headprobe tune`` searches).
HEAD_SCORE_KINDS = KindNames("head_scores")
