"""Sizes as people write them: ``--cache-bytes 2GiB`` and ``--cache-share 5%``, read by tune's memory target
and by a layer split's byte target."""

from __future__ import annotations

import re

from .errors import HeadprobeError, param

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
          "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``"2GiB"`` → 2147483648; ``"500MB"``, ``"1.5 GiB"``, ``"123456"`` (bytes).

    Raises
    ------
    HeadprobeError
        Text that is not a positive size.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if m is None or m.group(2).lower() not in _UNITS or float(m.group(1)) <= 0:
        raise HeadprobeError(f"{param('cache_bytes', text)}: expected a size such as 2GiB, 500MB or 123456 (bytes)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_share(text: str) -> float:
    """``"5%"`` → 0.05; ``"0.05"`` → 0.05.

    Raises
    ------
    HeadprobeError
        Text that is not a share in (0, 1].
    """
    s = str(text).strip()
    try:
        value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise HeadprobeError(f"{param('cache_share', text)}: expected a share of the full cache such as 5% or 0.05")
    return value


__all__ = ("parse_bytes", "parse_share")
