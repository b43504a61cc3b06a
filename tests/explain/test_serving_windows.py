"""vLLM's, TensorRT-LLM's and llama.cpp's rows for a layer split: tokens, pages, pools and cells worked out by
hand from the split's fields, the refusals, and agreement with headprobe's ``layer_window`` row."""

from __future__ import annotations

import json

import numpy as np
import pytest

from headprobe.allocation.layer_split_choice import split_budget_map
from headprobe.explain.api import explain_budget
from headprobe.explain.engines.serving_windows import (
    llama_cpp_allocation,
    serving_rows,
    tensorrt_llm_allocation,
    vllm_allocation,
    vllm_groups,
    window_pages,
)
from headprobe.explain.setting import Setting
from headprobe.layer_split import GLOBAL, LayerSplit
from headprobe.models.identity import ModelIdentity
from headprobe.paths import shipped_profiles_dir

#: A 4-layer Llama shape: 2 KV heads of 16 dims, an 8,192-token context.
LLAMA4 = ModelIdentity(name="test/llama-4l", source="test", architecture="llama", num_layers=4, num_query_heads=4,
                       num_kv_heads=2, head_dim=16, layer_types=("full_attention",) * 4, max_context=8192)
#: A 6-layer Gemma 3 shape (layer 5 global, as llama.cpp's loader fixes it): 1 KV head of 32 dims.
GEMMA6 = ModelIdentity(name="test/gemma3-6l", source="test", architecture="gemma3_text", num_layers=6,
                       num_query_heads=2, num_kv_heads=1, head_dim=32, sliding_window=512, max_context=32768,
                       layer_types=("sliding_attention",) * 5 + ("full_attention",))
#: bfloat16, 1,000 prompt tokens, 8 new (7 fed back: 1,007 tokens at the end).
SETTING = Setting(1000, 1, "bfloat16", 8)
TOKEN = 2 * 16 * 2          # key and value of one KV head of LLAMA4, bfloat16


def split(engine: str, layers, sink: int = 0, model: ModelIdentity = LLAMA4) -> LayerSplit:
    return LayerSplit(model=model, engine=engine, layers=tuple(layers), sink=sink, context=1000)


def per_layer(row) -> list[int]:
    """One KV head's tokens per layer (every head of a layer holds the same)."""
    assert (row.held == row.held[:, :1]).all()
    return row.held[:, 0].tolist()


def test_vllm_pages_of_the_window_and_of_every_token():
    row = vllm_allocation(split("vllm", [256, GLOBAL, 256, 256]), LLAMA4, SETTING)
    assert row.runs and row.frees_memory
    assert per_layer(row) == [256, 1000, 256, 256] and row.held_end[:, 0].tolist() == [256, 1007, 256, 256]
    # Full layer: ceil(1000 / 16) = 63 pages, ceil(1007 / 16) = 63. Sliding layer after prefill: the window is
    # tokens 744..999, pages 744 // 16 = 46 to 999 // 16 = 62: 17 pages; at the end tokens 751..1006, pages 46..62.
    assert window_pages(1000, None) == 63 and window_pages(1000, 256) == 17 and window_pages(1007, 256) == 17
    page = 16 * 2 * TOKEN                       # 16 tokens x 2 KV heads x 64 bytes = 2,048
    assert row.extra["page_bytes"] == page == 2048
    # 1 full and 3 sliding layers: groups of 1 (3 is not under 1.5 x 1), no padding.
    assert row.extra["group_size"] == 1 and row.extra["padding_layers"] == 0
    assert row.extra["groups"]["full"] == {"layers": [[1]], "window": None, "pages": 63, "pages_end": 63}
    assert row.extra["groups"]["sliding"]["layers"] == [[0], [2], [3]]
    assert row.bytes_prefill == (63 + 3 * 17) * page == 233_472
    assert row.bytes_end == row.bytes_prefill
    assert row.extra["prefill_step_bytes"] == 4 * 63 * page          # the prompt in one step: every page held
    two = vllm_allocation(split("vllm", [256, GLOBAL, 256, 256]), LLAMA4, Setting(1000, 2, "bfloat16", 8))
    assert two.bytes_end == 2 * row.bytes_end


def test_vllm_grows_a_window_page_by_page_and_pads_its_groups():
    # 2 full and 3 sliding layers: group size 2 (3 is not under 1.5 x 2 = 3), sliding padded to 2 groups of 2.
    assert vllm_groups(["sliding", "full", "full", "sliding", "sliding"]) == (
        2, {"sliding": [[0, 4], [3]], "full": [[1, 2]]})
    assert vllm_groups(["full", "sliding", "sliding", "sliding"])[0] == 1
    assert vllm_groups(["full", "full", "sliding", "sliding", "sliding"])[0] == 2
    assert vllm_groups(["full"] * 4 + ["sliding"] * 5)[0] == 5               # 5 < 1.5 x 4: the larger count
    ident = ModelIdentity(name="test/llama-5l", source="test", architecture="llama", num_layers=5, num_query_heads=4,
                          num_kv_heads=2, head_dim=16, layer_types=("full_attention",) * 5, max_context=8192)
    setting = Setting(300, 1, "bfloat16", 100)                               # 399 tokens at the end
    row = vllm_allocation(split("vllm", [128, GLOBAL, GLOBAL, 128, 128], model=ident), ident, setting)
    # Full: ceil(300 / 16) = 19 pages, ceil(399 / 16) = 25. Sliding: tokens 172..299 = pages 10..18 (9), at the
    # end tokens 271..398 = pages 16..24 (9).
    assert window_pages(300, 128) == 9 and window_pages(399, 128) == 9
    page = 2048
    assert row.extra["padding_layers"] == 1
    assert row.bytes_prefill == 2 * page * (1 * 19 + 2 * 9)
    assert row.bytes_end == 2 * page * (1 * 25 + 2 * 9)
    assert "pads 1 layer slot" in " ".join(row.notes)
    short = vllm_allocation(split("vllm", [256, GLOBAL, 256, 256]), LLAMA4, Setting(100, 1, "bfloat16", 200))
    assert per_layer(short) == [100, 100, 100, 100] and short.held_end[:, 0].tolist() == [256, 299, 256, 256]
    # 299 tokens at the end: the window 43..298 spans pages 2..18 (17); a full layer ceil(299 / 16) = 19.
    assert short.bytes_end == page * (19 + 3 * 17)


def test_tensorrt_llm_makes_a_pool_per_window():
    row = tensorrt_llm_allocation(split("tensorrt-llm", [256, GLOBAL, 256, 256], sink=4), LLAMA4, SETTING)
    assert row.runs
    assert row.extra["max_attention_window"] == [256, 8192, 256, 256] and row.extra["sink_token_length"] == 4
    pools = {p["window"]: p for p in row.extra["pools"]}
    assert {w: p["layers"] for w, p in pools.items()} == {256: [0, 2, 3], 8192: [1]}
    assert (pools[256]["tokens"], pools[256]["tokens_end"]) == (256, 256)            # the sink inside the window
    assert (pools[8192]["tokens"], pools[8192]["tokens_end"]) == (1000, 1007)
    per_token = 2 * TOKEN                                                            # both KV heads of a layer
    assert pools[256]["bytes"] == 3 * 256 * per_token and pools[8192]["bytes_end"] == 1007 * per_token
    assert row.bytes_prefill == (3 * 256 + 1000) * per_token == 226_304
    assert row.bytes_end == (3 * 256 + 1007) * per_token
    assert per_layer(row) == [256, 1000, 256, 256]
    assert any("sink_token_length" in n and "#14275" in n for n in row.notes)
    assert "max_attention_window [256, 8192, 256 x2], sink_token_length 4" in row.setting


def test_llama_cpp_allocates_its_cells_up_front_for_gemma3():
    s = split("llama.cpp", [128] * 5 + [GLOBAL], model=GEMMA6)
    row = llama_cpp_allocation(s, GEMMA6, SETTING)
    assert row.runs
    # n_ctx = 1,007 padded to 256: 1,024 cells; the SWA cache min(1024, 128 + 512) = 640, padded: 768 cells.
    assert (row.extra["n_ctx"], row.extra["cells_swa"]) == (1024, 768)
    token = 2 * 32 * 2
    assert row.bytes_prefill == row.bytes_end == (1024 + 5 * 768) * token
    assert per_layer(row) == [128] * 5 + [1000] and row.held_end[:, 0].tolist() == [128] * 5 + [1007]
    assert "gemma3.attention.sliding_window=int:128" in row.setting


@pytest.mark.parametrize("engine,model,layers,why", [
    ("vllm", LLAMA4, [256, GLOBAL, 256, 256], None),
    ("tensorrt-llm", LLAMA4, [256, GLOBAL, 256, 256], "made for tensorrt-llm"),
    ("vllm", GEMMA6, [128] * 5 + [GLOBAL], "gemma3_text model does not build per-layer windows"),
    ("vllm", LLAMA4, [256, GLOBAL, 128, 256], "windows [128, 256]; vllm takes one window"),
])
def test_vllm_refuses_what_it_cannot_run(engine, model, layers, why):
    row = vllm_allocation(split(engine, layers, model=model), model, SETTING)
    assert row.runs == (why is None)
    if why:
        assert why in row.notes[0] and not row.notes[0].startswith("--to")


def test_llama_cpp_and_tensorrt_llm_refusals():
    llama = llama_cpp_allocation(split("llama.cpp", [256, GLOBAL, 256, 256]), LLAMA4, SETTING)
    assert not llama.runs and "llama.cpp's llama loader reads no sliding-window key" in llama.notes[0]
    moved = llama_cpp_allocation(split("llama.cpp", [GLOBAL] + [128] * 5, model=GEMMA6), GEMMA6, SETTING)
    assert not moved.runs and "fixes the global layers at [5]" in moved.notes[0]
    trt = tensorrt_llm_allocation(split("vllm", [256, GLOBAL, 256, 256]), LLAMA4, SETTING)
    assert not trt.runs and "made for vllm" in trt.notes[0]
    assert [r.engine for r in serving_rows(split("vllm", [256, GLOBAL, 256, 256]), LLAMA4, SETTING)] == [
        "vLLM", "TensorRT-LLM", "llama.cpp"]


@pytest.mark.parametrize("as_file", ["map", "split"])
def test_explain_a_split_the_runtime_keeps_the_engines_tokens(as_file, tmp_path):
    s = split("vllm", [256, GLOBAL, 256, 256])
    path = tmp_path / "split.json"
    if as_file == "map":
        split_budget_map(s).save(path)
    else:
        s.save(path)
    ex = explain_budget(path, context=1000, max_new_tokens=8)
    rows = {e.engine: e for e in ex.engines}
    runtime, vllm = rows["headprobe"], rows["vLLM"]
    assert runtime.runs and ex.run_with["policy"] == "layer_window"
    assert (runtime.held == vllm.held).all() and (runtime.held_end == vllm.held_end).all()
    assert (ex.budget == vllm.held).all()
    assert not rows["TensorRT-LLM"].runs and not rows["llama.cpp"].runs
    assert ("layer split " if as_file == "split" else "budget map ") + str(path) in ex.source["description"]
    data = ex.to_json()
    vrow = next(r for r in data["engines"] if r["engine"] == "vLLM")
    assert vrow["extra"]["groups"]["full"]["pages"] == 63
    json.dumps(data, allow_nan=False)
    # At another context the split keeps its windows (nothing rescaled).
    longer = explain_budget(path, context=3000, max_new_tokens=8)
    assert longer.budget[:, 0].tolist() == [256, 3000, 256, 256]
    assert (longer.engines[0].held == longer.engines[1].held).all()


def test_a_budget_that_is_no_split_says_so_for_the_three_engines():
    ex = explain_budget(shipped_profiles_dir() / "smollm2-135m.retrieval.json", context=2000)
    rows = [e for e in ex.engines if e.engine in ("vLLM", "TensorRT-LLM", "llama.cpp")]
    assert [r.engine for r in rows] == ["vLLM", "TensorRT-LLM", "llama.cpp"]
    assert all(not r.runs and "allocate --method layer_split" in r.notes[0] for r in rows)
    assert np.asarray(ex.budget).sum() > 0
