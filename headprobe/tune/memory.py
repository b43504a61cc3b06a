"""A memory target as tokens per KV head: ``--cache-share 5%`` or ``--cache-bytes 2GiB`` at a context length.

The bytes are those of headprobe's runtime, as ``headprobe explain`` computes them without a model
(:func:`~headprobe.explain.engines.headprobe_runtime.runtime_allocation`: kept tokens, decode room, one
spare row, positions and segment metadata, sliding-window layers at their window). The capacity is the
largest number of tokens per KV head whose uniform cache allocates no more than the target at prefill;
a share is of the full cache's keys and values at that context (:meth:`Explanation.share
<headprobe.explain.explanation.Explanation.share>`, the ``share`` ``explain`` reports).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..allocation.api import allocate
from ..errors import HeadprobeError, param
from ..explain.engines.headprobe_runtime import runtime_allocation
from ..explain.explanation import Explanation
from ..explain.setting import Setting
from ..models.identity import ModelIdentity


@dataclass(frozen=True)
class MemoryTarget:
    """A cache size to tune for.

    Attributes
    ----------
    context
        Prompt tokens the target is for.
    share
        Share of the full cache's bytes at ``context`` (or ``None``).
    bytes
        Bytes of the cache at prefill (or ``None``).
    dtype
        Element type of the cache (``float32``, ``bfloat16``, ``float16``).
    max_new_tokens, batch
        Decoding room and sequences the cache holds.
    """

    context: int
    share: float | None = None
    bytes: int | None = None
    dtype: str = "bfloat16"
    max_new_tokens: int = 24
    batch: int = 1

    def __post_init__(self) -> None:
        if (self.share is None) == (self.bytes is None):
            raise HeadprobeError(f"give {param('cache_share')} or {param('cache_bytes')}, one of them")


def _uniform_bytes(identity: ModelIdentity, capacity: int, setting: Any) -> tuple[int, Any]:
    """(bytes at prefill, the explanation) of a uniform cache of ``capacity`` tokens per KV head."""
    bm = allocate("uniform", [], identity, capacity=capacity, window=0)
    runtime = runtime_allocation(bm, identity, setting, "snapkv", {"window": 1})
    if not runtime.runs:
        raise HeadprobeError(f"capacity {capacity}: the runtime cannot run it")
    explanation = Explanation(identity, setting, {}, runtime.held, bm, {"policy": "snapkv", "options": {}}, [runtime])
    return int(runtime.bytes_prefill), explanation


def check_context(target: MemoryTarget, identity: ModelIdentity) -> None:
    """Refuse a target at a context the model cannot hold (its prompt and new tokens beyond
    ``identity.max_context``): the share or bytes would be of a cache no run of the model fills.

    Raises
    ------
    HeadprobeError
        Naming the context, the new tokens and the model's context.
    """
    room = target.context + target.max_new_tokens
    if identity.max_context and room > identity.max_context:
        raise HeadprobeError(f"{param('context', target.context)}: {target.context:,} prompt tokens + "
                             f"{target.max_new_tokens} new tokens ({param('max_new_tokens')}) exceed {identity.name}'s "
                             f"context of {identity.max_context:,} tokens; give a context the model can hold")


def capacity_for(target: MemoryTarget, identity: ModelIdentity) -> tuple[int, dict[str, Any]]:
    """The most tokens per KV head whose runtime cache fits ``target``, and how it was found.

    Returns
    -------
    capacity, record
        ``record`` is the target's JSON with the capacity's bytes and share beside it.

    Raises
    ------
    HeadprobeError
        A context beyond the model's, a target below what one token per head allocates, or above a full
        cache at the context.
    """
    check_context(target, identity)

    setting = Setting(target.context, target.batch, target.dtype, target.max_new_tokens)
    full = _uniform_bytes(identity, target.context, setting)[1].full_bytes()
    limit = target.bytes if target.bytes is not None else target.share * full
    what = (f"{param('cache_bytes', target.bytes)}" if target.bytes is not None
            else f"{param('cache_share', f'{target.share:.4g}')}")
    low_bytes = _uniform_bytes(identity, 1, setting)[0]
    if low_bytes > limit:
        raise HeadprobeError(f"{what}: one token per KV head already allocates {low_bytes} bytes at "
                             f"{target.context} tokens ({target.dtype})")
    lo, hi = 1, target.context
    if _uniform_bytes(identity, hi, setting)[0] <= limit:
        raise HeadprobeError(f"{what}: a full cache of {target.context} tokens fits; nothing to tune")
    while hi - lo > 1:                         # bytes grow with the capacity: largest fitting one
        mid = (lo + hi) // 2
        if _uniform_bytes(identity, mid, setting)[0] <= limit:
            lo = mid
        else:
            hi = mid
    used, explanation = _uniform_bytes(identity, lo, setting)
    record = {"context": target.context, "dtype": target.dtype, "max_new_tokens": target.max_new_tokens,
              "batch": target.batch, "share": target.share, "bytes": target.bytes, "capacity": lo,
              "capacity_bytes": used, "capacity_share": explanation.share(used), "full_cache_bytes": full}
    return lo, record


def cache_dtype(dtype: str, device: str | None) -> str:
    """The cache's element type for ``--dtype`` and ``--device`` (``auto``: bfloat16 on a GPU, else float32)."""
    if dtype != "auto":
        return dtype

    on_gpu = torch.cuda.is_available() and (device is None or not str(device).startswith("cpu"))
    return "bfloat16" if on_gpu else "float32"


__all__ = ("MemoryTarget", "cache_dtype", "capacity_for")
