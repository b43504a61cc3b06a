"""Calibration and held-out items: the search sees only the calibration items; the report is on the others.

The split is by item id (a needle, a bAbI question, a dataset row), so no held-out item is ever seen by
the search, at any length or depth. Either the ids are given (``holdout_ids``), or a share of the items is
held out: the items whose ``sha256(seed:id)`` rank lowest, so the split depends only on the ids and the
seed (not on the order they are given in) and adding an item moves no other one across. The calibration
items are searched in the same hash order: rung 0 takes the first of them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import HeadprobeError, param

#: Share of the items held out when no ids are given.
DEFAULT_HOLDOUT_SHARE = 0.3


def hash_order(ids: Sequence[str], seed: int = 0) -> list[str]:
    """``ids`` ordered by ``sha256(f"{seed}:{id}")``: a fixed shuffle that ignores the given order."""
    return sorted(ids, key=lambda i: (hashlib.sha256(f"{seed}:{i}".encode()).hexdigest(), i))


@dataclass(frozen=True)
class Split:
    """The items the search sees and those it never sees.

    Attributes
    ----------
    calibration
        Calibration item ids, in search order (rung 0 first).
    holdout
        Held-out item ids, in the order given.
    rule
        ``{"holdout_ids": [...]}`` or ``{"holdout_share": s, "seed": n}``: how the split was made.
    """

    calibration: tuple[str, ...]
    holdout: tuple[str, ...]
    rule: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"calibration": list(self.calibration), "holdout": list(self.holdout), **self.rule}


def split_items(ids: Sequence[str], holdout_ids: Sequence[str] | None = None,
                holdout_share: float = DEFAULT_HOLDOUT_SHARE, seed: int = 0) -> Split:
    """Split item ids into calibration and held-out ones.

    Parameters
    ----------
    ids
        Every item id of the task.
    holdout_ids
        The held-out ids (some of ``ids``, not all); when given, ``holdout_share`` is not used.
    holdout_share
        Share of the items held out otherwise: ``round(share · n)``, at least one and leaving one.

    Raises
    ------
    HeadprobeError
        Fewer than two items, a held-out id that is not an item (or all of them), or a share outside (0, 1).
    """
    ids = list(dict.fromkeys(ids))
    if len(ids) < 2:
        raise HeadprobeError(f"tune needs at least two items (one to search on, one held out); the task has {len(ids)}")
    if holdout_ids:
        unknown = [i for i in holdout_ids if i not in ids]
        if unknown:
            raise HeadprobeError(f"{param('holdout_ids', unknown[0])}: not an item of the task (items: "
                                 f"{', '.join(ids[:12])}{', ...' if len(ids) > 12 else ''})")
        held = list(dict.fromkeys(holdout_ids))
        if len(held) == len(ids):
            raise HeadprobeError(f"{param('holdout_ids')}: holds every item; leave some to search on")
        rule: dict[str, Any] = {"holdout_ids": held}
    else:
        if isinstance(holdout_share, bool) or not 0 < holdout_share < 1:
            raise HeadprobeError(f"{param('holdout_share', holdout_share)}: expected a share between 0 and 1")
        k = min(max(1, round(holdout_share * len(ids))), len(ids) - 1)
        held = hash_order(ids, seed)[:k]
        rule = {"holdout_share": holdout_share, "seed": seed}
    calibration = [i for i in hash_order(ids, seed) if i not in held]
    return Split(tuple(calibration), tuple(i for i in ids if i in held), rule)


__all__ = ("DEFAULT_HOLDOUT_SHARE", "Split", "hash_order", "split_items")
