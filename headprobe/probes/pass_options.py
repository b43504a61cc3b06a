"""A probe pass's own options: a dataclass the pass declares, filled from ``ProfileRequest.options``."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError, param

#: Field types a value given as text is converted to.
_FROM_TEXT = {int: int, float: float, str: str, Path: Path}


def build_options(pass_name: str, options: type | None, values: Mapping[str, Any]) -> Any:
    """The options of pass ``pass_name``: ``options(**values)``, values given as text converted to the
    field's type (``int``, ``float``, ``bool``, ``str``, ``Path``, or one of these or ``None``).

    Returns ``None`` for a pass without options and none given.

    Raises
    ------
    HeadprobeError
        A field the options do not have (or any, for a pass without options), or a value that is not of
        its field's type, naming it as ``options``.
    """
    if options is None:
        if values:
            raise HeadprobeError(f"{param('options', pass_name)}: the {pass_name} pass takes no options")
        return None
    fields = {f.name: f for f in dataclasses.fields(options)}
    hints = typing.get_type_hints(options)
    given = {}
    for key, value in values.items():
        if key not in fields:
            raise HeadprobeError(f"{param('options', f'{pass_name}.{key}')}: no such option of the {pass_name} "
                                 f"pass (its options: {', '.join(fields)})")
        given[key] = _converted(value, hints[key], f"{pass_name}.{key}")
    missing = [name for name, f in fields.items() if name not in given and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise HeadprobeError(f"{param('options', f'{pass_name}.{missing[0]}')}: required by the {pass_name} pass")
    return options(**given)


def _converted(value: Any, hint: Any, name: str) -> Any:
    """``value`` as a ``hint`` (text converted; other values checked)."""
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    if value is None and type(None) in allowed:
        return None
    for kind in allowed:
        if kind is type(None):
            continue
        if kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                return value.lower() in ("true", "1", "yes")
            continue
        if isinstance(value, kind) and not isinstance(value, bool):
            return value
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and kind in _FROM_TEXT:
            try:
                return _FROM_TEXT[kind](value)
            except ValueError:
                continue
    names = " or ".join(getattr(k, "__name__", str(k)) for k in allowed)
    raise HeadprobeError(f"{param('options', name)}: expected {names}, found {value!r}")
