"""The result of ``headprobe explain``: a budget in tokens and bytes, and what each engine allocates for it.

Written as JSON ``{"format": "headprobe.explain", "version": 1, ...}`` (see ``docs/explain.md``).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..budget_map import BudgetMap
from ..files.jsonio import atomic_write_json
from ..files.overwrite import check_overwrite
from ..models.identity import ModelIdentity
from .engines.allocation import EngineAllocation
from .engines.headprobe_runtime import generate_command
from .setting import Setting

EXPLAIN_FORMAT = "headprobe.explain"
EXPLAIN_VERSION = 1


@dataclass
class Explanation:
    """A budget at a setting, and each engine's allocation for it.

    Attributes
    ----------
    model
        The model explained for.
    setting
        Context, batch, dtype and decoding length.
    source
        What was read: ``{"kind", "paths", "fingerprint", "description", ...the options that apply}``.
    budget
        ``int64 [layers][kv_heads]`` tokens the budget keeps per KV head at ``setting.context`` (what
        headprobe's runtime keeps for it; DuoAttention, HeadKV and kvpress inputs through their equivalent
        budget map).
    budget_map
        That budget map (the input itself for a budget map; allocated from a profile; converted otherwise).
    run_with
        ``{"policy", "options"}``: how headprobe's runtime runs ``budget_map``.
    engines
        One :class:`~headprobe.explain.engines.allocation.EngineAllocation` per engine and setting.
    notes
        Notes about the input as a whole.
    """

    model: ModelIdentity
    setting: Setting
    source: dict[str, Any]
    budget: np.ndarray
    budget_map: BudgetMap
    run_with: dict[str, Any]
    engines: list[EngineAllocation]
    notes: list[str] = field(default_factory=list)
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))

    # ---- sizes -----------------------------------------------------------------------------------

    @property
    def token_bytes(self) -> int:
        """Bytes of one token of one KV head (key and value)."""
        return self.setting.token_bytes(self.model.head_dim)

    def full_tokens(self, end: bool = False) -> int:
        """Tokens a full cache holds for one sequence: ``layers · kv_heads · N`` (``+ M - 1`` at the end)."""
        n = self.setting.context + (self.setting.appended if end else 0)
        return self.model.num_layers * self.model.num_kv_heads * n

    def full_bytes(self, end: bool = False) -> int:
        """Bytes of a full cache (keys and values of every layer and KV head) for the whole batch."""
        return self.full_tokens(end) * self.token_bytes * self.setting.batch

    @property
    def budget_bytes(self) -> np.ndarray:
        """``int64 [layers][kv_heads]`` bytes of the budget's keys and values for the whole batch."""
        return self.budget * self.token_bytes * self.setting.batch

    def share(self, nbytes: int | None, end: bool = False) -> float | None:
        """``nbytes`` as a share of the full cache's bytes."""
        return None if nbytes is None else nbytes / self.full_bytes(end)

    # ---- output ----------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        b = np.asarray(self.budget, dtype=np.int64)
        return {
            "format": EXPLAIN_FORMAT, "version": EXPLAIN_VERSION, "model": self.model.to_json(),
            "setting": {"context": self.setting.context, "batch": self.setting.batch, "dtype": self.setting.dtype,
                        "element_bytes": self.setting.element_bytes, "max_new_tokens": self.setting.max_new_tokens,
                        "token_bytes": self.token_bytes},
            "source": self.source,
            "full_cache": {"tokens": self.full_tokens(), "bytes": self.full_bytes(),
                           "tokens_end": self.full_tokens(True), "bytes_end": self.full_bytes(True)},
            "budget": {"tokens": b.tolist(), "bytes": self.budget_bytes.tolist(), "per_layer": b.sum(axis=1).tolist(),
                       "total_tokens": int(b.sum()), "total_bytes": int(self.budget_bytes.sum()),
                       "share": float(b.sum()) / self.full_tokens(), "run_with": self.run_with},
            "engines": [{**e.to_json(), "share_prefill": self.share(e.bytes_prefill),
                         "share_end": self.share(e.bytes_end, True)} for e in self.engines],
            "notes": list(self.notes), "created": self.created,
        }

    def save_json(self, path: str | Path, force: bool = False) -> Path:
        """Write :meth:`to_json` atomically; an existing file is replaced only with ``force``."""
        return atomic_write_json(check_overwrite(path, force), self.to_json())

    def save_budget(self, path: str | Path, force: bool = False) -> Path:
        """Write the equivalent budget map (``headprobe.budget``) atomically, checked by its own reader first."""
        check_overwrite(path, force)
        BudgetMap.from_json(self.budget_map.to_json(), path)
        return self.budget_map.save(path, force=force)

    def generate_command(self, path: str | Path) -> str:
        """``headprobe generate ...``: the command that runs :attr:`budget_map`, saved at ``path``, in headprobe's
        runtime with the policy it runs with (:attr:`run_with`)."""
        return "headprobe " + generate_command(str(path), self.run_with["policy"], self.run_with["options"])


__all__ = ("EXPLAIN_FORMAT", "EXPLAIN_VERSION", "Explanation")
