"""Budget maps: per (layer, KV head) token budgets, the file the allocator writes and the runtime reads.

A budget map is ``{"format": "headprobe.budget", "version": 1, ...}``; see ``docs/formats.md``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import FileFormatError, HeadprobeError
from .files.jsonio import atomic_write_json, read_headprobe_file, require, require_matrix
from .limits import MAX_TOKENS
from .models.identity import ModelIdentity

BUDGET_FORMAT = "headprobe.budget"
BUDGET_VERSION = 1
GRANULARITIES = ("kv_head", "query_head")


@dataclass
class BudgetMap:
    """Token budgets per layer and KV head.

    Attributes
    ----------
    model
        The model the budgets were allocated for.
    method
        The allocator and every parameter that produced the map: ``allocator``, ``capacity`` or
        ``ratio``, ``window``, ``sink``, ``beta``, ``temperature``, ``reduction``, ``compat``, and
        ``sources`` (list of ``{"kind", "fingerprint", "path"}`` of the profiles used).
    shares
        ``[layers][heads]`` non-negative, summing to 1: the budget distribution independent of prompt
        length, so a runtime can rescale it to any prompt.
    budgets
        ``[layers][heads]`` integer token counts at the reference capacity (window included).
    granularity
        ``"kv_head"`` (each KV head stored once) or ``"query_head"`` (only for ``compat="headkv"``).
    """

    model: ModelIdentity
    method: dict[str, Any]
    shares: list[list[float]]
    budgets: list[list[int]]
    granularity: str = "kv_head"
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    #: The identity the last :meth:`check_fits` that passed was for (not part of the map).
    _fitted: ModelIdentity | None = field(default=None, init=False, repr=False, compare=False)

    def check_fits(self, identity: ModelIdentity, what: str = "budget map") -> None:
        """Refuse the map on a model it was not made for (:meth:`ModelIdentity.check_fits`), once: a map
        allocated for an identity equal to ``identity`` (:func:`~headprobe.allocation.api.allocate` in this
        process, e.g. for the model's shape before it loaded) fits it, and a map checked against ``identity``
        already is not checked again.

        Raises
        ------
        ModelMismatchError
            The map was made for another model.
        """
        if self.model == identity or self._fitted is identity:
            return
        self.model.check_fits(identity, what=what)
        self._fitted = identity

    @property
    def total(self) -> int:
        return sum(sum(row) for row in self.budgets)

    @property
    def per_layer(self) -> list[int]:
        return [sum(row) for row in self.budgets]

    def to_json(self) -> dict[str, Any]:
        flat = sorted(b for row in self.budgets for b in row)
        return {
            "format": BUDGET_FORMAT,
            "version": BUDGET_VERSION,
            "model": self.model.to_json(),
            "granularity": self.granularity,
            "method": self.method,
            "shares": self.shares,
            "budgets": self.budgets,
            "totals": {
                "total": self.total,
                "per_layer": self.per_layer,
                "min": flat[0] if flat else 0,
                "median": flat[len(flat) // 2] if flat else 0,
                "max": flat[-1] if flat else 0,
            },
            "created": self.created,
        }

    def save(self, path: str | Path, force: bool = False) -> Path:
        """Write the map, once :meth:`from_json` (the reader every command uses) accepts it.

        An existing file is replaced only with ``force``, checked as the file is put in place, so a map
        another run wrote meanwhile is never replaced (:mod:`headprobe.files.atomic`).

        Raises
        ------
        HeadprobeError
            A map its own reader would refuse (negative budgets, shares that do not sum to 1, ...), or an
            existing file without ``force``: nothing is written.
        """
        obj = self.to_json()
        try:
            BudgetMap.from_json(json.loads(json.dumps(obj, allow_nan=False)), path)
        except FileFormatError as exc:
            raise HeadprobeError(f"{path}: not written, its reader would refuse it: field '{exc.field}': "
                                 f"{exc.expected}") from None
        except ValueError as exc:     # NaN or infinity
            raise HeadprobeError(f"{path}: not written, its reader would refuse it ({exc})") from None
        return atomic_write_json(path, obj, overwrite=force)

    @classmethod
    def from_json(cls, obj: dict, path: object = "<budget>") -> BudgetMap:
        model = ModelIdentity.from_json(require(obj, "model", dict, path), path)
        granularity = require(obj, "granularity", str, path)
        if granularity not in GRANULARITIES:
            raise FileFormatError(path, "granularity", f"expected one of {', '.join(GRANULARITIES)}")
        heads = model.num_kv_heads if granularity == "kv_head" else model.num_query_heads
        method = require(obj, "method", dict, path)
        require(method, "allocator", str, path, "method.")
        shares = require_matrix(require(obj, "shares", list, path), model.num_layers, heads, path, "shares")
        budgets = require_matrix(require(obj, "budgets", list, path), model.num_layers, heads, path, "budgets",
                                 integer=True, maximum=MAX_TOKENS)
        if any(s < 0 for row in shares for s in row) or not math.isclose(
                math.fsum(s for row in shares for s in row), 1.0, rel_tol=0, abs_tol=1e-6):
            raise FileFormatError(path, "shares", "expected non-negative values summing to 1")
        if any(b < 0 for row in budgets for b in row):
            raise FileFormatError(path, "budgets", "expected non-negative token counts")
        totals = require(obj, "totals", dict, path)
        if require(totals, "total", int, path, "totals.") != sum(map(sum, budgets)):
            raise FileFormatError(path, "totals.total",
                                  f"expected {sum(map(sum, budgets))} (the sum of budgets), found {totals['total']}")
        if "per_layer" in totals:
            found = totals["per_layer"]
            if not isinstance(found, list) or len(found) != len(budgets):
                raise FileFormatError(path, "totals.per_layer", f"expected {len(budgets)} layer totals")
            for i, (row, n) in enumerate(zip(budgets, found, strict=True)):
                if n != sum(row):
                    raise FileFormatError(path, f"totals.per_layer[{i}]",
                                          f"expected {sum(row)} (the sum of layer {i}'s budgets), found {n!r}")
        return cls(model=model, method=method, shares=shares, budgets=budgets, granularity=granularity,
                   created=str(obj.get("created", "")))

    @classmethod
    def load(cls, path: str | Path) -> BudgetMap:
        """Read and validate a budget file."""
        return cls.from_json(read_headprobe_file(path, BUDGET_FORMAT, BUDGET_VERSION), path)
