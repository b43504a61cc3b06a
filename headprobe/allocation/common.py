"""Shared pieces of the allocators: capacity and parameter checks, score preparation, the map's method block.

Every allocator in this package produces integer budgets ``[layers][kv_heads]`` that sum exactly to the
target total, never give a head less than its floor (the window and the sink are always kept), and
break ties deterministically by (layer, head); the integer arithmetic is :mod:`headprobe.budget_arithmetic`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..budget_map import BudgetMap
from ..errors import HeadprobeError, param
from ..limits import check_count
from ..models.identity import ModelIdentity
from ..profile import NEGATIVE_NOISE, Profile
from .options import spelled


@dataclass(frozen=True)
class Capacity:
    """Resolved per-head capacity of an allocation.

    Attributes
    ----------
    capacity
        Average tokens kept per KV head, window and sink included.
    window, sink
        Tokens always kept per head: the last ``window`` prompt tokens and the first ``sink`` ones.
    ratio, prompt_len
        Set when the capacity was given as a share of a prompt length.
    """

    capacity: int
    window: int
    sink: int
    ratio: float | None = None
    prompt_len: int | None = None

    @property
    def base(self) -> int:
        """Tokens per head beyond the window and the sink (HeadKV's ``b``, DynamicKV's ``B``)."""
        return self.capacity - self.window - self.sink


def resolve_capacity(capacity: int | None = 128, window: int = 8, sink: int = 0, ratio: float | None = None,
                     prompt_len: int | None = None) -> Capacity:
    """Check and resolve the capacity parameters.

    ``ratio`` (a share of ``prompt_len``) replaces ``capacity`` when given.

    Raises
    ------
    HeadprobeError
        Negative window or sink, a capacity smaller than window + sink, a ratio outside (0, 1], or a
        ratio without a prompt length.
    """
    check_count("window", window, minimum=0)
    check_count("sink", sink, minimum=0)
    if prompt_len is not None:
        check_count("prompt_len", prompt_len)
    if ratio is not None:
        if not (0 < ratio <= 1):
            raise HeadprobeError(f"{param('ratio', ratio)}: expected a share of the prompt in (0, 1]")
        if prompt_len is None:
            raise HeadprobeError(f"a ratio needs a prompt length ({param('prompt_len')}) to turn into a capacity")
        capacity = math.floor(ratio * prompt_len + 0.5)
    if capacity is None:
        raise HeadprobeError(f"{param('capacity')}: expected a whole number of tokens per head, or a ratio")
    check_count("capacity", capacity)
    if capacity <= window + sink:
        raise HeadprobeError(
            f"capacity {capacity} must be larger than the window ({window}) plus the sink ({sink}): "
            "there would be no tokens left to choose")
    return Capacity(int(capacity), int(window), int(sink), ratio, prompt_len)


def check_beta(beta: float) -> float:
    """HeadKV's β must be a finite number above 1 (β = 1 leaves no shared pool, β < 1 a negative floor)."""
    if not isinstance(beta, (int, float)) or isinstance(beta, bool) or not math.isfinite(beta) or beta <= 1:
        raise HeadprobeError(f"beta must be a number larger than 1, got {beta!r}")
    return float(beta)


def check_temperature(temperature: float | None) -> None:
    """A score temperature must be unset or a positive finite number."""
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or not math.isfinite(temperature) or temperature <= 0):
        raise HeadprobeError(f"{spelled('temperature', temperature)}: expected a positive finite number")


def prepare_scores(scores: Any, temperature: float | None = None, allow_fallback: bool = False,
                   what: str = "profile") -> tuple[np.ndarray, bool]:
    """Turn head scores into non-negative weights summing to 1.

    Parameters
    ----------
    scores
        ``[layers][heads]`` scores.
    temperature
        Optional: weights ``∝ score ** (1 / temperature)``; above 1 flattens, below 1 sharpens.
        ``None`` or 1 leaves the scores as they are (HeadKV).
    allow_fallback
        With all-zero or non-finite scores, return uniform weights instead of refusing.

    Returns
    -------
    weights, fell_back
        ``[layers][heads]`` float64 summing to 1, and whether the uniform fallback was used.

    Raises
    ------
    HeadprobeError
        Scores below ``-NEGATIVE_NOISE``, or all-zero / NaN scores without ``allow_fallback``.
    """
    s = np.asarray(scores, dtype=np.float64)
    check_temperature(temperature)
    bad = None
    if not np.all(np.isfinite(s)):
        bad = "has NaN or infinite scores"
    elif np.any(s < -NEGATIVE_NOISE):
        raise HeadprobeError(f"{what} has negative scores (min {s.min():.3g}); head scores must be >= 0")
    else:
        s = np.maximum(s, 0.0)  # learned gates (DuoAttention) end slightly below 0: that is 0
        if not np.any(s > 0):
            bad = "has all-zero scores"
    if bad:
        if not allow_fallback:
            raise HeadprobeError(f"{what} {bad}: nothing to allocate by (pass {spelled('allow_fallback', True)} "
                                 "to allocate uniformly instead)")
        return np.full(s.shape, 1.0 / s.size), True
    with np.errstate(over="ignore"):
        total = s.sum()
    if (temperature is None or temperature == 1) and np.isfinite(total):
        return s / total, False
    return tempered_weights(s, 1.0 if temperature is None else float(temperature)), False


def tempered_weights(scores: np.ndarray, temperature: float) -> np.ndarray:
    """``score ** (1 / temperature)`` normalised to sum 1, computed in log space.

    ``exp((log s − max log s) / T)`` is the same distribution (a softmax of ``log s / T``) without
    overflow or underflow: the best head's weight is exactly 1 before normalising, so a tiny temperature
    gives every weight to the best head(s), a huge one spreads it evenly over the heads with a positive
    score, and scores near the float limit sum without overflowing. Zero scores keep zero weight.

    Parameters
    ----------
    scores
        ``[layers][heads]`` finite, non-negative, at least one positive.
    """
    weights = np.zeros_like(scores, dtype=np.float64)
    positive = scores > 0
    logs = np.log(scores[positive])
    weights[positive] = np.exp((logs - logs.max()) / temperature)
    return weights / weights.sum()


def check_profile_model(profile: Profile, model: ModelIdentity | None) -> ModelIdentity:
    """The model to allocate for: ``model`` if given (the profile must fit it), else the profile's."""
    if model is None:
        return profile.model
    profile.model.check_fits(model, what=f"{profile.kind} profile")
    return model


def source_entry(profile: Profile, path: str | None = None) -> dict[str, Any]:
    """The ``method.sources`` entry citing a profile."""
    src = path if path is not None else profile.probe.get("path") if isinstance(profile.probe, dict) else None
    return {"kind": profile.kind, "fingerprint": profile.fingerprint, "path": None if src is None else str(src)}


def build_budget_map(model: ModelIdentity, budgets: np.ndarray, method: dict[str, Any],
                     granularity: str = "kv_head") -> BudgetMap:
    """Wrap integer budgets in a :class:`BudgetMap`; shares are budgets divided by their total."""
    b = np.asarray(budgets, dtype=np.int64)
    total = int(b.sum())
    shares = (b / total) if total > 0 else np.full(b.shape, 1.0 / b.size)
    return BudgetMap(model=model, method=method, shares=shares.tolist(), budgets=b.tolist(),
                     granularity=granularity)


def method_block(allocator: str, cap: Capacity, **extra: Any) -> dict[str, Any]:
    """Every parameter that produced a map, in the shape :class:`BudgetMap.method` documents."""
    out: dict[str, Any] = {
        "allocator": allocator, "beta": None, "capacity": cap.capacity, "ratio": cap.ratio,
        "prompt_len": cap.prompt_len, "window": cap.window, "sink": cap.sink, "temperature": None,
        "reduction": None, "compat": None, "sources": [],
    }
    out.update(extra)
    return out


