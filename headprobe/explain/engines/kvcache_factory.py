"""KVCache-Factory (Zefan-Cai/KVCache-Factory): what ``run_longbench.py --method HeadKV --head_path FILE
--max_capacity_prompts C --head_beta β [--kv_cache_granularity G]`` keeps.

Restated from Zefan-Cai/KVCache-Factory c97f9d7 (nothing copied):

- per query head (``run_longbench.py:272-281``): shares as HeadKV's (mean per key over their Python
  ``sum``, no ``temp``), but ``C`` itself is the base: pool ``(C // β) · L · H``, floor ``C − C // β``,
  ``capacity = round(share · pool + floor)``; the observation window is 8 (``run_longbench.py:266-268``);
- ``HeadKVCluster`` (``pyramidkv/pyramidkv_utils.py:1103``): ``base_capacity = C − 8``; above the ``N − 8``
  prefix tokens scored nothing is compressed (``:1179``); else a head keeps ``min(capacity, N − 8) + 8``
  (``:1213-1215``);
- ``--kv_cache_granularity query_head`` (the default) repeats the keys to the query heads before
  compression (``pyramidkv_utils.py:133-139``); ``kv_head`` stores each KV head once with the float32 mean
  of its query heads' capacities, rounded half to even (``:1197-1199``);
- one sequence at a time (``:1203``; ``run_longbench.py:439-440``); Llama and Mistral only
  (``run_longbench.py:469-471``).

So ``--max_capacity_prompts C`` here equals HeadKV's ``--max_capacity_prompts C + 8`` (and headprobe's
``allocate --compat headkv --capacity C + 8``).
"""

from __future__ import annotations

import numpy as np
import torch

from ...allocation.common import check_beta
from ...errors import HeadprobeError
from ...models.identity import ModelIdentity
from ..setting import Setting
from .allocation import EngineAllocation, dynamic
from .headkv import WINDOW, kept_at, short_context, unsupported

KVCACHE_FACTORY = "Zefan-Cai/KVCache-Factory@c97f9d7"
GRANULARITIES = ("query_head", "kv_head")

CITES = [f"{KVCACHE_FACTORY} run_longbench.py:272-281", f"{KVCACHE_FACTORY} pyramidkv/pyramidkv_utils.py:1103",
         f"{KVCACHE_FACTORY} pyramidkv/pyramidkv_utils.py:1179-1215",
         f"{KVCACHE_FACTORY} pyramidkv/pyramidkv_utils.py:133-139"]


def factory_capacities(scores: np.ndarray, max_capacity_prompts: int, head_beta: float) -> np.ndarray:
    """``int64 [layers][query_heads]``: the ``head_capacity`` table ``run_longbench.py`` builds."""
    check_beta(head_beta)
    s = np.asarray(scores, dtype=np.float64)
    layers, heads = s.shape
    flat = list(s.ravel())
    total = sum(flat)
    if not np.isfinite(total) or total <= 0:
        raise HeadprobeError("KVCache-Factory divides the scores by their sum: it needs scores with a positive, "
                             "finite sum")
    share = torch.tensor(np.array(flat) / total).reshape(layers, heads)
    pool = (max_capacity_prompts // head_beta) * layers * heads
    floor = max_capacity_prompts - max_capacity_prompts // head_beta
    return torch.round(share * pool + floor).int().numpy().astype(np.int64)


def kv_head_capacities(capacities: np.ndarray, group: int) -> np.ndarray:
    """``[layers][kv_heads]``: each KV head's query-head capacities averaged in float32 and rounded half to even,
    as ``HeadKVCluster.update_kv`` does with ``--kv_cache_granularity kv_head``."""
    caps = torch.as_tensor(np.asarray(capacities), dtype=torch.int32)
    layers, heads = caps.shape
    if group == 1:
        return caps.numpy().astype(np.int64)
    out = caps.reshape(layers, heads // group, group).float().mean(dim=-1).round().to(caps.dtype)
    return out.numpy().astype(np.int64)


def factory_allocation(scores: np.ndarray, model: ModelIdentity, setting: Setting, max_capacity_prompts: int,
                       head_beta: float, granularity: str = "query_head") -> EngineAllocation:
    """What KVCache-Factory holds for one sequence of ``setting.context`` tokens."""
    text = (f"--max_capacity_prompts {max_capacity_prompts} --head_beta {head_beta:g} "
            f"--kv_cache_granularity {granularity}")
    why = unsupported("KVCache-Factory", model) or short_context("KVCache-Factory", setting.context)
    if why is None and setting.batch > 1:
        why = (f"KVCache-Factory runs one sequence at a time (--eval_batch_size must be 1, run_longbench.py:439), "
               f"not {setting.batch}")
    if why is None and max_capacity_prompts <= WINDOW:
        why = f"--max_capacity_prompts {max_capacity_prompts} leaves nothing beyond the {WINDOW}-token window"
    if why is not None:
        return EngineAllocation.cannot_run("KVCache-Factory", text, why, CITES)
    caps = factory_capacities(scores, max_capacity_prompts, head_beta)
    notes = []
    if granularity == "kv_head":
        caps = kv_head_capacities(caps, model.group_size)
        stored = "kv_head"
        if model.group_size > 1:
            notes.append("each KV head gets the rounded float32 mean of its query heads' capacities")
    else:
        stored = "query_head"
        if model.group_size > 1:
            notes.append(f"the cache is held per query head: each KV head is stored {model.group_size} times")
    held = kept_at(caps, max_capacity_prompts - WINDOW, setting.context)
    if max_capacity_prompts > setting.context:
        notes.append(f"--max_capacity_prompts {max_capacity_prompts} exceeds the {setting.context}-token context: "
                     "nothing is compressed")
    row = dynamic("KVCache-Factory", text, held, model, setting, stored=stored, notes=notes, cites=CITES)
    row.extra = {"head_capacity": caps.tolist()}
    return row


__all__ = ("GRANULARITIES", "KVCACHE_FACTORY", "factory_allocation", "factory_capacities", "kv_head_capacities")
