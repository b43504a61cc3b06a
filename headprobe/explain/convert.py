"""Budget maps equivalent to other engines' settings, so every method runs in headprobe's runtime.

Each converter returns a KV-head :class:`~headprobe.budget_map.BudgetMap` whose budgets are the tokens the
other engine keeps per KV head at a context of ``N`` tokens (recorded as ``method.prompt_len``), and the
headprobe policy that selects the same tokens inside a head (``method.run_with``). At a prompt of ``N``
tokens ``headprobe generate --budget FILE --policy P --option ...`` then keeps what the engine keeps; at
other lengths the runtime rescales the map by its shares, as it does any map.

- DuoAttention: full heads ``N``, streaming heads ``min(N, sink + recent)``, ``window = recent_size`` and
  ``sink = sink_size`` (what every head keeps); run with ``streaming`` (sink first, then the most recent).
- HeadKV: each KV head the rounded mean of its query heads' kept tokens (KVCache-Factory's
  ``--kv_cache_granularity kv_head``), or their sum capped at ``N`` (``gqa="sum"``: the memory HeadKV's
  query-head cache holds); run with ``snapkv`` (HeadKV's own selection: window 8, max-pool 7).
- kvpress: the press's kept tokens per head (a layer's mean for AdaKV); run with the closest policy
  (``snapkv`` with the press's window and pooling, ``streaming`` for StreamingLLM, ``snapkv`` with
  ``adaptive=true`` for AdaKV).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..allocation.common import build_budget_map
from ..budget_map import BudgetMap
from ..errors import HeadprobeError, param
from ..models.identity import ModelIdentity
from .engines.headkv import WINDOW, headkv_capacities, kept_at
from .engines.kvcache_factory import kv_head_capacities
from .sources import DuoPattern, ExplainInput

#: How query-head budgets become KV-head budgets.
GQA_RULES = ("mean", "sum")


@dataclass(frozen=True)
class Conversion:
    """A budget map and how headprobe's runtime runs it."""

    budget_map: BudgetMap
    policy: str
    options: dict[str, Any]


def _method(allocator: str, context: int, window: int, sink: int, sources: list[dict[str, Any]],
            policy: str, options: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"allocator": allocator, "beta": None, "capacity": None, "ratio": None, "prompt_len": context,
            "window": window, "sink": sink, "temperature": None, "reduction": None, "compat": None,
            "sources": sources, **extra, "run_with": {"policy": policy, "options": options}}


def _source(inp: ExplainInput, kind: str) -> list[dict[str, Any]]:
    return [{"kind": kind, "fingerprint": inp.fingerprint, "path": str(p)} for p in inp.paths[:1]]


def _map(model: ModelIdentity, budgets: np.ndarray, method: dict[str, Any]) -> Conversion:
    run = method["run_with"]
    return Conversion(build_budget_map(model, np.asarray(budgets, dtype=np.int64), method), run["policy"],
                      dict(run["options"]))


def from_duoattention(inp: ExplainInput, full: np.ndarray, context: int, rule: dict[str, Any]) -> Conversion:
    """The map of a DuoAttention split ``full`` (``bool [layers][kv_heads]``) at ``context`` tokens.

    ``rule`` says how the split was made (recorded in ``method.split``).
    """
    duo: DuoPattern = inp.duo
    budgets = np.where(full, context, min(context, duo.sink_size + duo.recent_size))
    options = {"sink": duo.sink_size}
    method = _method("duoattention", context, duo.recent_size, duo.sink_size, _source(inp, "duoattention"),
                     "streaming", options, split=rule, full_heads=int(full.sum()),
                     streaming_heads=int(full.size - full.sum()))
    return _map(inp.model, budgets, method)


def headkv_kv_budgets(scores: np.ndarray, model: ModelIdentity, context: int, capacity: int, beta: float,
                      temp: float = 1.0, gqa: str = "mean") -> np.ndarray:
    """``int64 [layers][kv_heads]`` what HeadKV's setting keeps per KV head at ``context`` tokens (``gqa``)."""
    if gqa not in GQA_RULES:
        raise HeadprobeError(f"{param('gqa', gqa)}: expected one of {', '.join(GQA_RULES)}")
    caps = headkv_capacities(scores, capacity, beta, temp)
    if gqa == "mean":
        return kept_at(kv_head_capacities(caps, model.group_size), capacity - WINDOW, context)
    kept = kept_at(caps, capacity - WINDOW, context)
    summed = kept.reshape(model.num_layers, model.num_kv_heads, model.group_size).sum(axis=2)
    return np.minimum(summed, context)


def from_headkv(inp: ExplainInput, scores: np.ndarray, context: int, capacity: int, beta: float,
                temp: float = 1.0, gqa: str = "mean", source_kind: str = "headkv") -> Conversion:
    """The map of HeadKV's ``--max_capacity_prompts capacity --beta beta --temp temp`` at ``context`` tokens."""
    budgets = headkv_kv_budgets(scores, inp.model, context, capacity, beta, temp, gqa)
    options = {"window": WINDOW, "kernel_size": 7, "pooling": "max"}
    method = _method("headkv", context, WINDOW, 0, _source(inp, source_kind), "snapkv", options,
                     engine={"name": "HeadKV", "max_capacity_prompts": capacity, "beta": beta, "temp": temp},
                     gqa=gqa)
    method["beta"] = beta
    return _map(inp.model, budgets, method)


def from_press(inp: ExplainInput, kept: np.ndarray, context: int, window: int, sink: int, policy: str,
               options: dict[str, Any], press: dict[str, Any]) -> Conversion:
    """The map of a kvpress press whose heads keep ``kept`` ``[layers][kv_heads]`` tokens at ``context``."""
    method = _method(f"kvpress:{press['name']}", context, window, sink, [], policy, options, press=press)
    return _map(inp.model, kept, method)


__all__ = ("GQA_RULES", "Conversion", "from_duoattention", "from_headkv", "from_press", "headkv_kv_budgets")
