"""Choosing a layer split: which layers stay global and which keep a window, under an engine's rule.

Layers are ranked by a profile's layer scores (DynamicKV's layer retention, or head scores summed or
averaged over each layer's KV heads); the best-scored layers stay global, as many as the memory target
allows at the context length, the others keep the window ``W``. Layers the model already has as sliding
(Gemma 3's local layers) stay local, at most at their own window. Each engine constrains the split
(:data:`ENGINE_RULES`): vLLM and llama.cpp give every local layer one window and keep no sink;
TensorRT-LLM takes a window per layer and one sink.

Registered as two allocation methods whose budget map carries the split (``method.layer_split``):
``layer_split`` (a layer-retention profile) and ``layer_split_heads`` (a head-score profile).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..budget_map import BudgetMap
from ..errors import HeadprobeError, param
from ..layer_split import DTYPE_BYTES, ENGINES, GLOBAL, LayerSplit, token_bytes
from ..limits import check_count
from ..models.identity import ModelIdentity
from ..profile import Profile, kv_head_scores
from .common import build_budget_map
from .dynamickv_offline import retention_shares
from .options import spelled

#: The policy that runs a split as the engine does (``headprobe.runtime.policies.layer_window``).
SPLIT_POLICY = "layer_window"
LAYER_SCORES = ("sum", "mean")


@dataclass(frozen=True)
class EngineRule:
    """What an engine lets a split do.

    Attributes
    ----------
    one_window
        Every local layer has the same window (vLLM's ``sliding_window``, llama.cpp's ``n_swa``).
    sink
        The engine keeps a sink on local layers (TensorRT-LLM's ``sink_token_length``).
    """

    one_window: bool
    sink: bool


ENGINE_RULES: dict[str, EngineRule] = {
    "vllm": EngineRule(one_window=True, sink=False),
    "tensorrt-llm": EngineRule(one_window=False, sink=True),
    "llama.cpp": EngineRule(one_window=True, sink=False),
}


@dataclass(frozen=True)
class SplitTarget:
    """How much the split may keep: ``global_layers`` layers whole, at most ``bytes`` of keys and values
    for one sequence at ``context`` tokens, at most ``share`` of the full cache there, or at most ``capacity``
    tokens per KV head on average at ``context`` tokens (``capacity / context`` of the full cache)."""

    context: int
    capacity: int | None = None
    global_layers: int | None = None
    bytes: int | None = None
    share: float | None = None


def layer_scores(profile: Profile, task: str | Mapping[str, float] | None = None,
                 layer_score: str = "sum") -> np.ndarray:
    """``[layers]`` one score per layer: the layer-retention shares of ``task`` (a layer-retention profile),
    else the ``layer_score`` (``sum`` or ``mean``) of the layer's KV-head scores."""
    if profile.retention:
        return retention_shares(profile, task)[0]
    if layer_score not in LAYER_SCORES:
        raise HeadprobeError(f"{spelled('layer_score', layer_score)}: expected one of {', '.join(LAYER_SCORES)}")
    kv = np.asarray(kv_head_scores(profile), dtype=np.float64)
    return kv.sum(axis=1) if layer_score == "sum" else kv.mean(axis=1)


def local_windows(model: ModelIdentity, engine: str, window: int) -> list[int | None]:
    """``[layers]`` the window each layer keeps when local: ``window``, except the model's own sliding
    layers, which keep at most their own window (one-window engines refuse a larger ``window``)."""
    if engine not in ENGINE_RULES:
        raise HeadprobeError(f"{spelled('engine', engine)}: expected one of {', '.join(ENGINES)}")
    native = model.sliding_window
    sliding = [t == "sliding_attention" for t in model.layer_types]
    if any(sliding) and native and window > native and ENGINE_RULES[engine].one_window:
        raise HeadprobeError(f"{param('window', window)}: {model.name}'s own sliding layers keep {native} tokens "
                             f"and {engine} gives every local layer one window; use a window of at most {native}")
    return [min(window, native) if s and native else window for s in sliding]


def choose_globals(scores: np.ndarray, candidates: list[int], count: int) -> list[int]:
    """The ``count`` best-scored candidate layers (ties: the lower layer)."""
    order = sorted(candidates, key=lambda i: (-float(scores[i]), i))
    return sorted(order[:count])


def globals_for_target(windows: list[int], candidates: list[int], target: SplitTarget, token_bytes: int = 1) -> int:
    """How many candidate layers can stay global within ``target`` (all layers local at their window
    otherwise). ``token_bytes``: the bytes one token takes in one layer (for a ``bytes`` target).

    Raises
    ------
    HeadprobeError
        More global layers than candidates, or a target below what every layer local keeps.
    """
    if target.global_layers is not None:
        if target.global_layers > len(candidates):
            raise HeadprobeError(f"{param('global_layers', target.global_layers)}: the model has {len(candidates)} "
                                 "layers that can stay global")
        return target.global_layers
    n = target.context
    base = sum(min(n, w) for w in windows)
    if target.bytes is not None:
        allowed = target.bytes // token_bytes
        if base > allowed:
            raise HeadprobeError(f"{param('cache_bytes', target.bytes)} at {param('prompt_len', n)}: every layer "
                                 f"local keeps {base * token_bytes} bytes; lower the window or raise the bytes")
    elif target.share is not None:
        allowed = int(target.share * n * len(windows))
        if base > allowed:
            raise HeadprobeError(f"{param('cache_share', target.share)} at {param('prompt_len', n)}: every layer "
                                 f"local keeps {base / (n * len(windows)):.1%} of the full cache; lower the window "
                                 "or raise the share")
    else:
        allowed = target.capacity * len(windows)
        if base > allowed:
            raise HeadprobeError(f"{param('capacity', target.capacity)} at {param('prompt_len', n)}: every layer "
                                 f"local keeps {base / len(windows):.0f} tokens per head on average; lower the "
                                 "window or raise the capacity")
    cost = [n - min(n, windows[i]) for i in candidates]
    step = max(cost) if cost else 0
    return len(candidates) if step == 0 else min(len(candidates), (allowed - base) // step)


def choose_layer_split(model: ModelIdentity, scores: Sequence[float], *, engine: str, window: int, target: SplitTarget,
                       sink: int = 0, dtype: str = "bfloat16", source: dict[str, Any] | None = None) -> LayerSplit:
    """The split that keeps the best-scored layers global within ``target``.

    Parameters
    ----------
    scores
        ``[layers]`` layer importance (:func:`layer_scores`).
    engine
        ``"vllm"``, ``"tensorrt-llm"`` or ``"llama.cpp"`` (:data:`ENGINE_RULES`).
    window
        Tokens a local layer attends (sink included).
    target
        The context and the memory target (:class:`SplitTarget`).
    sink
        First tokens local layers keep (TensorRT-LLM only).

    Raises
    ------
    HeadprobeError
        An unknown engine, a sink the engine does not keep, a window no larger than the sink, scores of
        the wrong length, or a target the split cannot meet.
    """
    check_count("prompt_len", target.context)
    check_count("window", window)
    check_count("sink", sink, minimum=0)
    windows = local_windows(model, engine, window)
    if sink and not ENGINE_RULES[engine].sink:
        raise HeadprobeError(f"{param('sink', sink)}: {engine} keeps no sink on sliding-window layers; use sink 0")
    if window <= sink or min(windows) <= sink:
        raise HeadprobeError(f"{param('window', window)}: a local layer's window must be larger than the sink ({sink})")
    s = np.asarray(scores, dtype=np.float64)
    if s.shape != (model.num_layers,) or not np.isfinite(s).all():
        raise HeadprobeError(f"layer scores: expected {model.num_layers} finite numbers, found shape {s.shape}")
    candidates = [i for i, t in enumerate(model.layer_types) if t != "sliding_attention"]
    if dtype not in DTYPE_BYTES:
        raise HeadprobeError(f"{param('dtype', dtype)}: expected one of {', '.join(DTYPE_BYTES)}")
    chosen = choose_globals(s, candidates, globals_for_target(windows, candidates, target, token_bytes(model, dtype)))
    layers = tuple(GLOBAL if i in chosen else windows[i] for i in range(model.num_layers))
    info = {"scores": [round(float(x), 6) for x in s], "capacity": target.capacity,
            "global_layers": target.global_layers, **({"bytes": target.bytes} if target.bytes is not None else {}),
            **({"share": target.share} if target.share is not None else {}),
            **(source or {})}
    return LayerSplit(model=model, engine=engine, layers=layers, sink=sink, context=target.context, dtype=dtype,
                      source=info)


def split_budget_map(split: LayerSplit, allocator: str = "layer_split", **options: Any) -> BudgetMap:
    """The split as a budget map (the split under ``method.layer_split``, ``options`` recorded beside it): each KV
    head keeps its layer's tokens at the split's context; it runs under the ``layer_window`` policy."""
    kept = np.asarray(split.kept_tokens(), dtype=np.int64)
    budgets = np.repeat(kept[:, None], split.model.num_kv_heads, axis=1)
    local = [int(w) for w in split.layers if w != GLOBAL]
    method = {"allocator": allocator, **options, "engine": split.engine, "capacity": max(1, round(float(kept.mean()))),
              "ratio": None, "prompt_len": split.context, "window": max(local) if local else None,
              "sink": split.sink, "layer_split": split.to_json(), "sources": [p for p in [split.source.get("profile")] if p],
              "run_with": {"policy": SPLIT_POLICY, "options": {"sink": split.sink}}}
    return build_budget_map(split.model, budgets, method)


__all__ = ("ENGINE_RULES", "LAYER_SCORES", "SPLIT_POLICY", "EngineRule", "SplitTarget", "choose_globals",
           "choose_layer_split", "globals_for_target", "layer_scores", "local_windows", "split_budget_map")
