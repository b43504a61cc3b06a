"""What an allocation method is: a name, the profiles it reads, its options and how it runs.

Each method's module defines one :class:`Allocator` (``ALLOCATOR``); :mod:`.registry` lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..budget_map import BudgetMap
from ..errors import HeadprobeError
from ..models.identity import ModelIdentity
from ..profile import Profile
from ..profile_kinds import HEAD_SCORE_KINDS
from .options import AllocatorOptions, CapacityOptions, spelled

#: The head-score profile kind looked up when a head allocator is given no profile.
DEFAULT_HEAD_KIND = "retrieval_reasoning"


@dataclass(frozen=True)
class Need:
    """What a method reads from one profile.

    Attributes
    ----------
    default_kind
        The profile kind looked up when none is given.
    holds
        What that profile holds (one of :data:`~headprobe.profile_kinds.HOLDS`).
    """

    default_kind: str
    holds: str

    @property
    def words(self) -> str:
        """The profile in words, for an error: a head-score profile names every registered head-score kind
        (read from the kinds table when asked, so a pass registered later is named too)."""
        if self.holds != "head_scores":
            return f"a {self.default_kind} profile"
        kinds = tuple(HEAD_SCORE_KINDS)
        return f"a head-score profile ({', '.join(kinds[:-1])} or {kinds[-1]})"


#: What a method can read from profiles, by the name an :class:`Allocator` lists in ``needs``.
NEEDS: dict[str, Need] = {
    "head_scores": Need(DEFAULT_HEAD_KIND, "head_scores"),
    "layer_retention": Need("layer_retention", "layer_retention"),
}

#: One profile the method reads, with the path it was loaded from (``None`` when not from a file).
Source = tuple[Profile, str | None]

#: ``run(model, sources, capacity, options) -> BudgetMap``.
Run = Callable[[ModelIdentity, Sequence[Source], CapacityOptions, AllocatorOptions], BudgetMap]


@dataclass(frozen=True)
class Allocator:
    """One allocation method.

    Attributes
    ----------
    name
        The method name (``allocate(method=...)``, ``--method``, an eval setting's ``ALLOCATION``).
    needs
        What it reads, one profile each, in order: ``"head_scores"`` and/or ``"layer_retention"``
        (keys of :data:`NEEDS`); empty when the model's shape is enough.
    description
        One line for help texts.
    options
        Its options dataclass (:class:`~.options.AllocatorOptions`; the base class itself: none).
    run
        ``run(model, sources, capacity, options) -> BudgetMap``: ``sources`` holds one ``(profile, path)``
        per entry of ``needs``, ``capacity`` the :class:`~.options.CapacityOptions` and ``options`` an
        instance of :attr:`options`. The map's ``method`` block records every option (under
        :attr:`~.options.OptionInfo.record`).
    policy
        The one runtime policy its maps run under (a layer split: ``layer_window``), ``None`` for any; a
        method with one is left out of ``headprobe tune``'s default space.
    """

    name: str
    needs: tuple[str, ...]
    description: str
    options: type[AllocatorOptions]
    run: Run
    policy: str | None = None

    @property
    def default_kinds(self) -> tuple[str, ...]:
        """The profile kinds looked up for ``needs`` when no profile is given."""
        return tuple(NEEDS[n].default_kind for n in self.needs)

    def check_options(self, given: Mapping[str, Any],
                      readers: Callable[[str], Sequence[str]] = lambda name: ()) -> AllocatorOptions:  # noqa: ARG005 (every allocator takes the same arguments)
        """The method's options from ``{name: value}``, checked (names, types and values).

        Parameters
        ----------
        readers
            The methods that read an option, by its name (the registry's
            :func:`~.registry.methods_reading`), named when this method does not read it.

        Raises
        ------
        HeadprobeError
            An option the method does not read (naming the methods that read it), or a bad value.
        """
        names = self.options.names()
        for name, value in given.items():
            if name not in names:
                readers_of = list(readers(name))
                own = ", ".join(spelled(n) for n in names) or "none"
                if readers_of:
                    raise HeadprobeError(f"{spelled(name, value)}: does not apply to method {self.name} (read by "
                                         f"{', '.join(readers_of)}; {self.name}'s options: {own})")
                raise HeadprobeError(f"{spelled(name, value)}: no such option of method {self.name} (its "
                                     f"options: {own})")
        return self.options(**given)


__all__: Sequence[str] = ("DEFAULT_HEAD_KIND", "NEEDS", "Allocator", "Need", "Source")
