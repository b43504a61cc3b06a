"""What explain says headprobe's runtime allocates is what ``CompressedCache`` allocates, to the byte.

Each case runs ``generate_compressed`` on a tiny random model (Llama with GQA, and Gemma 3 with sliding-window
layers) and compares ``cache.memory_bytes()``, the tokens kept at prefill and the tokens held after decoding
with :func:`headprobe.explain.engines.headprobe_runtime.runtime_allocation`. Converted maps (a DuoAttention
split, a HeadKV setting) are run the same way and checked to keep the tokens the other engine keeps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_tiny_gemma3, make_tiny_llama

from headprobe.allocation.api import allocate
from headprobe.errors import HeadprobeError
from headprobe.explain.convert import from_duoattention
from headprobe.explain.engines.headprobe_runtime import runtime_allocation
from headprobe.explain.setting import Setting
from headprobe.explain.sources import DuoPattern, ExplainInput
from headprobe.profile import Profile, reduce_groups
from headprobe.runtime.generate import generate_compressed

PROMPT = 61


def _ids(lm, batch: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, len(lm.tokenizer) - 1, (batch, PROMPT), generator=g)


def _profile(lm, seed: int = 0) -> Profile:
    ident = lm.identity
    rng = np.random.default_rng(seed)
    q = (rng.random((ident.num_layers, ident.num_query_heads)) ** 3).tolist()
    return Profile(kind="retrieval_reasoning", model=ident, probe={}, trials={"total": 1, "passed": 1},
                   query_heads=q, kv_heads=reduce_groups(q, ident.group_size, "mean"), group_reduction="mean")


def _run(lm, bm, policy, options, batch, new):
    res = generate_compressed(lm, input_ids=_ids(lm, batch), budget=bm, policy=policy, policy_options=options,
                              max_new_tokens=new, min_new_tokens=new)
    return res.cache


CASES = [
    ("pyramid", "snapkv", {"window": 4}),
    ("pyramid", "streaming", {"sink": 2, "window": 4}),
    ("headkv", "snapkv", {"window": 4}),
    ("headkv", "streaming", {"sink": 3}),
]


@pytest.mark.parametrize("make", [make_tiny_llama, make_tiny_gemma3], ids=["llama", "gemma3"])
@pytest.mark.parametrize("method,policy,options", CASES)
@pytest.mark.parametrize("batch,new", [(1, 1), (2, 7)])
def test_explained_bytes_and_tokens_are_the_runtimes(make, method, policy, options, batch, new):
    lm = make()
    profiles = [_profile(lm)] if method == "headkv" else []
    bm = allocate(method, profiles, lm.identity, capacity=24, window=4)
    cache = _run(lm, bm, policy, options, batch, new)
    row = runtime_allocation(bm, lm.identity, Setting(PROMPT, batch, "float32", new), policy, options)
    assert row.runs
    assert row.bytes_end == cache.memory_bytes()                 # the decode room regrows as the runtime's does
    assert row.bytes_prefill <= row.bytes_end
    for b in range(batch):
        assert (cache.peak_tokens()[b].numpy() == np.maximum(row.held, row.held_end)).all()
        assert (cache.kept_tokens()[b].numpy() == row.held_end).all()
    if new == 1:
        assert (row.held_end == row.held).all() and row.bytes_prefill == row.bytes_end


def test_a_rescaled_map_is_the_one_generate_capacity_runs():
    lm = make_tiny_llama()
    bm = allocate("headkv", [_profile(lm)], lm.identity, capacity=24, window=4)
    res = generate_compressed(lm, input_ids=_ids(lm, 1), budget=bm, capacity=40, policy="snapkv",
                              policy_options={"window": 4}, max_new_tokens=3, min_new_tokens=3)
    row = runtime_allocation(bm, lm.identity, Setting(PROMPT, 1, "float32", 3), "snapkv", {"window": 4}, capacity=40)
    assert row.bytes_end == res.cache.memory_bytes()
    assert row.held.sum() == 40 * lm.identity.num_layers * lm.identity.num_kv_heads   # rescaled: mean 40 a head


def test_a_map_the_runtime_refuses_is_a_row_that_cannot_run():
    lm = make_tiny_llama()
    bm = allocate("uniform", [], lm.identity, capacity=12, window=4)
    row = runtime_allocation(bm, lm.identity, Setting(PROMPT, 1, "float32", 3), "snapkv", {"window": 16})
    assert not row.runs and "smaller than the snapkv window" in row.notes[0]
    with pytest.raises(HeadprobeError):
        generate_compressed(lm, input_ids=_ids(lm, 1), budget=bm, policy="snapkv", policy_options={"window": 16},
                            max_new_tokens=2)


def test_a_converted_duoattention_map_keeps_the_sink_and_the_recent_tokens_of_streaming_heads():
    """The map of a DuoAttention split, run with the streaming policy it names, keeps exactly DuoAttention's
    tokens: every position in a full head, the first sink_size and last recent_size in a streaming head."""
    lm = make_tiny_llama()
    ident = lm.identity
    sink, recent = 3, 10
    rng = np.random.default_rng(1)
    values = rng.random((ident.num_layers, ident.num_kv_heads))
    duo = DuoPattern(values, sink, recent, {})
    full = values > 0.5
    assert full.any() and (~full).any()
    inp = ExplainInput("duoattention", ident, duo=duo)
    conv = from_duoattention(inp, full, PROMPT, {"threshold": 0.5})
    assert conv.policy == "streaming" and conv.options == {"sink": sink}
    res = generate_compressed(lm, input_ids=_ids(lm, 1), budget=conv.budget_map, policy=conv.policy,
                              policy_options=conv.options, max_new_tokens=1)
    expected_stream = set(range(sink)) | set(range(PROMPT - recent, PROMPT))
    for layer, store in enumerate(res.cache.stores):
        view = store.padded()
        for h in range(ident.num_kv_heads):
            kept = set(view["positions"][h][view["valid"][h]].tolist())
            assert kept == (set(range(PROMPT)) if full[layer, h] else expected_stream), (layer, h)


def _split_map(lm, layers, sink=0):
    from headprobe.allocation.layer_split_choice import split_budget_map
    from headprobe.layer_split import LayerSplit

    engine = "tensorrt-llm" if sink else "vllm"
    return split_budget_map(LayerSplit(model=lm.identity, engine=engine, layers=tuple(layers), sink=sink,
                                       context=PROMPT))


@pytest.mark.parametrize("make,layers,sink", [
    (make_tiny_llama, [16, "global", 16, 16], 0),
    (make_tiny_llama, [70, "global", 8, 30], 2),          # a window above the prompt: it grows up to its window
    (make_tiny_gemma3, [24, 8, 12, "global"], 0),         # the model's own window (16) caps the split's 24
], ids=["llama", "llama-sink", "gemma3"])
@pytest.mark.parametrize("batch,new", [(1, 1), (2, 20)])
def test_a_layer_split_runs_under_layer_window_as_explained(make, layers, sink, batch, new):
    lm = make()
    bm = _split_map(lm, layers, sink)
    options = {"sink": sink}
    cache = _run(lm, bm, "layer_window", options, batch, new)
    row = runtime_allocation(bm, lm.identity, Setting(PROMPT, batch, "float32", new), "layer_window", options)
    assert row.runs
    assert row.bytes_end == cache.memory_bytes()
    for b in range(batch):
        assert (cache.peak_tokens()[b].numpy() == np.maximum(row.held, row.held_end)).all()
        assert (cache.kept_tokens()[b].numpy() == row.held_end).all()
    sw = lm.identity.sliding_window
    for layer, w in enumerate(layers):
        own = sw if lm.identity.layer_types[layer] == "sliding_attention" else None
        window = PROMPT + new if w == "global" else min(w, own or w)
        assert (row.held[layer] == min(PROMPT, window)).all()
        assert (row.held_end[layer] == min(PROMPT + new - 1, window)).all()


def test_a_split_takes_no_capacity_and_layer_window_no_ragged_map():
    lm = make_tiny_llama()
    row = runtime_allocation(_split_map(lm, [16, "global", 16, 16]), lm.identity, Setting(PROMPT, 1, "float32", 3),
                             "layer_window", {"sink": 0}, capacity=20)
    assert not row.runs and "keeps its own windows" in row.notes[0]
    bm = allocate("headkv", [_profile(lm)], lm.identity, capacity=24, window=4)
    row = runtime_allocation(bm, lm.identity, Setting(PROMPT, 1, "float32", 3), "layer_window", {})
    assert not row.runs and "different budgets per head" in row.notes[0]
