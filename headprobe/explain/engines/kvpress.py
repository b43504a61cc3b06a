"""kvpress (NVIDIA/kvpress): what its ``DynamicCache`` holds for a budget.

kvpress compresses during prefill and decodes on transformers' ``DynamicCache``, which grows by one
token a head per generated token. Two mechanisms (read at NVIDIA/kvpress 8bb29b9):

- *shortening* presses write fewer keys and values back into the cache (``base_press.py:159``): memory
  follows the kept tokens (:mod:`.kvpress_presses`);
- *head-wise* presses (``AdaKVPress``, ``DuoAttentionPress``, and headprobe's ``BudgetMapPress``) set
  ``module.masked_key_indices`` and the attention patch replaces those keys by a key no query attends to
  (``attention_patch.py:47``: "does not reduce peak memory"): the cache keeps every token; only what
  attention reads shrinks.

Sliding-window layers (Gemma 3's local layers) are shown as transformers' sliding-window cache layer
holds them, ``sliding_window - 1`` tokens.
"""

from __future__ import annotations

import numpy as np

from ...budget_map import BudgetMap
from ...errors import HeadprobeError
from ...models.identity import ModelIdentity
from ...tool_files.layer_list import kvpress_layer_ratios
from ..setting import Setting
from ..sources import DuoPattern, PressSetting
from .allocation import EngineAllocation, dynamic
from .headprobe_runtime import MapWindow, resolved_budgets
from .kvpress_presses import (
    KVPRESS,
    adakv_floor,
    duo_press_streaming,
    kvpress_reported_ratio,
    press_kept,
    press_refusal,
    press_spec,
)

MASKS = ("masks the dropped keys instead of freeing them: the cache holds every token "
         f"({KVPRESS} kvpress/attention_patch.py:47)")


def _sliding(model: ModelIdentity, held: np.ndarray, context: int, appended: int) -> tuple[np.ndarray, np.ndarray]:
    """``held`` and ``held_end`` with the sliding-window layers at what transformers' sliding cache holds."""
    end = held + appended
    if "sliding_attention" in model.layer_types:
        held, end = held.copy(), end.copy()
        cap = int(model.sliding_window) - 1
        for i, kind in enumerate(model.layer_types):
            if kind == "sliding_attention":
                held[i] = min(context, cap)
                end[i] = min(context + appended, cap)
    return held, end


def _sliding_note(model: ModelIdentity, exact: bool) -> list[str]:
    if "sliding_attention" not in model.layer_types:
        return []
    if exact:
        return [f"sliding-window layers are left as they are (transformers keeps {model.sliding_window - 1} tokens)"]
    return [(f"sliding-window layers are shown uncompressed, as transformers' sliding cache holds them "
            f"({model.sliding_window - 1} tokens); what this press does to them is not modelled")]


def masked(setting_text: str, attended: np.ndarray, model: ModelIdentity, setting: Setting, notes: list[str],
           cites: list[str], exact_sliding: bool = True) -> EngineAllocation:
    """A row for a masking press: the cache holds the whole context, attention reads ``attended``."""
    full = np.full((model.num_layers, model.num_kv_heads), setting.context, dtype=np.int64)
    held, end = _sliding(model, full, setting.context, setting.appended)
    attended = np.minimum(np.asarray(attended, dtype=np.int64), held)
    row = dynamic("kvpress", setting_text, held, model, setting, attended=attended, frees_memory=False,
                  held_end=end, notes=[MASKS, *notes, *_sliding_note(model, exact_sliding)], cites=cites)
    return row


def budget_map_press(bm: BudgetMap, model: ModelIdentity, setting: Setting,
                     capacity: int | None = None) -> EngineAllocation:
    """headprobe's ``BudgetMapPress(map)`` (``headprobe.library_bridges.kvpress``): each head attends to the budget
    headprobe's runtime resolves for the context, with the map's window; the cache keeps everything."""
    window = int(bm.method.get("window") or 0)
    text = "BudgetMapPress(map" + (f", capacity={capacity}" if capacity is not None else "") + ")"
    cites = ["headprobe library_bridges/kvpress.py BudgetMapPress.budgets_for, BudgetMapPress.compress",
             f"{KVPRESS} kvpress/attention_patch.py:47"]
    try:
        budgets = resolved_budgets(bm, model, setting.context, MapWindow(window), capacity)
    except HeadprobeError as exc:
        return EngineAllocation.cannot_run("kvpress", text, f"BudgetMapPress refuses this map: {exc}", cites)
    return masked(text, budgets, model, setting, [], cites)


def per_layer_press_allocation(bm: BudgetMap, model: ModelIdentity, setting: Setting) -> EngineAllocation:
    """kvpress' ``PerLayerCompressionPress`` with the ratios of ``headprobe export --to kvpress-layers``: every
    head of layer ``l`` keeps ``int(N · (1 − r_l))`` tokens (one number a layer), and the cache shrinks."""
    text = f"per_layer_press(map, {setting.context}) (PerLayerCompressionPress)"
    cites = [f"{KVPRESS} kvpress/presses/per_layer_compression_press.py:56-61",
             f"{KVPRESS} kvpress/presses/scorer_press.py:94", "headprobe tool_files/layer_list.py kvpress_layer_ratios"]
    try:
        ratios = kvpress_layer_ratios(bm, setting.context)["compression_ratios"]
    except HeadprobeError as exc:
        return EngineAllocation.cannot_run("kvpress", text, str(exc), cites)
    kept = np.array([[int(setting.context * (1 - r))] * model.num_kv_heads for r in ratios], dtype=np.int64)
    held, end = _sliding(model, kept, setting.context, setting.appended)
    notes = ["one budget a layer: each layer's heads share the map's per-layer mean",
             "kvpress runs PerLayerCompressionPress with flash attention only", *_sliding_note(model, False)]
    return dynamic("kvpress", text, held, model, setting, held_end=end, notes=notes, cites=cites)


def press_allocation(press: PressSetting, model: ModelIdentity, setting: Setting) -> EngineAllocation:
    """A kvpress press by name at its ratio (see :data:`~.kvpress_presses.PRESSES`)."""
    spec = press_spec(press.name)
    options = spec.check_options(press.options)
    shown = "".join(f", {k}={v}" for k, v in options.items())
    text = f"{spec.cls}(compression_ratio={press.ratio:g}{shown})"
    n = setting.context
    if spec.kind == "adakv":
        text = (f"AdaKVPress(ScorerPress(compression_ratio={press.ratio:g}), "
                f"alpha_safeguard={options['alpha_safeguard']:g})")
    cites = [f"{KVPRESS} kvpress/presses/scorer_press.py:94", f"{KVPRESS} kvpress/presses/base_press.py:159"]
    why = press_refusal(spec, options, n)
    if why is not None:
        return EngineAllocation.cannot_run("kvpress", text, why, cites)
    kept = press_kept(spec, options, press.ratio, model, n)
    if spec.kind == "adakv":
        cites = [f"{KVPRESS} kvpress/presses/adakv_press.py:64-77", f"{KVPRESS} kvpress/attention_patch.py:47"]
        floor = adakv_floor(n, press.ratio, options["alpha_safeguard"])
        note = (f"each layer attends to {int(kept[0, 0]) * model.num_kv_heads} tokens split over its heads by "
                f"score (each at least {floor}); the per-head numbers shown are that mean")
        return masked(text, kept, model, setting, [note], cites, exact_sliding=False)
    if spec.kind == "pyramid":
        cites = [f"{KVPRESS} kvpress/presses/pyramidkv_press.py:67-84", f"{KVPRESS} kvpress/presses/base_press.py:159"]
    held, end = _sliding(model, kept, n, setting.appended)
    return dynamic("kvpress", text, held, model, setting, held_end=end, notes=_sliding_note(model, False),
                   cites=cites)


def duo_press_ratio(duo: DuoPattern, ratio: float | None, sparsity: float | None) -> tuple[float, str]:
    """kvpress' ``head_compression_ratio`` for a folder and where it came from: ``ratio``, else the
    ``sparsity`` given to DuoAttention, else the folder's ``sparsity`` (what ``DuoAttentionFolderPress``
    takes), else the share of values at or below 0.5."""
    if ratio is not None:
        return float(ratio), "given"
    if sparsity is not None:
        return float(sparsity), "the sparsity given"
    own = duo.config.get("sparsity")
    if isinstance(own, (int, float)) and not isinstance(own, bool):
        return float(own), "the folder's sparsity"
    return float((duo.clipped <= 0.5).mean()), "the share of values at or below 0.5"


def duo_attention_press(duo: DuoPattern, ratio: float, source: str, model: ModelIdentity,
                        setting: Setting) -> EngineAllocation:
    """kvpress' ``DuoAttentionPress`` (``DuoAttentionFolderPress`` for a local folder) at ``head_compression_ratio``:
    the lowest ``round(n · ratio)`` heads attend to ``sink_size + recent_size`` tokens, the others to all;
    the cache keeps everything."""
    n = setting.context
    mask, tie = duo_press_streaming(duo.clipped, ratio)
    window = duo.sink_size + duo.recent_size
    attended = np.where(mask, min(n, window), n).astype(np.int64)
    text = (f"DuoAttentionPress(head_compression_ratio={ratio:g}) ({source}; sink_size {duo.sink_size}, "
            f"recent_size {duo.recent_size})")
    cites = [f"{KVPRESS} kvpress/presses/duo_attention_press.py:83-87",
             f"{KVPRESS} kvpress/presses/duo_attention_press.py:107-116", f"{KVPRESS} kvpress/attention_patch.py:47"]
    reported = kvpress_reported_ratio(float(mask.mean()), duo.sink_size, duo.recent_size, n)
    notes = [(f"{int(mask.sum())} of {mask.size} KV heads streaming (round(n · head_compression_ratio)); the ratio is "
             f"a share of heads, not of the cache: kvpress reports compression_ratio {reported:.4g}")]
    if tie is not None:
        value, tied, chosen = tie
        notes.append(f"the cut runs through {tied} heads of equal value {value:.4g}: {chosen} of them streaming "
                     "(kvpress' np.argsort picks among them in no promised order)")
    if model.num_kv_heads == 1:
        notes.append("a one-KV-head TSV reads as 1-D with np.loadtxt: the stock DuoAttentionPress then masks nothing; "
                     "headprobe's DuoAttentionFolderPress reads it as [layers][1] (shown)")
    row = masked(text, attended, model, setting, notes, cites)
    row.extra = {"head_compression_ratio": ratio, "streaming_heads": int(mask.sum()),
                 "reported_compression_ratio": reported, "streaming": mask.astype(int).tolist()}
    return row


__all__ = ("MASKS", "budget_map_press", "duo_attention_press", "duo_press_ratio", "masked",
                "per_layer_press_allocation", "press_allocation")
