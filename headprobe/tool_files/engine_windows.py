"""A layer split written as what a serving engine reads: vLLM ``hf_overrides``, TensorRT-LLM ``KvCacheConfig``
fields, llama.cpp GGUF metadata.

Each file is ``{"format": "headprobe.engine_split", "version": 1, "engine", "model", "fingerprint", <the
engine's own object>, "usage", "keeps"}``: the engine's object is pasted as it is (``hf_overrides``,
``kv_cache_config``, ``gguf_metadata`` with ``override_kv``), ``usage`` says where, and ``keeps`` what the
engine then keeps per layer at the split's context (``docs/interop.md``, "Layer splits").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..budget_map import BudgetMap
from ..errors import HeadprobeError
from ..files.jsonio import atomic_write_json
from ..files.overwrite import check_overwrite
from ..layer_split import GLOBAL, LayerSplit
from .engine_support import check_engine, check_llama_cpp_arch, check_vllm_arch, one_window

ENGINE_SPLIT_FORMAT = "headprobe.engine_split"


def split_of(source: LayerSplit | BudgetMap, target: str) -> LayerSplit:
    """The split a file holds: a :class:`LayerSplit`, or a budget map of ``allocate --method layer_split``."""
    if isinstance(source, LayerSplit):
        return source
    split = LayerSplit.in_map(source) if isinstance(source, BudgetMap) else None
    if split is None:
        raise HeadprobeError(f"--to {target} exports a layer split: give a split file or a budget map from "
                             "`headprobe allocate --method layer_split`")
    return split


def keeps(split: LayerSplit, rule: str) -> dict[str, Any]:
    """What the engine keeps per KV head of each layer at the split's context, and the bytes."""
    kept, full = split.kept_bytes(), split.full_bytes()
    return {"context": split.context, "rule": rule, "tokens_per_layer": split.kept_tokens(),
            "global_layers": split.global_layers, "bytes": kept, "full_bytes": full,
            "share": round(kept / full, 6), "dtype": split.dtype}


def _header(split: LayerSplit, engine: str) -> dict[str, Any]:
    return {"format": ENGINE_SPLIT_FORMAT, "version": 1, "engine": engine, "model": split.model.name,
            "fingerprint": split.model.fingerprint}


def vllm_overrides(split: LayerSplit) -> dict[str, Any]:
    """``hf_overrides`` for vLLM: ``layer_types`` (``sliding_attention`` for local layers) and ``sliding_window``."""
    check_engine(split, "vllm")
    cited = check_vllm_arch(split)
    window = one_window(split)
    types = ["full_attention" if w == GLOBAL else "sliding_attention" for w in split.layers]
    overrides = {"layer_types": types, "sliding_window": window}
    return {**_header(split, "vllm"), "hf_overrides": overrides, "read_by": cited,
            "usage": f"vllm serve {split.model.name} --hf-overrides '{json.dumps(overrides)}'  "
                     "(or LLM(..., hf_overrides=<hf_overrides>))",
            "keeps": keeps(split, f"a sliding_attention layer attends the last {window} tokens (the query "
                                  "included); a full_attention layer every token")}


def tensorrt_llm_config(split: LayerSplit) -> dict[str, Any]:
    """``KvCacheConfig`` fields: ``max_attention_window`` (one window per layer; the model's context for
    global layers) and ``sink_token_length``."""
    check_engine(split, "tensorrt-llm")
    full = split.model.max_context or split.context
    windows = [full if w == GLOBAL else int(w) for w in split.layers]
    cfg: dict[str, Any] = {"max_attention_window": windows}
    if split.sink:
        cfg["sink_token_length"] = split.sink
    rule = (f"a local layer attends the first {split.sink} tokens and the last (window - {split.sink}); "
            f"global layers a window of {full} tokens (the model's context)")
    return {**_header(split, "tensorrt-llm"), "kv_cache_config": cfg,
            "usage": "LLM(model, kv_cache_config=KvCacheConfig(**<kv_cache_config>))",
            "keeps": keeps(split, rule)}


def llama_cpp_metadata(split: LayerSplit) -> dict[str, Any]:
    """GGUF metadata: ``<arch>.attention.sliding_window``, for an architecture whose loader reads it."""
    check_engine(split, "llama.cpp")
    rule = check_llama_cpp_arch(split)
    window = one_window(split)
    key = f"{rule.gguf_arch}.attention.sliding_window"
    return {**_header(split, "llama.cpp"), "gguf_metadata": {key: window},
            "override_kv": [f"{key}=int:{window}"],
            "usage": (f"llama-cli -m MODEL.gguf --override-kv {key}=int:{window}; from Python, "
                      f"llama_cpp.Llama(MODEL, kv_overrides={{'{key}': {window}}}, swa_full=False) (the C API's "
                      "default, swa_full=True, gives a sliding layer every cell of the context)"),
            "keeps": keeps(split, f"n_swa = {window}: a sliding layer attends the last {window} tokens; layers "
                                  f"{split.global_layers} (the loader's fixed pattern) every token")}


WRITERS = {"vllm": vllm_overrides, "tensorrt-llm": tensorrt_llm_config, "llama.cpp": llama_cpp_metadata}


def write_engine_split(source: LayerSplit | BudgetMap, engine: str, path: str | Path, force: bool = False) -> Path:
    """Write the split as ``engine`` reads it (:data:`WRITERS`); refusals come before anything is written.

    Raises
    ------
    HeadprobeError
        Not a split, a split made for another engine, an architecture the engine cannot deploy it on, or an
        existing file without ``force``.
    """
    path = check_overwrite(path, force)
    data = WRITERS[engine](split_of(source, engine))
    return atomic_write_json(path, data, overwrite=force)


__all__ = ("ENGINE_SPLIT_FORMAT", "WRITERS", "keeps", "llama_cpp_metadata", "split_of", "tensorrt_llm_config",
           "vllm_overrides", "write_engine_split")
