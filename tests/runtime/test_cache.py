"""Compressed cache through model.generate on tiny random models: equality, ragged batches, budgets, errors."""

from __future__ import annotations

import pytest
import torch

from headprobe import HeadprobeError
from headprobe.budget_arithmetic import split_with_caps
from headprobe.budget_map import BudgetMap
from headprobe.models.cache_argument import with_cache
from headprobe.runtime.budget_sources import UniformBudget
from headprobe.runtime.cache import CompressedCache, headprobe_attention
from headprobe.runtime.generate import generate_compressed, make_policy
from headprobe.runtime.policies import POLICIES

pytestmark = pytest.mark.usefixtures("one_thread")


PROMPTS = ["The river ran past the old mill. Fishermen waited on the bank while the rain came down. " * 3,
           "The secret code is blue tulip seven. Numbers"]


def _reference(lm, prompts, new):
    tok = lm.tokenizer
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True)
    out = lm.model.generate(**enc, max_new_tokens=new, do_sample=False, pad_token_id=tok.pad_token_id)
    return enc, out


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_budget_covering_prompt_equals_full_cache_llama(tiny_llama, policy):
    _, ref = _reference(tiny_llama, PROMPTS, 24)
    res = generate_compressed(tiny_llama, PROMPTS, policy=policy, capacity=1000, max_new_tokens=24)
    assert torch.equal(res.sequences, ref)
    assert tiny_llama.model.config._attn_implementation == "sdpa"  # restored


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_budget_covering_prompt_equals_full_cache_gemma3(tiny_gemma3, policy):
    enc, ref = _reference(tiny_gemma3, PROMPTS, 24)
    res = generate_compressed(tiny_gemma3, PROMPTS, policy=policy, capacity=1000, max_new_tokens=24)
    assert torch.equal(res.sequences, ref)
    kept = res.cache.kept_tokens()
    # Sliding layers (window 16) hold exactly the window; the global layer holds everything.
    assert kept[:, :3].max() == 16
    real = enc["attention_mask"].sum(1)
    assert kept[:, 3, 0].tolist() == (real + 23).tolist()


def test_snapkv_keeps_budget_per_row_and_head(tiny_llama):
    enc, _ = _reference(tiny_llama, PROMPTS, 1)
    res = generate_compressed(tiny_llama, PROMPTS, policy="snapkv", capacity=12, max_new_tokens=1)
    real = enc["attention_mask"].sum(1)
    kept = res.cache.kept_tokens()            # [batch, layers, kv_heads]
    assert kept[0].unique().tolist() == [12]
    assert kept[1].unique().tolist() == [min(12, int(real[1]))]
    # Real memory: buffers sized to kept + decode room, far below a full cache.
    assert res.cache.memory_bytes() < res.cache.full_cache_bytes()


def test_kept_positions_are_window_plus_topk(tiny_llama):
    res = generate_compressed(tiny_llama, PROMPTS[:1], policy="snapkv", capacity=12, max_new_tokens=1)
    store = res.cache.stores[0]
    n = int(res.cache.prompt_lengths[0])
    view = store.padded()
    for s in range(store.segments):
        pos = sorted(view["positions"][s][view["valid"][s]].tolist())
        assert len(pos) == 12 and len(set(pos)) == 12
        assert pos[-8:] == list(range(n - 8, n))      # the window is always kept


def test_decode_appends_in_place(tiny_llama):
    cache = CompressedCache(tiny_llama.model.config, make_policy("snapkv"), UniformBudget(12), max_new_tokens=16)
    enc = tiny_llama.tokenizer(PROMPTS[:1], return_tensors="pt")
    buffers = []
    layer0 = tiny_llama.model.model.layers[0].self_attn
    hook = layer0.register_forward_hook(lambda *_: buffers.append(cache.layers[0].buffers().keys.data_ptr()))
    try:
        with headprobe_attention(tiny_llama.model):
            tiny_llama.model.generate(**enc, **with_cache(tiny_llama.model, cache), max_new_tokens=16, do_sample=False,
                                      pad_token_id=tiny_llama.tokenizer.pad_token_id)
    finally:
        hook.remove()
    store = cache.stores[0]
    assert len(buffers) == 16 and len(set(buffers)) == 1     # one buffer from prefill to the last step
    assert store.capacity.tolist() == [12 + 15] * store.segments      # room for the 15 new tokens fed back
    assert store.lengths.tolist() == [12 + 15] * store.segments


def test_ratio_and_map_budgets(tiny_llama):
    ident = tiny_llama.identity
    L, H = ident.num_layers, ident.num_kv_heads
    budgets = [[8 + 4 * ((3 * layer + head) % 5) for head in range(H)] for layer in range(L)]
    total = sum(map(sum, budgets))
    shares = [[b / total for b in row] for row in budgets]
    bm = BudgetMap(model=ident, method={"allocator": "test"}, shares=shares, budgets=budgets)
    res = generate_compressed(tiny_llama, PROMPTS, policy="snapkv", budget=bm, max_new_tokens=1)
    kept = res.cache.kept_tokens()
    real = res.cache.prompt_lengths
    assert kept[0].tolist() == budgets                # long prompt: the file's budgets as they are
    assert int(kept[1].max()) <= int(real[1])         # clamped to the short prompt
    rescaled = generate_compressed(tiny_llama, PROMPTS, policy="snapkv", budget=bm, capacity=10,
                                   max_new_tokens=1).cache.kept_tokens()[0]
    assert int(rescaled.sum()) == 10 * L * H and int(rescaled.min()) >= 8
    assert rescaled.flatten()[kept[0].argmax()] == rescaled.max()   # same distribution, smaller total
    res = generate_compressed(tiny_llama, PROMPTS, policy="snapkv", ratio=0.5, max_new_tokens=1)
    assert res.cache.kept_tokens()[0, 0, 0] == max(-(-int(real[0]) // 2), 8)


def test_budget_map_on_sliding_layers_goes_to_the_cached_layers(tiny_gemma3):
    """Sliding layers keep their window whatever the map says, so the map's mean per head is spent on the
    full-attention layers only: a map and a uniform capacity then hold the same bytes."""
    ident = tiny_gemma3.identity
    L = ident.num_layers
    cached = [i for i, t in enumerate(tiny_gemma3.model.config.layer_types) if t != "sliding_attention"]
    assert 0 < len(cached) < L
    raw = [[float(i + 1)] for i in range(L)]
    total = sum(r[0] for r in raw)
    bm = BudgetMap(model=ident, method={"allocator": "test"}, shares=[[r[0] / total] for r in raw],
                   budgets=[[20]] * L)
    text = ["The river ran past the old mill while the rain came down on the quiet town. " * 8]
    by_map = generate_compressed(tiny_gemma3, text, policy="snapkv", budget=bm, capacity=12, max_new_tokens=1)
    uniform = generate_compressed(tiny_gemma3, text, policy="snapkv", capacity=12, max_new_tokens=1)
    kept_map, kept_uniform = by_map.cache.kept_tokens()[0], uniform.cache.kept_tokens()[0]
    assert int(by_map.cache.prompt_lengths[0]) > 12 * len(cached)
    assert int(kept_map[cached].sum()) == int(kept_uniform[cached].sum()) == 12 * len(cached)   # not 20, not Σ shares
    assert by_map.cache.used_bytes() == uniform.cache.used_bytes()


def test_distribute_sums_exactly_and_clamps():
    out = split_with_caps(100, [1, 1, 1, 5], [10, 50, 50, 30])
    assert out.sum() == 100 and out[3] == 30 and out.max() <= 50
    assert split_with_caps(7, [1, 1, 1], [1, 1, 1]).sum() == 3


def test_errors_are_one_line(tiny_llama, tiny_gemma3):
    other = tiny_gemma3.identity
    bm = BudgetMap(model=other, method={"allocator": "test"}, shares=[[0.25]] * 4, budgets=[[16]] * 4)
    cases = [
        ("smaller than the snapkv window",
         lambda: generate_compressed(tiny_llama, PROMPTS, policy="snapkv", capacity=4, max_new_tokens=1)),
        ("does not apply", lambda: generate_compressed(tiny_llama, PROMPTS, policy="snapkv", capacity=16,
                                                       policy_options={"block_size": 4})),
        ("budget file was made for tiny-gemma3",
         lambda: generate_compressed(tiny_llama, PROMPTS, policy="snapkv", budget=bm, max_new_tokens=1)),
        ("unknown policy", lambda: make_policy("h2o")),
    ]
    for expected, call in cases:
        with pytest.raises(HeadprobeError, match=expected) as caught:
            call()
        message = str(caught.value)
        assert "\n" not in message and message.strip() == message and len(message) < 400, message


def test_prompt_shorter_than_window_keeps_everything(tiny_llama):
    res = generate_compressed(tiny_llama, ["The river"], policy="snapkv", capacity=16, max_new_tokens=5)
    n = int(res.cache.prompt_lengths[0])
    assert n < 8
    assert res.cache.kept_tokens().unique().tolist() == [n + 4]


def test_unsupported_layer_type_is_named(tiny_llama):
    cfg = tiny_llama.model.config
    old = getattr(cfg, "layer_types", None)
    cfg.layer_types = ["full_attention", "chunked_attention", "full_attention", "full_attention"]
    try:
        with pytest.raises(HeadprobeError, match="layer 1 has attention type 'chunked_attention'"):
            generate_compressed(tiny_llama, PROMPTS, capacity=16, max_new_tokens=1)
    finally:
        cfg.layer_types = old
