"""kvpress presses by name: what each keeps of a context, restated from NVIDIA/kvpress.

Read at NVIDIA/kvpress 8bb29b9 (pyproject version 0.5.4):

- every ``ScorerPress`` that does not override ``compress`` keeps ``n_kept = int(k_len · (1 −
  compression_ratio))`` tokens in every KV head of every layer and writes the shortened keys and values
  back into the cache (``kvpress/presses/scorer_press.py:94``, ``kvpress/presses/base_press.py:159``):
  the cache really shrinks;
- ``PyramidKVPress`` keeps a per-layer ``n_kept`` (``get_layer_budget``,
  ``kvpress/presses/pyramidkv_press.py:67-84``), also shortening the cache;
- ``AdaKVPress`` keeps ``n_kept`` tokens a head *on average* over a layer (each head at least
  ``int(n_kept · alpha_safeguard)``) by masking the others (``kvpress/presses/adakv_press.py:64-77``):
  the cache keeps every token (``kvpress/attention_patch.py:47``: "does not reduce peak memory").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import HeadprobeError, param
from ...head_ranking import rank_order
from ...models.identity import ModelIdentity

KVPRESS = "NVIDIA/kvpress@8bb29b9"


@dataclass(frozen=True)
class PressSpec:
    """One kvpress press.

    Attributes
    ----------
    name
        The name ``--press`` takes.
    cls
        kvpress' class.
    kind
        ``"scorer"`` (uniform, shortens the cache), ``"pyramid"`` (per layer, shortens) or ``"adakv"``
        (per head by score, masks).
    options
        The press's options that change what it keeps or how headprobe runs it, with kvpress' defaults.
    run_with
        The headprobe policy and options a budget map made from this press runs with.
    """

    name: str
    cls: str
    kind: str = "scorer"
    options: dict[str, Any] = field(default_factory=dict)
    run_with: tuple[str, dict[str, Any]] = ("snapkv", {})

    def check_options(self, given: dict[str, Any]) -> dict[str, Any]:
        """The press's options with ``given`` applied; unknown names are refused."""
        for key, value in given.items():
            if key not in self.options:
                have = ", ".join(self.options) or "none"
                raise HeadprobeError(f"{param('press_option', f'{key}={value}')}: {self.cls} has no option {key!r} "
                                     f"that changes what it keeps (options: {have})")
            default = self.options[key]
            if isinstance(default, int) and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise HeadprobeError(f"{param('press_option', f'{key}={value}')}: expected a whole number")
            if isinstance(default, float) and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                raise HeadprobeError(f"{param('press_option', f'{key}={value}')}: expected a number")
        return {**self.options, **given}


_SCORERS = {
    "cap": "CapPress", "compactor": "CompactorPress", "cur": "CURPress", "expected_attention": "ExpectedAttentionPress",
    "keydiff": "KeyDiffPress", "knorm": "KnormPress", "kvzap": "KVzapPress", "lagkv": "LagKVPress",
    "leverage": "LeverageScorePress", "non_causal_attention": "NonCausalAttnPress",
    "observed_attention": "ObservedAttentionPress", "qfilter": "QFilterPress", "random": "RandomPress",
    "tova": "TOVAPress",
}

#: Every press ``--press`` takes (``duo_attention`` needs a DuoAttention folder as input).
PRESSES: dict[str, PressSpec] = {
    "snapkv": PressSpec("snapkv", "SnapKVPress", options={"window_size": 64, "kernel_size": 5},
                        run_with=("snapkv", {"window": "window_size", "kernel_size": "kernel_size",
                                             "pooling": "avg"})),
    "streaming_llm": PressSpec("streaming_llm", "StreamingLLMPress", options={"n_sink": 4},
                               run_with=("streaming", {"sink": "n_sink"})),
    **{name: PressSpec(name, cls) for name, cls in _SCORERS.items()},
    "pyramidkv": PressSpec("pyramidkv", "PyramidKVPress", "pyramid",
                           options={"window_size": 64, "kernel_size": 5, "beta": 20},
                           run_with=("snapkv", {"window": "window_size", "kernel_size": "kernel_size",
                                                "pooling": "avg"})),
    "adakv": PressSpec("adakv", "AdaKVPress", "adakv", options={"alpha_safeguard": 0.2},
                       run_with=("snapkv", {"adaptive": True, "floor_share": "alpha_safeguard",
                                             "floor_of": "budget"})),
}

#: The press of a DuoAttention folder (its ``head_compression_ratio`` is a share of heads, not of tokens).
DUO_PRESS = "duo_attention"


def press_spec(name: str) -> PressSpec:
    """The :class:`PressSpec` of ``name`` (``snapkv`` or ``SnapKVPress``)."""
    for spec in PRESSES.values():
        if name in (spec.name, spec.cls):
            return spec
    if name in (DUO_PRESS, "DuoAttentionPress"):
        raise HeadprobeError(f"{param('press', name)}: DuoAttentionPress reads a head pattern; give the DuoAttention "
                             f"folder as input (its {param('ratio')} is kvpress' head_compression_ratio)")
    raise HeadprobeError(f"{param('press', name)}: expected one of {', '.join(PRESSES)} (explain models the "
                         "presses whose kept tokens follow from the ratio)")


def check_ratio(ratio: float | None, what: str = "compression_ratio") -> float:
    """kvpress' ``assert 0 <= compression_ratio < 1`` (``scorer_press.py:33``), as a one-line refusal."""
    if ratio is None:
        raise HeadprobeError(f"a kvpress press needs {param('ratio')} (its {what})")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
        raise HeadprobeError(f"{param('ratio', ratio)}: expected kvpress' {what} in [0, 1)")
    return float(ratio)


def scorer_kept(k_len: int, ratio: float) -> int:
    """``int(k_len * (1 - compression_ratio))`` (``scorer_press.py:94``; ratio 0 keeps everything, line 86)."""
    return k_len if ratio == 0 else int(k_len * (1 - ratio))


def pyramid_layer_budget(layer: int, layers: int, k_len: int, ratio: float, window_size: int, beta: float) -> int:
    """``PyramidKVPress.get_layer_budget`` (``pyramidkv_press.py:67-84``) for layer ``layer``."""
    if beta < 1:
        raise HeadprobeError(f"{param('press_option', f'beta={beta}')}: PyramidKVPress needs beta >= 1")
    max_capacity_prompt = window_size + k_len * (1 - ratio)
    min_num = (max_capacity_prompt - window_size) / beta
    max_num = (max_capacity_prompt - window_size) * 2 - min_num
    if max_num >= k_len - window_size:
        max_num = k_len - window_size
        min_num = (max_capacity_prompt - window_size) * 2 - max_num
    if not (k_len >= max_num >= min_num >= window_size):
        return round(k_len * (1 - ratio))
    steps = (max_num - min_num) / (layers - 1)
    return round(max_num - layer * steps)


def press_kept(spec: PressSpec, options: dict[str, Any], ratio: float, model: ModelIdentity,
               k_len: int) -> np.ndarray:
    """``int64 [layers][kv_heads]`` tokens a press keeps of a ``k_len``-token context (AdaKV: the mean a head
    keeps in each layer; its split over the heads depends on the scores)."""
    layers, heads = model.num_layers, model.num_kv_heads
    if spec.kind == "pyramid" and ratio != 0:       # compression_ratio 0 returns the keys as they are (line 96)
        per_layer = [pyramid_layer_budget(i, layers, k_len, ratio, options["window_size"], options["beta"])
                     for i in range(layers)]
        return np.repeat(np.asarray(per_layer, dtype=np.int64)[:, None], heads, axis=1)
    return np.full((layers, heads), scorer_kept(k_len, ratio), dtype=np.int64)


def press_refusal(spec: PressSpec, options: dict[str, Any], k_len: int) -> str | None:
    """Why kvpress cannot compress a ``k_len``-token context with this press (``None`` when it can)."""
    window = options.get("window_size")
    if window is not None and k_len <= window:
        return (f"{spec.cls} scores the {k_len} - window_size tokens before its window, so it needs a context "
                f"longer than window_size={window}")
    sink = options.get("n_sink")
    if sink is not None and k_len <= sink:
        return f"{spec.cls} asserts the context has more tokens than n_sink={sink} (streaming_llm_press.py:49)"
    return None


def run_with(spec: PressSpec, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The headprobe policy and options that reproduce the press's selection best (option names resolved)."""
    policy, template = spec.run_with
    out = {}
    for key, value in template.items():
        out[key] = options[value] if isinstance(value, str) and value in options else value
    if policy == "snapkv" and "window" not in out:
        out["window"] = 8
    return policy, out


def adakv_floor(k_len: int, ratio: float, alpha: float) -> int:
    """The fewest tokens AdaKVPress leaves a head: ``int(n_kept · alpha_safeguard)`` (``adakv_press.py:64-65``)."""
    return int(scorer_kept(k_len, ratio) * alpha)


def kvpress_reported_ratio(streaming_share: float, sink: int, recent: int, k_len: int) -> float:
    """What ``DuoAttentionPress.compression_ratio`` reports (``duo_attention_press.py:115-116``)."""
    return streaming_share * (1 - (sink + recent) / k_len)


def duo_press_streaming(values: np.ndarray, ratio: float) -> tuple[np.ndarray, tuple[float, int, int] | None]:
    """``bool [layers][kv_heads]`` the heads ``DuoAttentionPress`` makes streaming: the
    ``round(n · head_compression_ratio)`` lowest values (``duo_attention_press.py:83-87``).

    Returns the mask and, when the cut runs through equal values (``np.argsort`` then picks among them
    in an order numpy does not promise), ``(value, tied heads, of them streaming here)``; here the
    higher (layer, head) goes first.
    """
    v = np.asarray(values, dtype=np.float64)
    n_pruned = round(v.size * ratio)
    mask = np.zeros(v.size, dtype=bool)
    ascending = rank_order(v)[::-1]
    mask[ascending[:n_pruned]] = True
    tie = None
    if 0 < n_pruned < v.size:
        flat = v.ravel()
        edge = flat[ascending[n_pruned - 1]]
        if flat[ascending[n_pruned]] == edge:
            tied = flat == edge
            tie = (float(edge), int(tied.sum()), int((tied & mask).sum()))
    return mask.reshape(v.shape), tie


__all__ = ("DUO_PRESS", "KVPRESS", "PRESSES", "PressSpec", "adakv_floor", "check_ratio", "duo_press_streaming",
           "kvpress_reported_ratio", "press_kept", "press_refusal", "press_spec", "pyramid_layer_budget",
           "run_with", "scorer_kept")
