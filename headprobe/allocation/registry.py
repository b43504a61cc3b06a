"""The allocation methods by name.

:data:`ALLOCATORS` is the one list of methods; ``allocate(method=...)``, eval settings, the command line's
``--method`` choices, its option flags and help all come from it. A method is one module defining
``ALLOCATOR`` (an :class:`~.allocator.Allocator` with its options dataclass) plus its line below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .allocator import NEEDS, Allocator, Source
from .combined import ALLOCATOR as COMBINED
from .dynamickv_offline import ALLOCATOR as DYNAMICKV
from .headkv import ALLOCATOR as HEADKV
from .headkv import DEFAULT_BETA
from .layer_split_methods import HEADS_ALLOCATOR as LAYER_SPLIT_HEADS
from .layer_split_methods import RETENTION_ALLOCATOR as LAYER_SPLIT
from .layer_split_random import ALLOCATOR as LAYER_SPLIT_RANDOM
from .options import AllocatorOptions, OptionInfo
from .pyramid import ALLOCATOR as PYRAMID
from .uniform import ALLOCATOR as UNIFORM

#: Method name → allocator, in the order help texts list them.
ALLOCATORS: dict[str, Allocator] = {a.name: a for a in (HEADKV, DYNAMICKV, COMBINED, UNIFORM, PYRAMID,
                                                          LAYER_SPLIT, LAYER_SPLIT_HEADS, LAYER_SPLIT_RANDOM)}


def option_infos() -> dict[str, OptionInfo]:
    """Every allocator option by name, over all methods (first declaration; a name means one option)."""
    out: dict[str, OptionInfo] = {}
    for allocator in ALLOCATORS.values():
        for info in allocator.options.infos():
            out.setdefault(info.name, info)
    return out


def methods_reading(name: str) -> list[str]:
    """The methods whose options include ``name``."""
    return [a.name for a in ALLOCATORS.values() if name in a.options.names()]


def check_allocator_options(allocator: Allocator, given: Mapping[str, Any]) -> AllocatorOptions:
    """``allocator``'s options from ``{name: value}``, checked; an option it does not read is refused naming
    the registered methods that do (:meth:`~.allocator.Allocator.check_options`)."""
    return allocator.check_options(given, readers=methods_reading)


__all__: Sequence[str] = ("ALLOCATORS", "DEFAULT_BETA", "NEEDS", "Allocator", "Source", "check_allocator_options",
                          "methods_reading",
                          "option_infos")
