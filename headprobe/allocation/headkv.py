"""HeadKV allocation (Fu et al., eq. 4): a fixed floor per head plus a shared pool split by head scores.

``b_h = (b − b/β) + S_h · (b/β) · L · H``, ``b = capacity − window``, then the window is added back.

Two modes:

- default: KV-head granularity (a GQA model stores each KV head once), integer budgets that sum exactly
  to ``capacity · L · H_kv`` by largest-remainder rounding, optional score temperature, optional clamp
  to a prompt length with the excess redistributed;
- ``compat="headkv"``: HeadKV's published arithmetic to the token, at query-head granularity (float
  floor division ``b // β``, ``round`` half to even, no clamp, totals not forced).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..budget_arithmetic import largest_remainder
from ..budget_map import BudgetMap
from ..errors import HeadprobeError
from ..models.identity import ModelIdentity
from ..profile import GROUP_REDUCTIONS, NEGATIVE_NOISE, Profile, check_head_scores, kv_head_scores
from .allocator import Allocator, Source
from .clamp import clamp_for_model
from .common import (
    build_budget_map,
    check_beta,
    check_profile_model,
    check_temperature,
    method_block,
    prepare_scores,
    resolve_capacity,
    source_entry,
)
from .options import AllocatorOptions, CapacityOptions, option

COMPAT_MODES = ("headkv",)

#: HeadKV's β when none is given (headkv and combined).
DEFAULT_BETA = 1.2
#: The β values ``headprobe tune`` tries: from HeadKV's own sweep (1.005 ... 10), near-proportional to the
#: scores (1.01) to almost even (5).
BETA_SEARCH = (1.01, 1.2, 2.0, 5.0)


@dataclass(frozen=True)
class HeadScoreOptions(AllocatorOptions):
    """Options of the allocators that split budgets by head scores (``headkv``, ``combined``)."""

    beta: float = option(DEFAULT_BETA, "HeadKV's β > 1: 1/β of the tokens beyond the window follow the head "
                         "scores, the rest is an even floor", filename="beta", search=BETA_SEARCH)
    temperature: float | None = option(None, "score temperature: weights ∝ score^(1/T) (>1 flattens, <1 sharpens)")
    reduction: str | None = option(None, "query→KV head reduction (default: the profile's own)",
                                   choices=GROUP_REDUCTIONS)
    allow_fallback: bool = option(False, "allocate uniformly when the profile's scores are all zero or NaN "
                                  "(default: refuse)", flag="--fallback-uniform", record="fallback")

    def check(self) -> None:
        check_beta(self.beta)
        check_temperature(self.temperature)


@dataclass(frozen=True)
class HeadKVOptions(HeadScoreOptions):
    """HeadKV's options: those of every head-score split, and HeadKV's own arithmetic on request."""

    compat: str | None = option(None, "reproduce HeadKV's arithmetic exactly (query-head granularity, no "
                                "clamp, sink, ratio or temperature)", choices=COMPAT_MODES)


def headkv_floor(capacity: int, window: int, beta: float, sink: int = 0) -> int:
    """Tokens every head gets before the pool is shared (window and sink included).

    ``window + sink + (b − ⌊b/β⌋)`` with ``b = capacity − window − sink``.
    """
    base = capacity - window - sink
    return window + sink + base - math.floor(base / beta)


def headkv_budgets(scores, capacity: int = 128, window: int = 8, beta: float = DEFAULT_BETA, sink: int = 0,
                   temperature: float | None = None, allow_fallback: bool = False) -> np.ndarray:
    """Integer HeadKV budgets for a score matrix.

    Parameters
    ----------
    scores
        ``[layers][heads]`` non-negative head scores (KV heads in the default mode).
    capacity
        Average tokens per head, window and sink included; the budgets sum to ``capacity · layers · heads``.
    window, sink
        Tokens every head always keeps.
    beta
        β > 1; the shared pool is ``⌊b/β⌋`` tokens per head.
    temperature
        Optional score temperature (see :func:`~headprobe.allocation.common.prepare_scores`).

    Returns
    -------
    np.ndarray
        ``int64 [layers][heads]``, each at least :func:`headkv_floor`, summing exactly to the target.
    """
    beta = check_beta(beta)
    cap = resolve_capacity(capacity, window, sink)
    weights, _ = prepare_scores(scores, temperature, allow_fallback)
    n = weights.size
    floor = headkv_floor(cap.capacity, cap.window, beta, cap.sink)
    return floor + largest_remainder(weights, cap.capacity * n - floor * n)


def headkv_compat_budgets(query_scores, capacity: int = 128, window: int = 8, beta: float = DEFAULT_BETA) -> np.ndarray:
    """HeadKV's own arithmetic, reproduced to the token (its ``init_headkv``).

    Parameters
    ----------
    query_scores
        ``[layers][query_heads]`` mean score per query head (the mean of each key's per-trial list in
        a published file).

    Returns
    -------
    np.ndarray
        ``int64 [layers][query_heads]``: ``round(S·pool + floor) + window`` with
        ``S = score / sum(scores)`` (Python's left-to-right sum, layer-major), ``pool = (b // β)·L·H``
        and ``floor = b − b // β`` in floating point, ``b = capacity − window``. No clamp; the total is
        whatever rounding gives.
    """
    beta = check_beta(beta)
    resolve_capacity(capacity, window, 0)
    s = np.asarray(query_scores, dtype=np.float64)
    layers, heads = s.shape
    if np.any(s < -NEGATIVE_NOISE):   # HeadKV's arithmetic would give such a head less than nothing
        raise HeadprobeError(f"compat=headkv: the profile has negative scores (min {s.min():.3g}); head scores "
                             "must be >= 0")
    flat = list(s.ravel())
    total = sum(flat)
    if not math.isfinite(total) or total <= 0:
        raise HeadprobeError("compat=headkv needs scores with a positive, finite sum")
    share = (np.array(flat) / total).reshape(layers, heads)
    base = capacity - window
    pool = (base // beta) * layers * heads
    floor = base - base // beta
    return np.round(share * pool + floor).astype(np.int64) + window


def allocate_headkv(profile: Profile, model: ModelIdentity | None = None, *, capacity: int | None = 128,
                    window: int = 8, beta: float = DEFAULT_BETA, sink: int = 0, ratio: float | None = None,
                    prompt_len: int | None = None, temperature: float | None = None,
                    reduction: str | None = None, compat: str | None = None, clamp: bool = False,
                    allow_fallback: bool = False, source_path: str | None = None) -> BudgetMap:
    """HeadKV budget map from a head-score profile.

    Parameters
    ----------
    profile
        A profile with head scores (retrieval, enhanced retrieval or retrieval-reasoning).
    model
        The model to allocate for; the profile must fit it (default: the profile's model).
    capacity, ratio, prompt_len
        Average tokens per KV head, or ``ratio`` of ``prompt_len``.
    reduction
        How query-head scores become KV-head scores: ``"mean"``, ``"max"`` or ``"sum"`` (default: the
        profile's own ``kv_heads``).
    compat
        ``"headkv"``: HeadKV's published arithmetic at query-head granularity (no clamp, no sink, no
        temperature).
    clamp
        With ``prompt_len``: clamp to the prompt and redistribute the excess.

    Returns
    -------
    BudgetMap
        ``[layers][kv_heads]`` budgets (``[layers][query_heads]`` with ``compat="headkv"``).
    """
    model = check_profile_model(profile, model)
    beta = check_beta(beta)
    sources = [source_entry(profile, source_path)]
    if compat is not None:
        if compat not in COMPAT_MODES:
            raise HeadprobeError(f"compat must be one of {', '.join(COMPAT_MODES)}, got {compat!r}")
        if sink or temperature not in (None, 1) or clamp or ratio is not None:
            raise HeadprobeError("compat=headkv reproduces HeadKV exactly: no sink, temperature, ratio or clamp")
        if profile.query_heads is None:
            raise HeadprobeError(f"{profile.kind} profile has no head scores")
        check_head_scores(profile)
        cap = resolve_capacity(capacity, window, 0)
        budgets = headkv_compat_budgets(profile.query_heads, cap.capacity, cap.window, beta)
        method = method_block("headkv", cap, beta=beta, compat=compat, sources=sources,
                              floor=round(cap.base - cap.base // beta) + cap.window)
        return build_budget_map(model, budgets, method, granularity="query_head")
    cap = resolve_capacity(capacity, window, sink, ratio, prompt_len)
    scores = kv_head_scores(profile, reduction)
    weights, fell_back = prepare_scores(scores, temperature, allow_fallback,
                                        what=f"{profile.kind} profile of {profile.model.name}")
    n = weights.size
    floor = headkv_floor(cap.capacity, cap.window, beta, cap.sink)
    budgets = floor + largest_remainder(weights, cap.capacity * n - floor * n)
    if clamp:
        budgets = clamp_for_model(budgets, cap, prompt_len, model)
    method = method_block("headkv", cap, beta=beta, temperature=temperature,
                          reduction=reduction or profile.group_reduction, sources=sources, floor=floor,
                          clamped_to=prompt_len if clamp else None, fallback="uniform" if fell_back else None)
    return build_budget_map(model, budgets, method)


def _run(model: ModelIdentity, sources: Sequence[Source], capacity: CapacityOptions,
         options: HeadKVOptions) -> BudgetMap:
    (profile, path), = sources
    return allocate_headkv(profile, model, **capacity.as_dict(), **options.as_dict(), source_path=path)


ALLOCATOR = Allocator(
    "headkv", ("head_scores",), f"HeadKV: a floor per head plus a pool split by head scores (beta, default "
    f"{DEFAULT_BETA:g}; compat=headkv for HeadKV's own arithmetic)", HeadKVOptions, _run)

__all__: Sequence[str] = ("ALLOCATOR", "DEFAULT_BETA", "HeadKVOptions", "HeadScoreOptions", "allocate_headkv",
                          "headkv_budgets", "headkv_compat_budgets", "headkv_floor")
