"""Limits on the numbers users give, and the one-line check of a whole-number parameter.

:data:`MAX_TOKENS` bounds every token count headprobe applies (budgets, capacities, prompt lengths): the
runtime stores token positions as int32, and no model has a context anywhere near it.
"""

from __future__ import annotations

from numbers import Integral
from typing import Any

from .errors import HeadprobeError, param

#: The most tokens a head, a prompt or a capacity can hold (token positions are int32).
MAX_TOKENS = 2**31 - 1


def is_whole_number(value: Any) -> bool:
    """``True`` for Python and NumPy integers (NumPy registers its integer types as
    :class:`numbers.Integral`), not for booleans."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def check_count(name: str, value: Any, minimum: int = 1, maximum: int = MAX_TOKENS, unit: str = "tokens") -> int:
    """Return ``value`` as an ``int`` if it is a whole number in ``[minimum, maximum]``, else refuse it in one
    line that names the parameter through :func:`~headprobe.errors.param`.

    Examples
    --------
    >>> check_count("max_new_tokens", 8)
    8
    >>> check_count("max_new_tokens", 0)
    Traceback (most recent call last):
    ...
    headprobe.errors.HeadprobeError: max_new_tokens=0: expected a whole number of tokens from 1 to 2147483647
    """
    if not is_whole_number(value) or not minimum <= value <= maximum:
        raise HeadprobeError(f"{param(name, value)}: expected a whole number of {unit} from {minimum} to {maximum}")
    return int(value)
