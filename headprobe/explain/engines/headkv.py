"""HeadKV (FYYFU/HeadKV): what ``--method ReasonKV --max_capacity_prompts C --beta β --temp t`` keeps.

Restated from FYYFU/HeadKV 0862a09 (nothing copied):

- shares: the mean of each key's list, divided by their Python ``sum``, raised to ``temp`` and divided
  by the ``torch.sum`` (``headkv/snapkv_utils.py:381-385``);
- per query head: ``b = C − 8`` (``snapkv_utils.py:347``; window 8, ``run_longbench.py:217-218``),
  pool ``(b // β) · L · H``, floor ``b − b // β``, ``capacity = round(share · pool + floor)``
  (``snapkv_utils.py:387-389``);
- at the end of prefill of ``N`` tokens: when ``b`` exceeds the ``N − 8`` prefix tokens scored, nothing is
  compressed and every head keeps ``N`` (``snapkv_utils.py:444-447``); else a head keeps its top
  ``capacity`` tokens *of the prefix* — the slice ``[:capacity]`` of ``N − 8`` sorted indices, so at most
  ``N − 8`` — plus the 8-token window (``snapkv_utils.py:467-469``);
- the keys are repeated to the query heads before compression (``headkv/adaptive_llama_hijack.py:376-383``):
  on a GQA model each KV head is stored once per query head; decoding appends one token to every query
  head (``adaptive_llama_hijack.py:436``);
- one sequence at a time (``assert bsz == 1``, ``snapkv_utils.py:456``); the score file is chosen by
  ``llama`` or ``mistral`` in the model path (``snapkv_utils.py:363-378``); Llama and Mistral only
  (``headkv/monkeypatch.py``).
"""

from __future__ import annotations

import numpy as np
import torch

from ...allocation.common import check_beta
from ...errors import HeadprobeError, param
from ...models.identity import ModelIdentity
from ..setting import Setting
from .allocation import EngineAllocation, dynamic

HEADKV = "FYYFU/HeadKV@0862a09"
#: HeadKV's observation window (``run_longbench.py:217``).
WINDOW = 8
#: ``config.model_type`` values HeadKV patches.
MODEL_TYPES = ("llama", "mistral")

CITES = [f"{HEADKV} headkv/snapkv_utils.py:381-389", f"{HEADKV} headkv/snapkv_utils.py:444-469",
         f"{HEADKV} headkv/adaptive_llama_hijack.py:376-383", f"{HEADKV} run_longbench.py:217-223"]


def check_engine_capacity(capacity: int, beta: float) -> None:
    """HeadKV's ``b = C − 8`` must leave tokens to choose, and ``β`` must be above 1."""
    check_beta(beta)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= WINDOW:
        raise HeadprobeError(f"{param('capacity', capacity)}: HeadKV's --max_capacity_prompts must exceed its "
                             f"{WINDOW}-token window")


def headkv_capacities(scores: np.ndarray, capacity: int, beta: float, temp: float = 1.0) -> np.ndarray:
    """``int64 [layers][query_heads]`` ``head_capacity`` of HeadKV's ``ReasonSnapKVCluster``.

    Parameters
    ----------
    scores
        ``[layers][query_heads]`` mean score per query head, in the file's layer-major key order.
    capacity
        ``--max_capacity_prompts`` (window included).
    temp
        ``--temp``: shares are raised to it (headprobe's ``temperature`` is ``1 / temp``).
    """
    check_engine_capacity(capacity, beta)
    s = np.asarray(scores, dtype=np.float64)
    layers, heads = s.shape
    flat = list(s.ravel())
    total = sum(flat)
    if not np.isfinite(total) or total <= 0:
        raise HeadprobeError("HeadKV divides the scores by their sum: it needs scores with a positive, finite sum")
    share = torch.tensor(np.array(flat) / total)
    share = torch.pow(share, temp)
    share = (share / torch.sum(share)).reshape(layers, heads)
    base = capacity - WINDOW
    pool = (base // beta) * layers * heads
    floor = base - base // beta
    return torch.round(share * pool + floor).int().numpy().astype(np.int64)


def kept_at(capacities: np.ndarray, base: int, context: int, window: int = WINDOW) -> np.ndarray:
    """Tokens each stored head keeps at the end of prefill (``update_kv`` of HeadKV and of KVCache-Factory).

    ``base`` is the engine's ``base_capacity`` (``max_capacity_prompt − window``): above the ``N − window``
    prefix tokens scored, every head keeps the whole context; else ``min(capacity, N − window) + window``.
    """
    prefix = max(context - window, 0)
    if base > prefix:
        return np.full_like(np.asarray(capacities, dtype=np.int64), context)
    return np.minimum(np.asarray(capacities, dtype=np.int64), prefix) + window


def unsupported(engine: str, model: ModelIdentity, types: tuple[str, ...] = MODEL_TYPES) -> str | None:
    """Why ``engine`` cannot run ``model`` (``None`` when it can)."""
    if model.architecture not in types:
        return f"{engine} patches {' and '.join(t.capitalize() for t in types)} models only; {model.name} is " \
               f"{model.architecture!r}"
    return None


def short_context(engine: str, context: int) -> str | None:
    """Why ``engine`` fails on a context shorter than its window: the window's causal mask is added to a
    ``[context, context]`` block (``snapkv_utils.py:395-402``)."""
    if context < WINDOW:
        return (f"{engine}'s {WINDOW}-token window mask does not fit a {context}-token context (it needs at least "
                f"{WINDOW})")
    return None


def headkv_allocation(scores: np.ndarray, model: ModelIdentity, setting: Setting, capacity: int, beta: float,
                      temp: float = 1.0) -> EngineAllocation:
    """What HeadKV holds for one sequence of ``setting.context`` tokens (see the module docs)."""
    text = f"--max_capacity_prompts {capacity} --beta {beta:g} --temp {temp:g}"
    why = unsupported("HeadKV", model) or short_context("HeadKV", setting.context)
    if why is None and setting.batch > 1:
        why = (f"HeadKV compresses one sequence at a time (assert bsz == 1, headkv/snapkv_utils.py:456), not "
               f"{setting.batch}")
    if why is not None:
        return EngineAllocation.cannot_run("HeadKV", text, why, CITES)
    caps = headkv_capacities(scores, capacity, beta, temp)
    held = kept_at(caps, capacity - WINDOW, setting.context)
    notes = []
    if model.group_size > 1:
        notes.append(f"the cache is held per query head: each KV head is stored {model.group_size} times "
                     f"({model.num_query_heads} query heads over {model.num_kv_heads} KV heads)")
    cut = int((caps > max(setting.context - WINDOW, 0)).sum()) if capacity - WINDOW <= setting.context - WINDOW else 0
    if cut:
        heads = "head is" if cut == 1 else "heads are"
        notes.append(f"{cut} {heads} given more than the {setting.context - WINDOW} prefix tokens and keep only "
                     "those: the budget beyond the prefix is lost, not given to other heads")
    if capacity - WINDOW > setting.context - WINDOW:
        notes.append(f"--max_capacity_prompts {capacity} exceeds the {setting.context}-token context: nothing is "
                     "compressed")
    notes.append("HeadKV reads its score file from a fixed path chosen by 'llama' or 'mistral' in the model path "
                 "(headkv/snapkv_utils.py:363-378)")
    row = dynamic("HeadKV", text, held, model, setting, stored="query_head", notes=notes, cites=CITES)
    row.extra = {"head_capacity": caps.tolist()}
    return row


__all__ = ("HEADKV", "MODEL_TYPES", "WINDOW", "check_engine_capacity", "headkv_allocation", "headkv_capacities",
           "kept_at", "short_context", "unsupported")
