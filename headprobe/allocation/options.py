"""Allocator options: each allocator's options are the fields of one frozen dataclass.

An option is declared once, with :func:`option` (default, one line of help, and optionally its choices,
its command-line flag, the key the budget map records it under and the prefix it gives a default file
name). Everything else is derived from that declaration: the type check (from the field's annotation),
the value checks (the dataclass's :meth:`OptionSet.check`), the ``headprobe allocate`` flags, the options
an eval setting may carry in brackets, and the messages of refusals.

:class:`CapacityOptions` holds what every allocator reads (capacity or ratio, window, sink, clamp); a
subclass of :class:`AllocatorOptions` holds what one allocator reads on top of it.
"""

from __future__ import annotations

import contextlib
import contextvars
import numbers
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import HeadprobeError, param

_UNSET = object()
_IN_SETTING: contextvars.ContextVar[bool] = contextvars.ContextVar("headprobe_allocator_options_in_setting",
                                                                  default=False)


def option(default: Any, help: str, *, choices: Sequence[str] | None = None, flag: str | None = None,
           record: str | None = None, filename: str | None = None, commas: bool = False,
           search: Sequence[Any] | Callable[[Sequence[Any]], Sequence[Any]] | None = None) -> Any:
    """Declare one option as a dataclass field.

    Parameters
    ----------
    default
        The value when the option is not given.
    help
        One line for ``--help`` and the docs.
    choices
        The values a string option may take.
    flag
        The command-line flag when it is not ``--`` + the name with dashes.
    record
        The key of the budget map's ``method`` block that records the option (default: its name).
    filename
        The prefix the option's value gets in ``headprobe allocate``'s default file name (``beta`` →
        ``.beta1.2``); ``None``: the option is not in the file name.
    commas
        The value may hold commas (a task mix ``qa:0.7,code:0.3``); in a setting's brackets the parts
        after a comma that are not ``KEY=VALUE`` continue the value.
    search
        The values ``headprobe tune`` tries for the option: a sequence, or a function of the profiles the
        allocation reads (``[Profile]``) returning one (DynamicKV's ``task``: the profile's task types).
        ``None``: the search keeps the option at its default.
    """
    return field(default=default, metadata={"help": help, "choices": tuple(choices) if choices else None,
                                            "flag": flag, "record": record, "filename": filename,
                                            "commas": commas, "search": search})


@dataclass(frozen=True)
class OptionInfo:
    """One declared option, as the command line, settings and messages read it.

    Attributes
    ----------
    name
        The field name (the keyword of :func:`~headprobe.allocation.api.allocate`, the key in a setting).
    default
        The field's default.
    types
        The Python types a value may have (``type(None)`` when the option may be left unset).
    help, choices, flag, record, filename, commas, search
        As given to :func:`option`; ``flag`` and ``record`` are filled in with their defaults.
    """

    name: str
    default: Any
    types: tuple[type, ...]
    help: str
    choices: tuple[str, ...] | None
    flag: str
    record: str
    filename: str | None
    commas: bool
    search: Sequence[Any] | Callable[[Sequence[Any]], Sequence[Any]] | None = None

    def search_values(self, profiles: Sequence[Any] = ()) -> tuple[Any, ...]:
        """The values a search tries (:func:`option`'s ``search``; the default alone when it has none)."""
        if self.search is None:
            return (self.default,)
        values = self.search(profiles) if callable(self.search) else self.search
        return tuple(values)

    @property
    def cli_type(self) -> type:
        """The type a command-line value is read as (``bool`` for a switch)."""
        return next(t for t in (bool, int, float, str) if t in self.types)

    def expected(self) -> str:
        """What a value must be, in words."""
        words = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
                 Mapping: "a mapping"}
        if self.choices:
            return "one of " + ", ".join(self.choices)
        return " or ".join(words[t] for t in self.types if t in words)

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` has one of the option's types (and is one of its choices)."""
        if value is None:
            return type(None) in self.types
        if self.choices and value not in self.choices:
            return False
        if isinstance(value, bool):
            return bool in self.types
        if isinstance(value, numbers.Integral):         # NumPy integers too
            return int in self.types or float in self.types
        if isinstance(value, numbers.Real):
            return float in self.types
        if isinstance(value, str):
            return str in self.types
        return isinstance(value, Mapping) and Mapping in self.types


def _types_of(hint: Any) -> tuple[type, ...]:
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    out: list[type] = []
    for a in args:
        origin = typing.get_origin(a) or a
        out.append(Mapping if isinstance(origin, type) and issubclass(origin, Mapping) else origin)
    return tuple(out)


@dataclass(frozen=True)
class OptionSet:
    """A frozen dataclass of options: types are checked on construction, then :meth:`check` runs."""

    def __post_init__(self) -> None:
        for info in self.infos():
            value = getattr(self, info.name)
            if not info.accepts(value):
                if info.choices and isinstance(value, str):
                    raise HeadprobeError(f"{info.name} must be one of {', '.join(info.choices)}, got {value!r}")
                raise HeadprobeError(f"{spelled(info.name, value)}: expected {info.expected()}")
        self.check()

    def check(self) -> None:
        """Refuse values out of range (one line); the types are checked already."""

    @classmethod
    def infos(cls) -> tuple[OptionInfo, ...]:
        """Every option, in declaration order."""
        hints = typing.get_type_hints(cls)
        out = []
        for f in fields(cls):
            meta = f.metadata
            out.append(OptionInfo(
                name=f.name, default=f.default, types=_types_of(hints[f.name]), help=meta.get("help", ""),
                choices=meta.get("choices"), flag=meta.get("flag") or "--" + f.name.replace("_", "-"),
                record=meta.get("record") or f.name, filename=meta.get("filename"),
                commas=bool(meta.get("commas")), search=meta.get("search")))
        return tuple(out)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def as_dict(self) -> dict[str, Any]:
        """``{name: value}`` of every option."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class AllocatorOptions(OptionSet):
    """Base of an allocator's own options (a subclass per allocator; no fields: no options)."""


@dataclass(frozen=True)
class CapacityOptions(OptionSet):
    """What every allocator reads: how many tokens per KV head, and which ones every head keeps.

    Checked by :func:`~headprobe.allocation.common.resolve_capacity` when the allocator runs (with its
    messages: ``capacity=128.5: expected a whole number of tokens ...``), not here.
    """

    capacity: int | None = option(128, "average tokens per KV head, window included")
    ratio: float | None = option(None, "capacity as a share of --prompt-len instead")
    prompt_len: int | None = option(None, "prompt length for --ratio and --clamp")
    clamp: bool = option(False, "clamp budgets to --prompt-len, redistributing the excess")
    window: int = option(8, "last prompt tokens every head keeps")
    sink: int = option(0, "first prompt tokens every head keeps")

    def __post_init__(self) -> None:
        """Nothing to check yet: :func:`~headprobe.allocation.common.resolve_capacity` checks every value."""


def format_option_value(value: Any) -> str:
    """An option value as a setting's brackets write it (``true``, ``8``, ``1.01``, ``max``); the setting
    parser reads it back to the same value (floats are written in full)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def spelled(name: str, value: Any = _UNSET) -> str:
    """How a message names an allocator option: as the caller gives it (``beta=0.9`` from Python,
    ``--beta 0.9`` on the command line, see :func:`~headprobe.errors.param`), or as an eval setting's
    bracket option (``setting option beta=0.9``) inside :func:`spelled_as_setting_options`."""
    if _IN_SETTING.get():
        return f"setting option {name}" if value is _UNSET else f"setting option {name}={format_option_value(value)}"
    return param(name) if value is _UNSET else param(name, value)


@contextlib.contextmanager
def spelled_as_setting_options() -> Iterator[None]:
    """Inside the block, :func:`spelled` names allocator options as an eval setting's bracket options."""
    token = _IN_SETTING.set(True)
    try:
        yield
    finally:
        _IN_SETTING.reset(token)


__all__: Sequence[str] = ("AllocatorOptions", "CapacityOptions", "OptionInfo", "OptionSet", "format_option_value",
                          "option", "spelled", "spelled_as_setting_options")
