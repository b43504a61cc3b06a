"""``explain_budget``: any budget, in tokens and bytes, in every engine.

One call reads the input (nothing but small files: no model weights), resolves it to a KV-head budget at
the context asked for, and asks every engine module what it allocates for it. Every option is checked
before a file is read; an option that does not apply to the input is refused, not ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..allocation.api import allocate
from ..allocation.common import check_beta, check_temperature
from ..allocation.dynamickv_offline import parse_task_mix
from ..errors import HeadprobeError, param
from ..layer_split import LayerSplit
from ..limits import check_count
from ..models.registry import DEFAULT_MODEL
from .convert import GQA_RULES, Conversion, from_duoattention, from_headkv, from_press
from .engines.allocation import EngineAllocation
from .engines.duoattention import duo_allocation, duo_split, duo_static_allocation
from .engines.headkv import WINDOW as HEADKV_WINDOW
from .engines.headkv import check_engine_capacity, headkv_allocation
from .engines.headprobe_runtime import MapWindow, resolved_budgets, runtime_allocation, runtime_policy
from .engines.kvcache_factory import factory_allocation
from .engines.kvpress import (
    budget_map_press,
    duo_attention_press,
    duo_press_ratio,
    per_layer_press_allocation,
    press_allocation,
)
from .engines.kvpress_presses import check_ratio, press_kept, press_spec, run_with
from .engines.serving_windows import not_a_split_rows, serving_rows
from .explanation import Explanation
from .model_shape import model_shape
from .setting import DEFAULT_NEW_TOKENS, Setting
from .sources import KIND_NAMES, ExplainInput, PressSetting, read_input

#: Which inputs each option applies to.
APPLIES: dict[str, tuple[str, ...]] = {
    "method": ("profile",), "window": ("profile",), "sink": ("profile",), "reduction": ("profile",),
    "task": ("profile",), "temperature": ("profile", "headkv"), "capacity": ("budget_map", "profile", "headkv"),
    "beta": ("profile", "headkv"), "sparsity": ("duoattention",), "sink_size": ("duoattention",),
    "recent_size": ("duoattention",), "gqa": ("headkv",), "ratio": ("kvpress", "duoattention"),
    "press_options": ("kvpress",),
}

#: Profile allocation defaults (those of ``headprobe allocate``).
DEFAULT_CAPACITY, DEFAULT_WINDOW = 128, 8


def _check_options(o: dict[str, Any]) -> None:
    """Refuse bad values before any file is read."""
    if o["capacity"] is not None:
        check_count("capacity", o["capacity"])
    for key in ("window", "sink", "sink_size"):
        if o[key] is not None:
            check_count(key, o[key], minimum=0)
    if o["recent_size"] is not None:
        check_count("recent_size", o["recent_size"], minimum=1)
    if o["beta"] is not None:
        check_beta(o["beta"])
    check_temperature(o["temperature"])
    s = o["sparsity"]
    if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s <= 1):
        raise HeadprobeError(f"{param('sparsity', s)}: expected DuoAttention's share of streaming heads in [0, 1]")
    if o["ratio"] is not None:
        check_ratio(o["ratio"])
    if o["gqa"] is not None and o["gqa"] not in GQA_RULES:
        raise HeadprobeError(f"{param('gqa', o['gqa'])}: expected one of {', '.join(GQA_RULES)}")
    if o["press_options"] and o["press"] is None:
        raise HeadprobeError(f"{param('press_options')} needs {param('press')}")


def _check_applies(kind: str, o: dict[str, Any]) -> None:
    for key, kinds in APPLIES.items():
        given = o[key] not in (None, {}) if key == "press_options" else o[key] is not None
        if given and kind not in kinds:
            where = " or ".join(KIND_NAMES[k] for k in kinds)
            raise HeadprobeError(f"{param(key)} applies to {where}; the input is {KIND_NAMES[kind]}")


def explain_budget(inputs: str | Path | Sequence[str | Path] = (), *, context: int, model: str | None = None,
                   batch: int = 1, dtype: str = "bfloat16", max_new_tokens: int = DEFAULT_NEW_TOKENS,
                   policy: str | None = None, policy_options: Mapping[str, Any] | None = None,
                   method: str | None = None, capacity: int | None = None, beta: float | None = None,
                   window: int | None = None, sink: int | None = None, temperature: float | None = None,
                   reduction: str | None = None, task: str | Mapping[str, float] | None = None,
                   sparsity: float | None = None, sink_size: int | None = None, recent_size: int | None = None,
                   gqa: str | None = None, press: str | None = None, ratio: float | None = None,
                   press_options: Mapping[str, Any] | None = None) -> Explanation:
    """Explain a budget at a context length: tokens and bytes per layer and KV head, and what every engine
    (headprobe's runtime, kvpress, HeadKV, KVCache-Factory, DuoAttention; vLLM, TensorRT-LLM and llama.cpp for
    a layer split) allocates for it.

    Parameters
    ----------
    inputs
        A budget map (one of ``allocate --method layer_split`` included) or a layer-split file; one or two
        profiles; a DuoAttention folder (or its TSV); a HeadKV / Retrieval_Head score file; or nothing, with
        ``press`` and ``ratio``.
    context
        ``N``: prompt tokens of each sequence.
    model
        Alias, Hugging Face id or folder whose shape is used (read from its config, never its weights);
        files that record their model must fit it. A kvpress press without it is explained for the
        default model.
    batch, dtype, max_new_tokens
        Sequences at once, the cache's element type (``float32``, ``bfloat16``, ``float16``) and tokens
        generated after the prompt.
    policy, policy_options
        The runtime policy headprobe's row uses (``snapkv``, ``streaming`` or ``layer_window``) and its
        options; default: how the budget map says it runs (``method.run_with``), else ``snapkv`` with its window.
    method, capacity, beta, window, sink, temperature, reduction, task
        A profile's allocation, as ``headprobe allocate`` takes them (default ``headkv`` for a head-score
        profile, ``dynamickv`` for a layer-retention profile, ``combined`` for both; capacity 128, window
        8). ``capacity`` rescales a budget map (as ``generate --capacity``) and is HeadKV's
        ``--max_capacity_prompts`` for a score file (with ``beta``, default 1.2, and ``temperature`` =
        ``1 / --temp``).
    sparsity, sink_size, recent_size
        A DuoAttention folder: ``--sparsity`` (default: values above 0.5) and the window sizes (its config).
    gqa
        A score file's KV-head equivalent: ``mean`` (default) or ``sum`` of each KV head's query heads.
    press, ratio, press_options
        A kvpress press by name and its ``compression_ratio`` (for a DuoAttention folder, ``ratio`` is
        ``DuoAttentionPress``' ``head_compression_ratio``) and options such as ``window_size``.

    Returns
    -------
    Explanation

    Raises
    ------
    HeadprobeError
        A bad value, an option that does not apply to the input, a file that is none of the inputs or that
        was made for another model.
    """
    options = _option_dict(method, capacity, beta, window, sink, temperature, reduction, task, sparsity, sink_size,
                           recent_size, gqa, press, ratio, press_options)
    setting = Setting(context, batch, dtype, max_new_tokens)
    inp = _checked_input(inputs, model, options, policy, policy_options)
    return _explanation(inp, setting, options, policy, policy_options)


def _option_dict(method, capacity, beta, window, sink, temperature, reduction, task, sparsity, sink_size, recent_size,
                 gqa, press, ratio, press_options) -> dict[str, Any]:
    """:func:`explain_budget`'s input options by name (``press_options`` a dict, empty when not given)."""
    return {"method": method, "capacity": capacity, "beta": beta, "window": window, "sink": sink,
            "temperature": temperature, "reduction": reduction, "task": task, "sparsity": sparsity,
            "sink_size": sink_size, "recent_size": recent_size, "gqa": gqa, "press": press, "ratio": ratio,
            "press_options": dict(press_options or {})}


def _checked_input(inputs: str | Path | Sequence[str | Path], model: str | None, options: dict[str, Any],
                   policy: str | None, policy_options: Mapping[str, Any] | None) -> ExplainInput:
    """Check every option, then read the input (with ``model``'s shape, :data:`DEFAULT_MODEL`'s for a press
    alone) and refuse options that do not apply to its kind."""
    press, ratio = options["press"], options["ratio"]
    _check_options(options)
    spec = press_spec(press) if press is not None else None
    if spec is not None:
        spec.check_options(options["press_options"])
        check_ratio(ratio)
    if policy is not None:
        runtime_policy(policy, dict(policy_options or {}))
    elif policy_options:
        raise HeadprobeError(f"{param('policy_options')} needs {param('policy')}")
    paths = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    if paths and press is not None:
        raise HeadprobeError(f"{param('press')} explains a kvpress press without an input file; for a DuoAttention "
                             f"folder, {param('ratio')} is DuoAttentionPress' head_compression_ratio")
    if not paths and press is not None and model is None:
        model = DEFAULT_MODEL
    identity = model_shape(model) if model is not None else None
    press_setting = PressSetting(press, ratio, options["press_options"]) if press is not None else None
    inp = read_input(paths, identity, press_setting, options["sink_size"], options["recent_size"])
    _check_applies(inp.kind, options)
    return inp


def _explanation(inp: ExplainInput, setting: Setting, options: dict[str, Any], policy: str | None,
                 policy_options: Mapping[str, Any] | None) -> Explanation:
    """The input's budget at ``setting`` and every engine's allocation of it, headprobe's runtime first."""
    build = {"budget_map": _budget_map, "profile": _profile, "duoattention": _duoattention, "headkv": _headkv,
             "kvpress": _kvpress}[inp.kind]
    conversion, rows, notes, applied = build(inp, setting, options)
    rescale = options["capacity"] if inp.kind == "budget_map" else None
    run_policy = policy or conversion.policy
    run_options = dict(policy_options or {}) if policy is not None else dict(conversion.options)
    runtime = runtime_allocation(conversion.budget_map, inp.model, setting, run_policy, run_options, rescale,
                                 str(inp.paths[0]) if inp.kind == "budget_map" else "FILE")
    budget = runtime.held if runtime.runs else _budget_tokens(conversion, inp, setting, rescale)
    source = {"kind": inp.kind, "paths": [str(p) for p in inp.paths], "fingerprint": inp.fingerprint,
              "description": inp.describe() + (f" ({applied})" if applied else ""), "options": _given(options)}
    return Explanation(inp.model, setting, source, np.asarray(budget, dtype=np.int64), conversion.budget_map,
                       {"policy": run_policy, "options": run_options}, [runtime, *rows], notes)


def _budget_tokens(conversion: Conversion, inp: ExplainInput, setting: Setting, rescale: int | None) -> np.ndarray:
    """The budget's tokens at the context when headprobe's runtime refuses the chosen policy: the map read with
    its own window, else its budgets capped at the context."""
    bm = conversion.budget_map
    split = LayerSplit.in_map(bm)
    if split is not None:                         # a layer split: its windows at any context, nothing rescaled
        kept = np.asarray(split.kept_tokens(setting.context), dtype=np.int64)
        return np.repeat(kept[:, None], inp.model.num_kv_heads, axis=1)
    try:
        return resolved_budgets(bm, inp.model, setting.context, MapWindow(int(bm.method.get("window") or 0)), rescale)
    except HeadprobeError:
        return np.minimum(np.asarray(bm.budgets, dtype=np.int64), setting.context)


def _given(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v not in (None, {})}


# ---- one builder per input kind: (conversion, engine rows besides headprobe's, notes, description) ---------------

def _map_rows(bm, model, setting: Setting, capacity: int | None) -> list[EngineAllocation]:
    return [budget_map_press(bm, model, setting, capacity), per_layer_press_allocation(bm, model, setting)]


def _no_headkv(why: str) -> list[EngineAllocation]:
    return [EngineAllocation.cannot_run("HeadKV", "--max_capacity_prompts C --beta B", why),
            EngineAllocation.cannot_run("KVCache-Factory", "--method HeadKV --max_capacity_prompts C --head_beta B",
                                        why)]


def _no_duo(why: str) -> EngineAllocation:
    return EngineAllocation.cannot_run("DuoAttention", "a head pattern (full_attention_heads.tsv)", why)


def _map_policy(bm) -> tuple[str, dict[str, Any]]:
    run = bm.method.get("run_with")
    if isinstance(run, dict) and isinstance(run.get("policy"), str) and isinstance(run.get("options"), dict):
        return run["policy"], dict(run["options"])
    return "snapkv", {"window": max(int(bm.method.get("window") or DEFAULT_WINDOW), 1)}


def _budget_map(inp: ExplainInput, setting: Setting, o: dict[str, Any]):
    bm = inp.budget_map
    policy, options = _map_policy(bm)
    split = LayerSplit.in_map(bm)
    rows = serving_rows(split, inp.model, setting) if split is not None else []
    rows += _map_rows(bm, inp.model, setting, o["capacity"])
    why = ("takes a score file and allocates by its own formula, not a per-head budget map; explain the profile "
           "the map came from (with its HeadKV setting) instead")
    rows += _no_headkv(why)
    rows.append(_no_duo("splits whole KV heads into full and streaming; a budget map gives every head its own "
                        "token count (headprobe export MAP --to duoattention makes such a split)"))
    if split is None:
        rows += not_a_split_rows()
    notes = []
    made_for = bm.method.get("prompt_len")
    if split is not None:
        notes.append(f"a layer split ({split.engine}, sized at {split.context} tokens) keeps its windows at any "
                     f"context: local layers their window, global layers {split.global_layers} every token")
    elif isinstance(made_for, int) and made_for != setting.context and bm.method.get("run_with"):
        notes.append(f"this map is exact for a {made_for}-token context (method.prompt_len); at {setting.context} "
                     "tokens the runtime rescales it by its shares")
    applied = f"{bm.method.get('allocator')}" + (f", rescaled to capacity {o['capacity']}" if o["capacity"] else "")
    return Conversion(bm, policy, options), rows, notes, applied


def _profile(inp: ExplainInput, setting: Setting, o: dict[str, Any]):
    method = o["method"] or _default_method(inp.profiles)
    capacity = o["capacity"] if o["capacity"] is not None else DEFAULT_CAPACITY
    window = o["window"] if o["window"] is not None else DEFAULT_WINDOW
    sink = o["sink"] or 0
    task = parse_task_mix(o["task"]) if isinstance(o["task"], str) else o["task"]
    bm = allocate(method, inp.profiles, inp.model, capacity=capacity, window=window, sink=sink, beta=o["beta"],
                  temperature=o["temperature"], reduction=o["reduction"], task=task,
                  source_paths=[str(p) for p in inp.paths])
    policy, options = "snapkv", {"window": max(window, 1)}
    rows = _map_rows(bm, inp.model, setting, None)
    heads = next((p for p in inp.profiles if p.query_heads is not None), None)
    beta = bm.method.get("beta")
    if method != "headkv" or heads is None:
        rows += _no_headkv(f"allocates by HeadKV's formula only; the {method} allocation has no HeadKV setting")
    elif window != HEADKV_WINDOW or sink:
        rows += _no_headkv(f"keeps an {HEADKV_WINDOW}-token window and no sink; this allocation has window {window}, "
                           f"sink {sink}")
    else:
        scores = np.asarray(heads.query_heads, dtype=np.float64)
        temp = 1.0 if o["temperature"] is None else 1.0 / o["temperature"]
        rows.append(headkv_allocation(scores, inp.model, setting, capacity, beta, temp))
        rows += _factory_rows(scores, inp.model, setting, capacity, beta, o["temperature"])
    rows.append(_no_duo("takes a head pattern; headprobe export PROFILE --to duoattention writes one (a different "
                        "budget: whole heads full or streaming)"))
    rows += not_a_split_rows()
    params = ", ".join(f"{k} {bm.method[k]}" for k in ("capacity", "beta", "window", "sink", "temperature")
                       if bm.method.get(k) is not None)
    return Conversion(bm, policy, options), rows, [], f"allocated: {method}, {params}"


def _default_method(profiles) -> str:
    """``headkv`` for head scores, ``dynamickv`` for layer retention alone, ``combined`` for both."""
    heads = any(p.query_heads is not None for p in profiles)
    layers = any(p.retention for p in profiles)
    return "combined" if heads and layers and len(profiles) > 1 else "dynamickv" if layers and not heads else "headkv"


def _factory_rows(scores, model, setting: Setting, capacity: int, beta: float,
                  temperature: float | None) -> list[EngineAllocation]:
    flag = capacity - HEADKV_WINDOW
    if temperature not in (None, 1):
        why = "has no --temp: its shares are the scores' own"
        return [EngineAllocation.cannot_run("KVCache-Factory", f"--max_capacity_prompts {flag} --head_beta {beta:g}",
                                            why)]
    rows = [factory_allocation(scores, model, setting, flag, beta, g) for g in ("query_head", "kv_head")]
    for r in rows:
        if r.runs:
            r.notes.insert(0, f"--max_capacity_prompts {flag} here is HeadKV's {capacity}: KVCache-Factory keeps its "
                              f"{HEADKV_WINDOW}-token window on top of it")
    return rows


def _duoattention(inp: ExplainInput, setting: Setting, o: dict[str, Any]):
    duo = inp.duo
    sparsity = o["sparsity"]
    full, tie = duo_split(duo, sparsity)
    rule = {"sparsity": sparsity} if sparsity is not None else {"threshold": 0.5}
    conversion = from_duoattention(inp, full, setting.context, rule)
    ratio, where = duo_press_ratio(duo, o["ratio"], sparsity)
    rows = [duo_allocation(duo, inp.model, setting, sparsity), duo_static_allocation(duo, inp.model, setting, sparsity),
            duo_attention_press(duo, ratio, f"head_compression_ratio from {where}", inp.model, setting)]
    rows += _no_headkv("takes a score file and gives every query head its own budget; a DuoAttention pattern makes "
                       "whole KV heads full or streaming")
    rows += not_a_split_rows()
    notes = []
    if setting.context <= duo.sink_size + duo.recent_size:
        notes.append(f"at {setting.context} tokens a streaming head holds the whole context (sink_size + "
                     f"recent_size = {duo.sink_size + duo.recent_size}): nothing is dropped")
    if tie is not None:
        notes.append("the split runs through equal values (see DuoAttention below)")
    applied = (f"--sparsity {sparsity:g}" if sparsity is not None else "values above 0.5 full") + \
        f", sink_size {duo.sink_size}, recent_size {duo.recent_size}"
    return conversion, rows, notes, applied


def _headkv(inp: ExplainInput, setting: Setting, o: dict[str, Any]):
    capacity = o["capacity"] if o["capacity"] is not None else DEFAULT_CAPACITY
    beta = o["beta"] if o["beta"] is not None else 1.2
    check_engine_capacity(capacity, beta)
    temp = 1.0 if o["temperature"] is None else 1.0 / o["temperature"]
    gqa = o["gqa"] or "mean"
    conversion = from_headkv(inp, inp.scores, setting.context, capacity, beta, temp, gqa, inp.score_source or "headkv")
    rows = [headkv_allocation(inp.scores, inp.model, setting, capacity, beta, temp)]
    rows += _factory_rows(inp.scores, inp.model, setting, capacity, beta, o["temperature"])
    rows.append(budget_map_press(conversion.budget_map, inp.model, setting))
    rows.append(_no_duo("takes a head pattern, not a score file (headprobe import FILE, then export --to "
                        "duoattention)"))
    rows += not_a_split_rows()
    notes = []
    if inp.model.group_size > 1:
        rule = ("the rounded mean of its query heads' tokens (KVCache-Factory's kv_head granularity)" if gqa == "mean"
                else "the sum of its query heads' tokens, capped at the context (the memory HeadKV's cache holds)")
        notes.append(f"the budget gives each KV head {rule}")
    applied = f"--max_capacity_prompts {capacity} --beta {beta:g} --temp {temp:g}, KV heads by {gqa}"
    return conversion, rows, notes, applied


def _kvpress(inp: ExplainInput, setting: Setting, o: dict[str, Any]):  # noqa: ARG001 (every engine takes the same arguments)
    press = inp.press
    spec = press_spec(press.name)
    opts = spec.check_options(press.options)
    kept = press_kept(spec, opts, press.ratio, inp.model, setting.context)
    policy, run_options = run_with(spec, opts)
    window = int(opts.get("window_size", 0)) if spec.name in ("snapkv", "pyramidkv") else 0
    sink = int(opts.get("n_sink", 0))
    conversion = from_press(inp, np.minimum(kept, setting.context), setting.context, window, sink, policy,
                            run_options, {"name": spec.name, "class": spec.cls, "compression_ratio": press.ratio,
                                          "options": opts})
    rows = [press_allocation(press, inp.model, setting)]
    rows += _no_headkv("takes a score file; a kvpress ratio has no head scores")
    rows.append(_no_duo("takes a head pattern; a kvpress ratio has none"))
    rows += not_a_split_rows()
    notes = []
    if policy == "snapkv" and spec.name not in ("snapkv", "pyramidkv", "adakv"):
        notes.append(f"headprobe has no {spec.cls} policy: its row selects tokens with snapkv (the same budgets)")
    return conversion, rows, notes, ""


__all__ = ("APPLIES", "explain_budget")
