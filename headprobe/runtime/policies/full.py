"""``full``: keep every token (the baseline the compressed policies are measured against)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Policy


@dataclass
class Full(Policy):
    """Keeps the whole prompt and every generated token; stored in the same ragged layout."""

    name: ClassVar[str] = "full"
    uses_budgets: ClassVar[bool] = False
