"""headprobe's own runtime: what ``CompressedCache`` allocates for a budget map.

The arithmetic follows the runtime step by step (nothing here runs a model):

- budgets: :class:`~headprobe.runtime.budget_sources.MapBudget` resolves the map for a prompt of ``N`` tokens (the map's
  budgets, or its shares at ``capacity``, clamped to ``N`` with the excess redistributed; sliding-window
  layers excluded) — the runtime's own function is called;
- kept tokens: the policy's selection keeps ``max(min(budget, N), min(N, window))`` a head
  (:func:`~headprobe.runtime.policies.base.window_and_topk`); a sliding-window layer keeps
  ``min(sliding_window - 1, N)`` (:class:`~headprobe.runtime.policies.sliding.SlidingWindow`);
- a layer split (a map of ``allocate --method layer_split``) is resolved by
  :class:`~headprobe.runtime.split_budget.SplitBudget` (a local layer its window, a global layer every token,
  nothing rescaled) and runs under ``layer_window``: a layer keeps ``min(window, N)`` (a model's own
  sliding layer at most its own window) and never more while decoding, as ``streaming`` does;
- decode room: the policy asks for ``reserve`` rows a head (:meth:`~headprobe.runtime.policies.base.Policy.reserve`):
  ``max_new_tokens`` for the scorer policies (``snapkv``), ``min(budget, kept + max_new_tokens) - kept`` for
  ``streaming`` and ``layer_window`` (a head never holds more), ``max(sliding_window - kept, 1)`` on
  sliding-window layers; the segment is allocated ``kept`` plus at most ``max_new_tokens - 1`` of them and at most the prompt tokens the
  head dropped or an eighth of what it keeps (at least 8), and regrows by an eighth when decoding fills it
  (:mod:`~headprobe.runtime.decode_room`), so the bytes at the end may exceed those at prefill;
- bytes: one :class:`~headprobe.runtime.store.LayerStore` a layer holds ``rows = Σ capacity + 1`` (one
  spare row) keys and values of ``head_dim`` elements, an int32 position per row, and three int64
  metadata entries (offsets, lengths, capacity) per segment — what ``LayerStore.memory_bytes`` counts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...budget_map import BudgetMap
from ...errors import HeadprobeError
from ...models.identity import ModelIdentity
from ...runtime.budget_sources import MapBudget
from ...runtime.decode_room import first_room, grown_capacity
from ...runtime.generate import make_policy
from ...runtime.policies.layer_window import layer_windows
from ...runtime.shape import CacheShape
from ...runtime.split_budget import SplitBudget, is_split_map
from ..setting import Setting
from .allocation import EngineAllocation

#: The policies whose allocation is modelled here.
RUNTIME_POLICIES = ("snapkv", "streaming", "layer_window")
#: The policies whose heads stay at their budget while decoding (the oldest token after the sink leaves).
CONSTANT_SIZE = ("streaming", "layer_window")

#: Bytes of one stored position (int32) and of one segment's metadata (offsets, lengths, capacity: int64).
POSITION_BYTES, SEGMENT_BYTES = 4, 3 * 8

CITES = ["headprobe runtime/budget_sources.py MapBudget.resolve",
         "headprobe runtime/policies/base.py window_and_topk, Policy.reserve, Policy.build_store",
         "headprobe runtime/policies/streaming.py Streaming.reserve",
         "headprobe runtime/policies/sliding.py SlidingWindow",
         "headprobe runtime/split_budget.py SplitBudget.resolve",
         "headprobe runtime/policies/layer_window.py LayerWindow.layer_windows",
         "headprobe runtime/store.py LayerStore.__init__, LayerStore.memory_bytes"]


def generate_command(path: str, policy: str, options: dict[str, Any], capacity: int | None = None,
                     max_new_tokens: int | None = None) -> str:
    """The ``headprobe generate`` flags that run a map file with this policy (booleans as ``true``/``false``)."""
    def text(v: Any) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    return (f"generate --budget {path} --policy {policy}"
            + "".join(f" --option {k}={text(v)}" for k, v in options.items())
            + (f" --capacity {capacity}" if capacity is not None else "")
            + (f" --max-new-tokens {max_new_tokens}" if max_new_tokens is not None else ""))


def runtime_policy(policy: str, options: dict[str, Any]) -> Any:
    """The runtime's policy object (options checked by the policy itself)."""
    if policy not in RUNTIME_POLICIES:
        raise HeadprobeError(f"policy {policy!r}: explain models the runtime's {', '.join(RUNTIME_POLICIES[:-1])} and "
                             f"{RUNTIME_POLICIES[-1]} policies")
    return make_policy(policy, **options)


class MapWindow:
    """What :meth:`MapBudget.resolve` reads of a policy, for a budget read with its own window (as kvpress'
    ``BudgetMapPress`` reads it)."""

    name = "budget map"
    uses_budgets = True

    def __init__(self, window: int) -> None:
        self.window = int(window)


def resolved_budgets(bm: BudgetMap, model: ModelIdentity, context: int, policy: Any,
                     capacity: int | None = None) -> np.ndarray:
    """``int64 [layers][kv_heads]`` the budgets :class:`~headprobe.runtime.budget_sources.MapBudget` gives a prompt of
    ``context`` tokens for ``policy`` (a runtime policy or a :class:`MapWindow`): the runtime's function,
    called (for a map that carries a layer split and a runtime policy, :class:`~headprobe.runtime.split_budget.
    SplitBudget`'s, which takes no ``capacity``, as ``generate`` resolves it)."""
    if is_split_map(bm) and not isinstance(policy, MapWindow):
        if capacity is not None:
            raise HeadprobeError("a layer split keeps its own windows; give no capacity")
        source = SplitBudget.from_map(bm, model)
    else:
        source = MapBudget(bm, capacity=capacity)
    return source.resolve(CacheShape.from_identity(model), torch.tensor([context]), policy)[0].numpy().astype(np.int64)


def store_bytes(capacity: np.ndarray, head_dim: int, element_bytes: int, batch: int) -> int:
    """Bytes one layer's store allocates for ``capacity`` ``[kv_heads]`` rows a segment, ``batch`` rows."""
    rows = batch * int(np.asarray(capacity).sum()) + 1
    segments = batch * np.asarray(capacity).size
    return rows * (2 * head_dim * element_bytes + POSITION_BYTES) + segments * SEGMENT_BYTES


def runtime_allocation(bm: BudgetMap, model: ModelIdentity, setting: Setting, policy: str = "snapkv",
                       options: dict[str, Any] | None = None, capacity: int | None = None,
                       budget_path: str = "MAP") -> EngineAllocation:
    """What ``generate_compressed(..., budget=bm, policy=policy, max_new_tokens=M)`` allocates.

    Parameters
    ----------
    bm
        A KV-head budget map for ``model``.
    policy, options
        One of :data:`RUNTIME_POLICIES` and its options (``window``, ``sink``, ...).
    capacity
        Rescale the map to this mean per head (``generate --capacity``).
    budget_path
        How the command shown in ``setting`` names the map file.
    """
    options = dict(options or {})
    pol = runtime_policy(policy, options)
    n, m = setting.context, setting.max_new_tokens
    command = generate_command(budget_path, policy, options, capacity, m)
    try:
        budgets = resolved_budgets(bm, model, n, pol, capacity)
    except HeadprobeError as exc:
        return EngineAllocation.cannot_run("headprobe", command, f"the runtime refuses this map: {exc}", CITES)
    why = _layer_window_refusal(budgets, model, pol) if policy == "layer_window" else None
    if why is not None:
        return EngineAllocation.cannot_run("headprobe", command, f"the runtime refuses this map: {why}", CITES)
    window = min(n, pol.window)
    held = np.empty_like(budgets)
    held_end = np.empty_like(budgets)
    total = total_end = 0
    for layer, kind in enumerate(model.layer_types):
        kept, asked = _kept_and_asked(budgets[layer], kind, model, n, m, window, policy)
        limit = kept + asked                              # where a constant-size head evicts
        end = np.minimum(kept + setting.appended, limit) if policy in CONSTANT_SIZE or kind == "sliding_attention" \
            else kept + setting.appended
        cap = kept + first_room(asked, kept, n, m)
        held[layer], held_end[layer] = kept, end
        total += store_bytes(cap, model.head_dim, setting.element_bytes, setting.batch)
        total_end += store_bytes(grown_capacity(cap, end), model.head_dim, setting.element_bytes, setting.batch)
    notes = []
    if policy == "streaming":
        notes.append("streaming keeps each head at its budget while decoding (the oldest token after the sink "
                     "leaves for each new one), so no decode room is allocated")
    elif policy == "layer_window":
        notes.append("layer_window keeps each layer at its window while decoding (the oldest token after the sink "
                     "leaves for each new one); a global layer keeps every token")
    if "sliding_attention" in model.layer_types:
        notes.append(f"sliding-window layers keep their window ({model.sliding_window} tokens) "
                     + ("or the split's, whichever is smaller" if policy == "layer_window" else "whatever the map says"))
    return EngineAllocation("headprobe", command, True, "kv_head", held, held_end, held.copy(), total, total_end, True,
                            notes, CITES)


def _layer_window_refusal(budgets: np.ndarray, model: ModelIdentity, pol: Any) -> str | None:
    """What the runtime's ``layer_window`` refuses for these budgets (:func:`~headprobe.runtime.policies.
    layer_window.layer_windows`, called layer by layer), ``None`` when it runs them."""
    for layer, kind in enumerate(model.layer_types):
        own = model.sliding_window if kind == "sliding_attention" else None
        try:
            layer_windows(torch.from_numpy(budgets[layer][None, :]), layer, own, pol.sink)
        except HeadprobeError as exc:
            return str(exc)
    return None


def _kept_and_asked(b: np.ndarray, kind: str, model: ModelIdentity, n: int, m: int, window: int,
                    policy: str) -> tuple[np.ndarray, np.ndarray]:
    """A layer's kept prompt tokens per head and the decode room its policy asks for (``Policy.reserve``)."""
    if policy == "layer_window" and kind == "sliding_attention":      # LayerWindow serves the model's own window
        b = np.minimum(b, int(model.sliding_window))
    elif kind == "sliding_attention":
        sw = int(model.sliding_window)
        kept = np.full_like(b, min(sw - 1, n))
        return kept, np.maximum(sw - kept, 1)
    kept = np.maximum(np.minimum(b, n), window)
    if policy in CONSTANT_SIZE:
        limit = np.minimum(b, kept + m)
        return kept, np.maximum(limit - kept, 0) + (limit == 0)
    return kept, np.full_like(kept, m)


__all__ = ("CONSTANT_SIZE", "RUNTIME_POLICIES", "MapWindow", "generate_command", "resolved_budgets", "runtime_allocation",
           "runtime_policy", "store_bytes")
