"""Policy behaviour: MorphKV constant size, KeyDiff block-prefill peak, DynamicKV exact sums, KeepKV merges."""

from __future__ import annotations

import pytest
import torch

from headprobe.models.cache_argument import with_cache
from headprobe.runtime.generate import generate_compressed
from headprobe.runtime.policies.merge import merge_groups

LONG = ["The river ran past the old mill. Fishermen waited on the bank while the rain came down. " * 6,
        "The secret code is blue tulip seven. Numbers like 42 appear in reports. " * 3]


pytestmark = pytest.mark.usefixtures("one_thread")


def test_morphkv_cache_size_is_constant_while_decoding(tiny_llama):
    sizes = []
    layer0 = tiny_llama.model.model.layers[0].self_attn
    holder = {}
    hook = layer0.register_forward_hook(lambda *_: sizes.append(holder["cache"].stores[0].kept())
                                        if holder else None)
    from headprobe.runtime.budget_sources import UniformBudget
    from headprobe.runtime.cache import CompressedCache, headprobe_attention
    from headprobe.runtime.generate import make_policy
    cache = CompressedCache(tiny_llama.model.config, make_policy("morphkv", window=8), UniformBudget(24),
                            max_new_tokens=30)
    holder["cache"] = cache
    tok = tiny_llama.tokenizer
    enc = tok(LONG[:1], return_tensors="pt")
    try:
        with headprobe_attention(tiny_llama.model):
            tiny_llama.model.generate(**enc, **with_cache(tiny_llama.model, cache), max_new_tokens=30, do_sample=False,
                                      pad_token_id=tok.pad_token_id)
    finally:
        hook.remove()
    assert enc["input_ids"].shape[1] > 24
    assert len(sizes) == 30
    assert all(s.unique().tolist() == [24] for s in sizes)
    assert int(cache.peak_tokens().max()) == 24
    assert cache.stores[0].capacity.unique().tolist() == [24]


def test_morphkv_evict_every_k_bounds_the_growth(tiny_llama):
    res = generate_compressed(tiny_llama, LONG, policy="morphkv", capacity=24, max_new_tokens=20,
                              policy_options={"window": 8, "evict_every": 4, "fuse": "max", "group_reduce": "sum"})
    assert int(res.cache.peak_tokens().max()) <= 24 + 3
    assert int(res.cache.kept_tokens()[0].min()) >= 21


def test_keydiff_peak_during_block_prefill_is_budget_plus_block(tiny_llama):
    budget, block = 20, 16
    res = generate_compressed(tiny_llama, LONG, policy="keydiff", capacity=budget, max_new_tokens=1,
                              policy_options={"block_size": block})
    n = int(res.cache.prompt_lengths[0])
    assert n > budget + block
    peak = res.cache.peak_tokens()
    assert int(peak.max()) <= budget + block
    assert int(peak[0].max()) > budget                  # blocks really arrived before the cut
    assert res.cache.kept_tokens()[0].unique().tolist() == [budget]


def test_keydiff_recent_share_keeps_the_newest_tokens(tiny_llama):
    res = generate_compressed(tiny_llama, LONG[:1], policy="keydiff", capacity=20, max_new_tokens=1,
                              policy_options={"block_size": 16, "recent_share": 0.25, "anchor": "raw"})
    n = int(res.cache.prompt_lengths[0])
    view = res.cache.stores[1].padded()
    for s in range(view["keys"].shape[0]):
        pos = set(view["positions"][s][view["valid"][s]].tolist())
        assert set(range(n - 5, n)) <= pos


def test_dynamickv_budgets_sum_exactly(tiny_llama):
    from conftest import make_tiny_llama
    lm = make_tiny_llama(layers=7)     # 7 mod 4 != 0: the last layers are rebalanced too
    res = generate_compressed(lm, LONG, policy="dynamickv", capacity=12, max_new_tokens=1,
                              policy_options={"interval": 4, "r_max": 3})
    kept = res.cache.kept_tokens()
    base = 12 - 8
    assert int((kept[0] - 8).sum()) == base * 2 * 7
    assert len(kept[0].sum(1).unique()) > 1              # layers really got different budgets
    assert int(kept.min()) >= 8                          # never cut into the window
    res2 = generate_compressed(lm, LONG, policy="dynamickv", capacity=12, max_new_tokens=1,
                               policy_options={"interval": 3})
    assert int((res2.cache.kept_tokens()[0] - 8).sum()) == base * 2 * 7


def test_dynamickv_with_a_budget_map_shares_the_maps_total():
    """Per-head budgets that differ by layer and head: the layers share Σ(budget - window), not layer 0's."""
    from conftest import make_tiny_llama

    from headprobe.runtime.budget_sources import BudgetSource
    from headprobe.runtime.cache import CompressedCache, headprobe_attention
    from headprobe.runtime.generate import make_policy

    class Fixed(BudgetSource):
        def resolve(self, shape, prompt_lengths, policy):
            per = torch.tensor([[9, 9], [10, 14], [20, 12], [9, 30], [16, 16]])      # [layers, kv_heads]
            return per[None].expand(len(prompt_lengths), -1, -1).clone()

    lm = make_tiny_llama(layers=5)
    enc = lm.tokenizer(LONG[:1], return_tensors="pt")
    cache = CompressedCache(lm.model.config, make_policy("dynamickv", interval=2, r_max=4), Fixed(), max_new_tokens=1)
    with headprobe_attention(lm.model):
        lm.model(**enc, **with_cache(lm.model, cache), use_cache=True)
    kept = cache.kept_tokens()[0]
    assert enc["input_ids"].shape[1] > 8 + 30     # every head can hold its own budget
    assert int((kept - 8).sum()) == (9 + 9 + 10 + 14 + 20 + 12 + 9 + 30 + 16 + 16) - 8 * 10   # = 65, not 1·2·5
    assert int(kept.min()) >= 8


def test_keepkv_zip_merge_is_exact_for_one_step():
    torch.manual_seed(0)
    s, n, d, scale = 3, 10, 16, 0.25
    keys, values = torch.randn(s, n, d, dtype=torch.float64), torch.randn(s, n, d, dtype=torch.float64)
    q = torch.randn(s, d, dtype=torch.float64)
    log_votes = torch.log(torch.randint(1, 4, (s, n)).double())
    logits = (keys @ q[:, :, None])[..., 0] * scale

    def attend(k, v, lnp, mask):
        lg = (k @ q[:, :, None])[..., 0] * scale + lnp
        p = torch.softmax(lg.masked_fill(~mask, float("-inf")), -1)
        return (p[..., None] * v).sum(1)

    before = attend(keys, values, log_votes, torch.ones(s, n, dtype=torch.bool))
    target = torch.arange(n).repeat(s, 1)
    target[:, 7], target[:, 8], target[:, 9] = 2, 2, 5     # three evicted pairs, two retained targets
    part = torch.ones(s, n, dtype=torch.bool)
    k2, v2, lnp2, _ = merge_groups(keys, values, log_votes, logits, target, part, "zip")
    kept = torch.ones(s, n, dtype=torch.bool)
    kept[:, 7:] = False
    after = attend(k2, v2, lnp2, kept)
    assert torch.allclose(before, after, rtol=0, atol=1e-10)
    assert torch.allclose(lnp2[:, 2].exp().double(), log_votes[:, [2, 7, 8]].exp().sum(1))
    # convex is not exact in general
    k3, v3, lnp3, _ = merge_groups(keys, values, log_votes, logits, target, part, "convex")
    assert not torch.allclose(before, attend(k3, v3, lnp3, kept), atol=1e-6)


@pytest.mark.parametrize("options", [{"key_merge": "zip"}, {"key_merge": "values_only", "threshold": -1.0},
                                     {"score_estimator": "window_mean", "threshold": -1.0}])
def test_keepkv_merges_and_votes(tiny_llama, options):
    res = generate_compressed(tiny_llama, LONG, policy="keepkv", capacity=16, max_new_tokens=12,
                              policy_options=options)
    store = res.cache.stores[0]
    view = store.padded()
    votes = view["log_votes"].exp() * view["valid"]          # [segments, L]
    assert res.cache.kept_tokens()[0].unique().tolist() == [16]
    if options.get("threshold") == -1.0:
        # every evicted pair joined a retained one: the votes of a head add up to the tokens it has seen
        seen = float(res.cache.prompt_lengths[0] + 11)
        assert torch.allclose(votes[: store.kv_heads].sum(1), torch.full((store.kv_heads,), seen), rtol=1e-4)
    assert float(votes.max()) > 1.0


def test_snapkv_adaptive_split_keeps_each_layer_total(tiny_llama):
    res = generate_compressed(tiny_llama, LONG, policy="snapkv", capacity=20, max_new_tokens=1,
                              policy_options={"adaptive": True, "floor_share": 0.25})
    kept = res.cache.kept_tokens()[0]                       # [layers, kv_heads]
    assert kept.sum(1).tolist() == [40] * kept.shape[0]     # each layer's total is unchanged
    assert int(kept.min()) >= 8 + 3                         # window + the 25 % safeguard
    assert len(kept.unique()) > 1                           # heads really got different budgets


def test_keepkv_runs_on_a_float64_model(tiny_llama):
    """Votes and score estimates are float32 whatever the model's dtype: a float64 model merges and decodes
    (and, with a budget covering the prompt, answers as the stock cache does)."""
    tiny_llama.model = tiny_llama.model.double()
    prompt = ["The river ran past the old mill. Fishermen waited on the bank while the rain came down. " * 2]
    res = generate_compressed(tiny_llama, prompt, policy="keepkv", policy_options={"threshold": -1.0}, capacity=12,
                              max_new_tokens=6, min_new_tokens=6)
    assert int(res.cache.kept_tokens().max()) <= 12
    enc = tiny_llama.tokenizer(prompt, return_tensors="pt")
    ref = tiny_llama.model.generate(**enc, max_new_tokens=6, do_sample=False,
                                    pad_token_id=tiny_llama.tokenizer.pad_token_id)
    covering = generate_compressed(tiny_llama, prompt, policy="keepkv", capacity=1000, max_new_tokens=6)
    assert torch.equal(covering.sequences, ref)
