"""kvpress's presses on a model with sliding-window layers (Gemma 3's text model): the cache transformers
builds for the model (each sliding layer keeps its window), and a press compresses only the layers that
attend every token, as kvpress does for Gemma 3 and headprobe's settings do.

Runs where kvpress is installed (its own environment, ``.ci/kvpress``)."""

from __future__ import annotations

import logging

import pytest

kvpress = pytest.importorskip("kvpress")

from headprobe.errors import HeadprobeError
from headprobe.library_bridges import press_settings

CONTEXT, QUESTION, CAPACITY = 70, 10, 30
WINDOW = 16            # tiny_gemma3's sliding window: layers 0-2 slide, layer 3 attends every token


@pytest.fixture
def held(monkeypatch):
    """The tokens each layer's cache held after a run (read where the bridge counts the attended tokens)."""
    found: list[list[int]] = []
    count = press_settings._attended_context

    def record(model, cache):
        found.append([layer.keys.shape[-2] for layer in cache.layers])
        return count(model, cache)

    monkeypatch.setattr(press_settings, "_attended_context", record)
    return found


def _prompt(tokenizer) -> list[int]:
    ids = tokenizer("the vault code is kept in the north meadow by the quiet harbour " * 12,
                    add_special_tokens=False)["input_ids"]
    return ids[:CONTEXT + QUESTION]


@pytest.mark.parametrize("press", ["none", "snapkv", "streaming", "adakv"])
def test_a_press_compresses_gemma3s_global_layer_and_each_sliding_layer_keeps_its_window(tiny_gemma3, held,
                                                                                        press):
    ids = _prompt(tiny_gemma3.tokenizer)
    assert len(ids) == CONTEXT + QUESTION
    run = press_settings.run_press(tiny_gemma3, ids, CONTEXT, press, {}, None if press == "none" else CAPACITY,
                                   max_new_tokens=4)
    sliding, global_layer = held[-1][:3], held[-1][3]
    assert sliding == [WINDOW - 1] * 3                  # the window, whatever the press
    # the global layer: the context kvpress kept (the question and answer were taken out after answering);
    # a head-wise press (AdaKV) masks keys in a whole cache instead of removing them
    assert global_layer == (CONTEXT if press in ("none", "adakv") else CAPACITY - QUESTION)
    # the tokens a KV head of the global layer attends: the prompt, or the capacity
    assert run.attended_tokens == (len(ids) if press == "none" else CAPACITY)
    # bytes: 128 a token a layer (one KV head of 16 floats, keys and values); the global layer held the
    # question and the answer's tokens too (the last generated one is never cached)
    answer = len(run.generated) - 1
    assert run.cache_bytes == 128 * (3 * (WINDOW - 1) + global_layer + QUESTION + answer)
    assert run.full_cache_bytes == 128 * 4 * (len(ids) + answer)


def test_kvpress_says_once_a_process_that_it_has_not_tested_the_model(tiny_gemma3, caplog):
    # kvpress warns at every press applied to a model outside its list; a run would print it every prompt
    ids = _prompt(tiny_gemma3.tokenizer)
    press_settings.run_press(tiny_gemma3, ids, CONTEXT, "snapkv", {}, CAPACITY, max_new_tokens=2)
    for once in logging.getLogger("kvpress.presses.base_press").filters:
        if isinstance(once, press_settings._Once):
            once.seen.clear()                   # as a fresh process: earlier tests have seen the warning
    caplog.clear()
    with caplog.at_level("WARNING", logger="kvpress"):
        for _ in range(3):
            press_settings.run_press(tiny_gemma3, ids, CONTEXT, "snapkv", {}, CAPACITY, max_new_tokens=2)
    assert len([r for r in caplog.records if "not tested" in r.getMessage()]) == 1


@pytest.mark.parametrize("name", ["snapkv", "streaming"])
def test_on_gemma3_headprobe_keeps_kvpress_tokens_in_the_global_layer(tiny_gemma3, name):
    # method parity on a model with sliding layers: the one layer both compress keeps the same tokens
    import torch
    from kvpress.utils import compute_n_kept

    from headprobe.library_bridges.press_parity import (
        agreement,
        compressed_layers,
        headprobe_kept,
        press_kept,
    )

    # kvpress scores with 1/sqrt(head_dim), the model with query_pre_attn_scalar ** -0.5: Gemma 3 270M has both
    # 256, so here too (the tiny model's default scalar is 256 for a head_dim of 16)
    for layer in tiny_gemma3.model.model.layers:
        layer.self_attn.scaling = layer.self_attn.head_dim ** -0.5
    ids = torch.tensor([_prompt(tiny_gemma3.tokenizer) + _prompt(tiny_gemma3.tokenizer)[:40]])   # 120 tokens
    kept = compute_n_kept(ids.shape[1], 0.5)
    press, options = {
        "snapkv": (kvpress.SnapKVPress(0.5, window_size=32, kernel_size=5),
                   {"window": 32, "kernel_size": 5, "pooling": "avg"}),
        "streaming": (kvpress.StreamingLLMPress(0.5, n_sink=4), {"sink": 4, "window": 0}),
    }[name]
    theirs = press_kept(tiny_gemma3.model, press, ids, None)
    ours = headprobe_kept(tiny_gemma3, ids, name, options, capacity=kept)
    assert compressed_layers(tiny_gemma3.model) == [3]
    found = agreement(ours, theirs, compressed_layers(tiny_gemma3.model))
    assert found.heads == 1 and found.share == 1.0, found.first_difference
    assert len(ours[3][0]) == len(theirs[3][0]) == kept < ids.shape[1]
    # the sliding layers, left out of the comparison: headprobe's keep their window, kvpress (this prefill's
    # cache has no config) every token; neither compressed them
    n = ids.shape[1]
    assert ours[:3] == [[tuple(range(n - WINDOW + 1, n))]] * 3 and theirs[:3] == [[tuple(range(n))]] * 3


def test_a_press_kvpress_cannot_run_on_the_model_is_refused_in_one_line(tiny_gemma3):
    # kvpress 0.5.5's ExpectedAttentionPress asks Gemma 3's rotary embedding for an attribute it lacks
    ids = _prompt(tiny_gemma3.tokenizer)
    with pytest.raises(HeadprobeError) as refused:
        press_settings.run_press(tiny_gemma3, ids, CONTEXT, "expected_attention", {}, CAPACITY, max_new_tokens=2,
                                 written="kvpress:expected_attention")
    message = str(refused.value)
    assert "\n" not in message
    assert "kvpress:expected_attention" in message and "Gemma3ForCausalLM" in message
    assert "inv_freq" in message                      # kvpress's own reason
