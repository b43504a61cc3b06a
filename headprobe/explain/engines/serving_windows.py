"""What vLLM, TensorRT-LLM and llama.cpp allocate for a layer split: a window per layer, no per-head budget.

A split reaches these engines as per-layer windows (``headprobe export --to vllm|tensorrt-llm|llama.cpp``,
:mod:`headprobe.tool_files.engine_windows`); which architectures each engine takes is
:mod:`headprobe.tool_files.engine_support`. Here a layer with window ``W`` after ``T`` tokens attends
``min(T, W)`` of them (the query included; TensorRT-LLM's sink counted inside the window), a global layer all
``T``; ``T`` is ``N`` after prefill and ``N + M - 1`` at the end. What differs is what each engine allocates
for them, restated from its code (nothing copied):

- **vLLM** (hybrid KV cache manager). Memory comes in pages of ``block_size`` tokens (16 by default); a page
  of one layer holds keys and values of every KV head (``AttentionSpec.real_page_size_bytes``). A full-attention
  layer holds ``ceil(T / 16)`` pages; a sliding-window layer only the pages its window spans, the earlier ones
  freed (``SlidingWindowManager``: ``get_num_skipped_tokens = num_computed_tokens - sliding_window + 1``,
  ``remove_skipped_blocks``), hence ``(T - 1) // 16 - (T - w) // 16 + 1`` pages for ``w = min(T, W)``
  tokens (one more than ``ceil(w / 16)`` when the window straddles a page: the ``+ 1`` of
  ``SlidingWindowSpec.max_memory_usage_bytes``). Layers are grouped by type into KV cache groups of one size
  ``g`` (the smallest type's layer count, or the largest when it is under 1.5 times the smallest; types
  padded to a multiple of ``g``), and a page of any group takes a page in each of ``g`` shared tensors
  (``_get_kv_cache_groups_uniform_page_size``, ``get_kv_cache_config_from_groups``): bytes are ``g`` x
  page bytes x the pages of every group.
- **TensorRT-LLM**: ``max_attention_window`` per layer (a global layer the model's context) and one
  ``sink_token_length``; one KV pool per distinct window (``WindowBlockManager`` per window size), each
  layer of a pool holding ``min(T, window)`` tokens. Its blocks of ``tokens_per_block`` tokens are not modelled.
- **llama.cpp** (Gemma 3 only): one ``n_swa``; the cache is allocated up front for ``n_ctx`` cells (padded
  to 256, ``llama-context.cpp``), the SWA layers' cache for ``min(n_ctx, n_swa + n_ubatch)`` cells padded to
  256 (``llama_kv_cache_iswa``; ``n_ubatch`` 512 by default, one stream per sequence).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...errors import HeadprobeError
from ...layer_split import GLOBAL, LayerSplit
from ...models.identity import ModelIdentity
from ...tool_files.engine_support import check_engine, check_llama_cpp_arch, check_vllm_arch, one_window
from ..setting import Setting, format_bytes
from .allocation import EngineAllocation

#: Names of the three engines' rows.
VLLM, TRT, LLAMA_CPP = "vLLM", "TensorRT-LLM", "llama.cpp"
#: vLLM's default KV page (``--block-size``) on CUDA, in tokens.
VLLM_BLOCK_SIZE = 16
#: llama.cpp's default ``n_ubatch`` and the padding of its cache sizes (cells).
LLAMA_CPP_UBATCH, LLAMA_CPP_PAD = 512, 256

_VLLM = "vllm-project/vllm@001cabc"
VLLM_CITES = [
    (f"{_VLLM} vllm/v1/kv_cache_interface.py AttentionSpec.real_page_size_bytes, "
     "SlidingWindowSpec.max_memory_usage_bytes"),
    ("vllm-project/vllm@002f349 vllm/v1/core/single_type_kv_cache_manager.py SlidingWindowManager."
     "remove_skipped_blocks, FullAttentionManager.remove_skipped_blocks"),
    (f"{_VLLM} vllm/v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size, "
     "get_kv_cache_config_from_groups"),
]
TRT_CITES = [
    ("NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py KvCacheConfig.max_attention_window, sink_token_length "
     "(the code index's copy; commit not recorded)"),
    ("NVIDIA/TensorRT-LLM@2213a79 cpp/include/tensorrt_llm/batch_manager/kvCacheManager.h WindowBlockManager "
     "(one per window size, with its managed layers)"),
]
LLAMA_CPP_CITES = [
    ("ggml-org/llama.cpp@02c28f5 src/llama-kv-cache-iswa.cpp llama_kv_cache_iswa::llama_kv_cache_iswa "
     "(size_swa = GGML_PAD(min(size_base, n_swa * (unified ? n_seq_max : 1) + n_ubatch), 256))"),
    ("ggml-org/llama.cpp src/llama-context.cpp (cparams.n_ctx = GGML_PAD(cparams.n_ctx, 256); the code index's "
     "copy, commit not recorded)"),
    ("ggml-org/llama.cpp src/llama-model.cpp load_hparams (LLM_ARCH_GEMMA3: n_swa from the GGUF window key, "
     "set_swa_pattern(6); the code index's copy, commit not recorded)"),
    ("run here: llama-cpp-python 0.3.36 (the llama.cpp it vendors) loads Gemma 3 with the export and allocates "
     "these cells and bytes (tests/tool_files/test_llama_cpp_engine.py)"),
]

#: Why a budget that is not a layer split has no row in these engines.
NOT_A_SPLIT = ("takes one window per layer, not per-head budgets; allocate --method layer_split --engine {engine} "
               "(or layer_split_heads) and explain that map")


def _why(exc: HeadprobeError, engine: str) -> str:
    """A refusal of :mod:`~headprobe.tool_files.engine_support`, without its ``--to ENGINE:`` prefix."""
    return str(exc).removeprefix(f"--to {engine}: ")


def _per_layer(values: list[int], kv_heads: int) -> np.ndarray:
    return np.repeat(np.asarray(values, dtype=np.int64)[:, None], kv_heads, axis=1)


def _window_tokens(windows: list[int | None], tokens: int) -> list[int]:
    """Tokens each layer attends after ``tokens`` tokens: ``min(tokens, window)`` (``None``: every token)."""
    return [tokens if w is None else min(tokens, w) for w in windows]


def not_a_split_rows(engines: tuple[str, ...] = (VLLM, TRT, LLAMA_CPP)) -> list[EngineAllocation]:
    """The three engines' rows for a budget that is not a layer split."""
    flags = {VLLM: "vllm", TRT: "tensorrt-llm", LLAMA_CPP: "llama.cpp"}
    setting = {VLLM: "hf_overrides layer_types + sliding_window", TRT: "KvCacheConfig max_attention_window",
               LLAMA_CPP: "GGUF <arch>.attention.sliding_window"}
    return [EngineAllocation.cannot_run(e, setting[e], NOT_A_SPLIT.format(engine=flags[e])) for e in engines]


# ---- vLLM ---------------------------------------------------------------------------------------------------

def window_pages(tokens: int, window: int | None, block: int = VLLM_BLOCK_SIZE) -> int:
    """Pages of ``block`` tokens that the last ``min(tokens, window)`` of ``tokens`` tokens span (``None``:
    all of them, from the first page)."""
    if tokens <= 0:
        return 0
    first = 0 if window is None else max(tokens - window, 0)
    return (tokens - 1) // block - first // block + 1


def vllm_groups(kinds: list[str]) -> tuple[int, dict[str, list[list[int]]]]:
    """vLLM's KV cache groups of a model whose layers are ``kinds`` (``"full"`` / ``"sliding"``): the group size
    and, per kind, its groups (``layers[i::num_groups]``)."""
    by_kind: dict[str, list[int]] = {}
    for i, k in enumerate(kinds):
        by_kind.setdefault(k, []).append(i)
    counts = [len(v) for v in by_kind.values()]
    size = min(counts)
    if max(counts) < size * 1.5:
        size = max(counts)
    groups = {}
    for k, layers in by_kind.items():
        n = -(-len(layers) // size)
        groups[k] = [layers[i::n] for i in range(n)]
    return size, groups


def vllm_allocation(split: LayerSplit, model: ModelIdentity, setting: Setting,
                    block_size: int = VLLM_BLOCK_SIZE) -> EngineAllocation:
    """What vLLM's hybrid KV cache manager holds for a split made for vLLM (``export --to vllm``)."""
    try:
        check_engine(split, "vllm")
        check_vllm_arch(split)
        window = one_window(split)
    except HeadprobeError as exc:
        return EngineAllocation.cannot_run(VLLM, "hf_overrides layer_types + sliding_window", _why(exc, "vllm"),
                                           VLLM_CITES)
    text = f"hf_overrides layer_types + sliding_window {window}, block_size {block_size}"
    if split.sink:
        return EngineAllocation.cannot_run(VLLM, text, f"keeps no sink on sliding-window layers; the split keeps "
                                                       f"{split.sink}", VLLM_CITES)
    n, end = setting.context, setting.context + setting.appended
    windows = [None if w == GLOBAL else int(w) for w in split.layers]
    kinds = ["full" if w is None else "sliding" for w in windows]
    size, groups = vllm_groups(kinds)
    page = block_size * model.num_kv_heads * setting.token_bytes(model.head_dim)
    pages = {k: (window_pages(n, None if k == "full" else window, block_size),
                 window_pages(end, None if k == "full" else window, block_size)) for k in groups}

    def total(i: int) -> int:
        return page * size * sum(len(g) * pages[k][i] for k, g in groups.items()) * setting.batch

    one_step = page * size * sum(len(g) for g in groups.values()) * window_pages(n, None, block_size) * setting.batch
    padding = sum(len(g) * size for g in groups.values()) - len(kinds)
    held, held_end = _window_tokens(windows, n), _window_tokens(windows, end)
    names = {"full": "full-attention", "sliding": f"sliding-window ({window})"}
    notes = [f"pages of {block_size} tokens a layer: " + "; ".join(
        f"{names[k]} {sum(len(x) for x in g)} layers, {pages[k][0]} pages after prefill, {pages[k][1]} at the end"
        for k, g in groups.items())]
    if "sliding" in groups:
        notes.append(f"a sliding-window layer keeps only the pages its {window}-token window spans (the earlier ones "
                     "are freed); while the prompt is prefilled its pages are all held until the next step "
                     f"({format_bytes(one_step)} when the prompt is one step; with chunked prefill of C tokens at "
                     f"most ceil((W - 1 + C) / {block_size}) + 1 pages a sliding layer)")
    if padding:
        notes.append(f"vLLM groups the layers {size} a group and pads {padding} layer slot(s): each padded slot takes "
                     "pages as a layer would")
    row = EngineAllocation(VLLM, text, True, "kv_head", _per_layer(held, model.num_kv_heads),
                           _per_layer(held_end, model.num_kv_heads), _per_layer(held, model.num_kv_heads),
                           total(0), total(1), True, notes, list(VLLM_CITES))
    row.extra = {"block_size": block_size, "page_bytes": page, "group_size": size, "padding_layers": padding,
                 "groups": {k: {"layers": g, "window": None if k == "full" else window, "pages": pages[k][0],
                                "pages_end": pages[k][1]} for k, g in groups.items()},
                 "prefill_step_bytes": one_step}
    return row


# ---- TensorRT-LLM -------------------------------------------------------------------------------------------

def tensorrt_llm_allocation(split: LayerSplit, model: ModelIdentity, setting: Setting) -> EngineAllocation:
    """One pool per distinct window; each layer holds ``min(T, window)`` tokens."""
    full = model.max_context or split.context
    windows = [full if w == GLOBAL else int(w) for w in split.layers]
    text = f"KvCacheConfig max_attention_window {_window_list(windows)}" + (
        f", sink_token_length {split.sink}" if split.sink else "")
    try:
        check_engine(split, "tensorrt-llm")
    except HeadprobeError as exc:
        return EngineAllocation.cannot_run(TRT, text, _why(exc, "tensorrt-llm"), TRT_CITES)
    n, end = setting.context, setting.context + setting.appended
    held, held_end = _window_tokens(windows, n), _window_tokens(windows, end)
    per_token = model.num_kv_heads * setting.token_bytes(model.head_dim) * setting.batch
    pools = []
    for w in sorted(set(windows)):
        layers = [i for i, x in enumerate(windows) if x == w]
        pools.append({"window": w, "layers": layers, "tokens": min(n, w), "tokens_end": min(end, w),
                      "bytes": len(layers) * min(n, w) * per_token, "bytes_end": len(layers) * min(end, w) * per_token})
    notes = ["one KV pool per window: " + "; ".join(
        f"window {p['window']}: {len(p['layers'])} layers, {p['tokens']} tokens a sequence ({p['tokens_end']} at the "
        "end)" for p in pools),
        (f"a global layer's window is the model's context ({full} tokens); bytes are the tokens' keys and values "
         "(TensorRT-LLM's blocks of tokens_per_block tokens are not modelled)")]
    if split.sink:
        notes.append(f"the {split.sink}-token sink is counted inside the window (headprobe's reading of the cyclic "
                     "cache, not checked in the kernels); NVIDIA/TensorRT-LLM#14275 suggests the PyTorch backend may "
                     "ignore sink_token_length: use --sink 0 there")
    if end > full:
        notes.append(f"{end:,} tokens are beyond the model's context ({full:,})")
    row = EngineAllocation(TRT, text, True, "kv_head", _per_layer(held, model.num_kv_heads),
                           _per_layer(held_end, model.num_kv_heads), _per_layer(held, model.num_kv_heads),
                           sum(p["bytes"] for p in pools), sum(p["bytes_end"] for p in pools), True, notes,
                           list(TRT_CITES))
    row.extra = {"pools": pools, "max_attention_window": windows, "sink_token_length": split.sink}
    return row


def _window_list(windows: list[int]) -> str:
    """``[256 x3, 8192, 256]``-style: runs of one window written once with their length."""
    runs: list[list[int]] = []
    for w in windows:
        if runs and runs[-1][0] == w:
            runs[-1][1] += 1
        else:
            runs.append([w, 1])
    return "[" + ", ".join(f"{w} x{k}" if k > 1 else str(w) for w, k in runs) + "]"


# ---- llama.cpp ----------------------------------------------------------------------------------------------

def _pad(n: int, to: int = LLAMA_CPP_PAD) -> int:
    return -(-n // to) * to


def llama_cpp_allocation(split: LayerSplit, model: ModelIdentity, setting: Setting,
                         n_ubatch: int = LLAMA_CPP_UBATCH) -> EngineAllocation:
    """The non-SWA cache of ``n_ctx`` cells and the SWA cache of ``min(n_ctx, n_swa + n_ubatch)`` cells, both
    padded to 256 and allocated before the prompt, with ``n_ctx = N + M - 1`` (the least ``-c`` that holds the
    prompt and the answer)."""
    try:
        check_engine(split, "llama.cpp")
        rule = check_llama_cpp_arch(split)
        n_swa = one_window(split)
    except HeadprobeError as exc:
        return EngineAllocation.cannot_run(LLAMA_CPP, "GGUF <arch>.attention.sliding_window",
                                           _why(exc, "llama.cpp"), LLAMA_CPP_CITES)
    n, end = setting.context, setting.context + setting.appended
    n_ctx = _pad(end)
    cells_swa = _pad(min(n_ctx, n_swa + n_ubatch))
    windows = [None if w == GLOBAL else n_swa for w in split.layers]
    cells = [n_ctx if w is None else cells_swa for w in windows]
    size = sum(cells) * model.num_kv_heads * setting.token_bytes(model.head_dim) * setting.batch
    held, held_end = _window_tokens(windows, n), _window_tokens(windows, end)
    text = (f"--override-kv {rule.gguf_arch}.attention.sliding_window=int:{n_swa} -c {end} (n_ctx {n_ctx}), "
            f"n_ubatch {n_ubatch}")
    notes = [(f"cells are allocated before the prompt: {n_ctx} a global layer (n_ctx, padded to 256), {cells_swa} a "
              f"sliding layer (n_swa + n_ubatch, padded to 256); a sliding layer attends its last {n_swa} tokens"),
             ("a batch is one stream a sequence (kv_unified off); --swa-full gives the sliding layers n_ctx cells, "
              "as the C API's default does (llama-cpp-python: pass swa_full=False)")]
    row = EngineAllocation(LLAMA_CPP, text, True, "kv_head", _per_layer(held, model.num_kv_heads),
                           _per_layer(held_end, model.num_kv_heads), _per_layer(held, model.num_kv_heads), size, size,
                           True, notes, list(LLAMA_CPP_CITES))
    row.extra = {"n_swa": n_swa, "n_ctx": n_ctx, "n_ubatch": n_ubatch, "cells_global": n_ctx, "cells_swa": cells_swa,
                 "global_layers": split.global_layers}
    return row


#: The rows, in the order the report lists them.
ROWS: tuple[Callable[[LayerSplit, ModelIdentity, Setting], EngineAllocation], ...] = (
    vllm_allocation, tensorrt_llm_allocation, llama_cpp_allocation)


def serving_rows(split: LayerSplit, model: ModelIdentity, setting: Setting) -> list[EngineAllocation]:
    """vLLM's, TensorRT-LLM's and llama.cpp's rows for a layer split (each a ``cannot_run`` row where the engine
    does not take it)."""
    split.model.check_fits(model, what="layer split")
    return [row(split, model, setting) for row in ROWS]


__all__ = ("LLAMA_CPP", "LLAMA_CPP_PAD", "LLAMA_CPP_UBATCH", "NOT_A_SPLIT", "TRT", "VLLM", "VLLM_BLOCK_SIZE",
           "llama_cpp_allocation", "not_a_split_rows", "serving_rows", "tensorrt_llm_allocation",
           "vllm_allocation", "vllm_groups", "window_pages")
