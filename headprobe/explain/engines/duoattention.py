"""DuoAttention (mit-han-lab/duo-attention): full heads keep every token, streaming heads a sink and a window.

Restated from mit-han-lab/duo-attention fe93c31 (nothing copied):

- ``load_attn_pattern`` reads the TSV and clips it to [0, 1]; ``config.json`` gives ``sink_size`` and
  ``recent_size`` (``duo_attn/utils.py:326-336``), which the scripts' ``--sink_size`` / ``--recent_size``
  override (``eval/LongBench/pred.py:206-213``);
- the split: with ``--sparsity s`` (every eval script), ``sparsify_attention_heads`` adds noise below
  1e-6, cuts at ``np.quantile(values, s)`` and makes the heads at or above the cut full; ``s >= 1`` makes
  none full, ``s <= 0`` all (``duo_attn/utils.py:353-373``). The eval patch reads values above 0.5 as
  full (``duo_attn/patch/llama.py:187-193``);
- the eval patch's tuple cache (``llama.py:273-290``): after every forward a streaming head keeps its first
  ``sink_size`` and last ``recent_size`` tokens; a full head keeps everything;
- the static cache of the efficiency and demo scripts (``duo_attn/patch/static_kv_cache.py:53-95``)
  allocates ``[batch, max_size, full heads, head_dim]`` and ``[batch, sink + recent, streaming heads,
  head_dim]`` keys and values per layer up front; the scripts choose ``max_size`` (``input + 5`` in
  ``eval/efficiency/benchmark_static.py:54``); shown here for ``N + M``.

How many heads ``--sparsity s`` streams follows from numpy's quantile alone: the noise keeps every value
apart, so the cut falls between two neighbours in rank (:func:`sparsity_streaming`). Which heads follows
from the values; equal values at the cut are split by the noise, at random.
"""

from __future__ import annotations

import numpy as np

from ...head_ranking import rank_order
from ...models.identity import ModelIdentity
from ..setting import Setting
from ..sources import DuoPattern
from .allocation import EngineAllocation, dynamic
from .headkv import unsupported

DUO = "mit-han-lab/duo-attention@fe93c31"
#: ``config.model_type`` values DuoAttention's patch accepts.
MODEL_TYPES = ("llama", "mistral", "mixtral")
#: The eval patch's cut on the raw values (``llama.py:187``).
CUT = 0.5

CITES = [f"{DUO} duo_attn/utils.py:326-336", f"{DUO} duo_attn/utils.py:353-373",
         f"{DUO} duo_attn/patch/llama.py:187-193", f"{DUO} duo_attn/patch/llama.py:273-290"]
STATIC_CITES = [f"{DUO} duo_attn/patch/static_kv_cache.py:53-95", f"{DUO} eval/efficiency/benchmark_static.py:54"]


def sparsity_streaming(n: int, sparsity: float) -> int:
    """How many of ``n`` distinct values fall below ``np.quantile(values, sparsity)`` (the streaming heads of
    ``sparsify_attention_heads``): the quantile of the ranks ``0 .. n-1`` under numpy's own arithmetic."""
    if sparsity >= 1:
        return n
    if sparsity <= 0:
        return 0
    ranks = np.arange(n, dtype=np.float64)
    return int((ranks < np.quantile(ranks, sparsity)).sum())


def duo_split(duo: DuoPattern, sparsity: float | None) -> tuple[np.ndarray, tuple[float, int, int] | None]:
    """``bool [layers][kv_heads]`` full heads, and ``(value, tied heads, of them full)`` when a ``sparsity`` cut
    runs through equal values (DuoAttention's noise then chooses; here the lower (layer, head) is full)."""
    v = duo.clipped
    if sparsity is None:
        return v > CUT, None
    k = sparsity_streaming(v.size, sparsity)
    order = rank_order(v)                                  # highest first; ties: lower (layer, head) first
    full = np.zeros(v.size, dtype=bool)
    full[order[:v.size - k]] = True
    tie = None
    if 0 < k < v.size:
        flat = v.ravel()
        edge = flat[order[v.size - k - 1]]
        if flat[order[v.size - k]] == edge:
            tied = flat == edge
            tie = (float(edge), int(tied.sum()), int((tied & full).sum()))
    return full.reshape(v.shape), tie


def duo_tokens(full: np.ndarray, duo: DuoPattern, tokens: int) -> np.ndarray:
    """``int64 [layers][kv_heads]``: what each head holds after ``tokens`` tokens went through the tuple cache."""
    return np.where(full, tokens, min(tokens, duo.sink_size + duo.recent_size)).astype(np.int64)


def _split_notes(full: np.ndarray, sparsity: float | None, tie) -> list[str]:
    rule = f"--sparsity {sparsity:g}" if sparsity is not None else "values above 0.5 (no --sparsity)"
    notes = [(f"{int(full.sum())} full and {int(full.size - full.sum())} streaming KV heads ({rule}; true sparsity "
             f"{1 - full.mean():.4g})")]
    if tie is not None:
        value, tied, chosen = tie
        notes.append(f"the cut runs through {tied} heads of equal value {value:.4g}: DuoAttention's noise picks "
                     f"{chosen} of them at random; shown: the lower (layer, head) first")
    return notes


def duo_allocation(duo: DuoPattern, model: ModelIdentity, setting: Setting,
                   sparsity: float | None) -> EngineAllocation:
    """The eval patch (tuple cache): full heads grow with the context, streaming heads stay at sink + recent."""
    text = f"sink_size {duo.sink_size}, recent_size {duo.recent_size}" + (
        f", --sparsity {sparsity:g}" if sparsity is not None else "")
    why = unsupported("DuoAttention", model, MODEL_TYPES)
    if why is not None:
        return EngineAllocation.cannot_run("DuoAttention", text, why, CITES)
    full, tie = duo_split(duo, sparsity)
    held = duo_tokens(full, duo, setting.context)
    end = duo_tokens(full, duo, setting.context + setting.appended)
    row = dynamic("DuoAttention", "eval patch (tuple cache), " + text, held, model, setting, held_end=end,
                  notes=_split_notes(full, sparsity, tie), cites=CITES)
    row.extra = {"full": full.astype(int).tolist()}
    return row


def duo_static_allocation(duo: DuoPattern, model: ModelIdentity, setting: Setting,
                          sparsity: float | None) -> EngineAllocation:
    """The static cache: ``max_size = N + M`` rows for every full head and ``sink + recent`` for every streaming
    head, allocated before prefill."""
    max_size = setting.context + setting.max_new_tokens
    text = f"static cache, max_size {max_size} (N + M), sink_size {duo.sink_size}, recent_size {duo.recent_size}" + (
        f", --sparsity {sparsity:g}" if sparsity is not None else "")
    why = unsupported("DuoAttention", model, MODEL_TYPES)
    if why is not None:
        return EngineAllocation.cannot_run("DuoAttention", text, why, STATIC_CITES)
    full, _ = duo_split(duo, sparsity)
    rows = np.where(full, max_size, duo.sink_size + duo.recent_size).astype(np.int64)
    size = int(rows.sum()) * setting.token_bytes(model.head_dim) * setting.batch
    held = duo_tokens(full, duo, setting.context)
    end = duo_tokens(full, duo, setting.context + setting.appended)
    notes = [("keys and values are allocated up front for max_size tokens a full head and sink + recent a streaming "
             "head, whatever the context")]
    return EngineAllocation("DuoAttention", text, True, "kv_head", held, end, held.copy(), size, size, True, notes,
                            STATIC_CITES, {"allocated_rows": rows.tolist()})


__all__ = ("CUT", "DUO", "MODEL_TYPES", "duo_allocation", "duo_split", "duo_static_allocation", "duo_tokens",
           "sparsity_streaming")
