"""Allocators: exact sums, floors, clamping, GQA reduction, DynamicKV shares, errors, profile lookup."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from conftest import SMOLLM2_IDENTITY
from hypothesis import given, settings
from hypothesis import strategies as st

from headprobe.allocation.api import allocate, find_profiles, newest_profile, profiles_for_method
from headprobe.allocation.headkv import headkv_budgets, headkv_floor
from headprobe.allocation.pyramid import pyramid_layer_weights
from headprobe.allocation.registry import ALLOCATORS
from headprobe.budget_arithmetic import clamp_and_redistribute, largest_remainder, scale_to_prompt
from headprobe.errors import HeadprobeError, ModelMismatchError, flag_spelling
from headprobe.models.identity import ModelIdentity
from headprobe.profile import LayerRetention, Profile, reduce_groups
from headprobe.profile_kinds import HEAD_SCORE_KINDS

SMOL = dataclasses.replace(SMOLLM2_IDENTITY, max_context=8192)


def head_profile(seed: int = 0, model: ModelIdentity = SMOL, kind: str = "retrieval_reasoning",
                 scores: np.ndarray | None = None, created: str = "2025-01-01T00:00:00+00:00") -> Profile:
    rng = np.random.default_rng(seed)
    q = rng.random((model.num_layers, model.num_query_heads)) ** 3 if scores is None else np.asarray(scores)
    q = q.tolist()
    return Profile(kind=kind, model=model, probe={"kind": kind}, trials={"total": 10, "passed": 8},
                   query_heads=q, kv_heads=reduce_groups(q, model.group_size, "mean"), created=created)


def retention_profile(seed: int = 0, model: ModelIdentity = SMOL) -> Profile:
    rng = np.random.default_rng(seed)
    tasks = {}
    for name in ("single_doc_qa", "code"):
        m = rng.random(model.num_layers) + 0.05
        m = (m / m.sum()).tolist()
        tasks[name] = LayerRetention(mean=m, std=[0.01] * model.num_layers, samples=4)
    return Profile(kind="layer_retention", model=model, probe={}, trials={"total": 8, "passed": 8},
                   retention=tasks)


# ---- exact integer apportionment -------------------------------------------------------------------

@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=60), st.integers(0, 10**6))
@settings(max_examples=200, deadline=None)
def test_largest_remainder_sums_exactly_and_stays_within_one_of_quota(weights, total):
    out = largest_remainder(np.array(weights), total)
    assert out.dtype == np.int64 and int(out.sum()) == total and np.all(out >= 0)
    w = np.array(weights) if sum(weights) > 0 else np.ones(len(weights))
    quota = w / w.sum() * total
    assert np.all(np.abs(out - quota) < 1 + 1e-9)


def test_largest_remainder_ties_go_to_the_lowest_index():
    assert largest_remainder(np.ones((2, 3)), 8).tolist() == [[2, 2, 1], [1, 1, 1]]


score_maps = st.integers(1, 8).flatmap(lambda L: st.integers(1, 6).flatmap(
    lambda H: st.lists(st.lists(st.floats(0, 100, allow_nan=False), min_size=H, max_size=H),
                       min_size=L, max_size=L)))


@given(score_maps, st.integers(9, 2000), st.integers(0, 16), st.integers(0, 4),
       st.sampled_from([1.005, 1.01, 1.1, 1.2, 1.5, 2.0, 5.0, 10.0]))
@settings(max_examples=300, deadline=None)
def test_headkv_budgets_sum_exactly_and_keep_the_floor(scores, capacity, window, sink, beta):
    s = np.array(scores)
    if s.sum() <= 0:
        s[0, 0] = 1.0
    if capacity <= window + sink:
        with pytest.raises(HeadprobeError, match="capacity"):
            headkv_budgets(s, capacity, window, beta, sink)
        return
    b = headkv_budgets(s, capacity, window, beta, sink)
    floor = headkv_floor(capacity, window, beta, sink)
    assert floor >= window + sink
    assert int(b.sum()) == capacity * s.size
    assert int(b.min()) >= floor
    # the pool above the floor follows the scores within one token
    pool = capacity * s.size - floor * s.size
    assert np.all(np.abs((b - floor) - s / s.sum() * pool) < 1 + 1e-6)
    # deterministic
    assert np.array_equal(b, headkv_budgets(s, capacity, window, beta, sink))


def test_headkv_equal_scores_break_ties_by_layer_then_head():
    b = headkv_budgets(np.ones((2, 2)), capacity=10, window=2, beta=2.0)  # base 8, floor 2+4, pool 4*4=16
    assert b.tolist() == [[10, 10], [10, 10]]
    b = headkv_budgets(np.ones((1, 3)), capacity=10, window=2, beta=2.0)  # pool 12 over 3 → 4 each
    assert b.tolist() == [[10, 10, 10]]
    b = headkv_budgets(np.array([[1, 1, 1, 0]]), capacity=10, window=2, beta=2.0)  # pool 16 over 3
    assert b.tolist() == [[12, 11, 11, 6]]


# ---- clamping ------------------------------------------------------------------------------------------

def test_clamp_example_redistributes_excess_in_proportion():
    assert clamp_and_redistribute([[100, 20], [20, 20]], prompt_len=50) == [[50, 37], [37, 36]]


@given(st.lists(st.lists(st.integers(8, 3000), min_size=3, max_size=3), min_size=1, max_size=6),
       st.lists(st.integers(0, 3000), min_size=1, max_size=4), st.integers(0, 8))
@settings(max_examples=300, deadline=None)
def test_clamp_caps_every_head_and_loses_nothing_that_fits(budgets, lens, window):
    b = np.array(budgets)
    out = clamp_and_redistribute(b, lens, window=window)
    assert isinstance(out, np.ndarray) and out.shape == (len(lens), *b.shape)
    for row, n in zip(out, lens):
        assert int(row.max()) <= n
        assert int(row.sum()) == min(int(b.sum()), n * b.size)
        assert int(row.min()) >= min(window, n)
        if n >= b.max():
            assert np.array_equal(row, b)  # nothing to clamp: untouched


def test_clamp_on_prompt_shorter_than_largest_budget_headkv_map():
    bm = allocate("headkv", [head_profile(3)], capacity=128, window=8, beta=1.01)
    big = max(map(max, bm.budgets))
    n = big // 2
    assert n > 128
    out = clamp_and_redistribute(bm.budgets, n, window=8)
    assert isinstance(out, list) and max(map(max, out)) == n
    assert sum(map(sum, out)) == bm.total  # the clamped-off slots went elsewhere
    before, after = np.array(bm.budgets), np.array(out)
    grew = after > before
    assert grew.any() and np.all(after[before >= n] == n)
    # a head below the cap never shrinks
    assert np.all(after[before < n] >= before[before < n])
    # allocator-side clamp gives the same
    bm2 = allocate("headkv", [head_profile(3)], capacity=128, window=8, beta=1.01, prompt_len=n, clamp=True)
    assert bm2.budgets == out and bm2.method["clamped_to"] == n


def test_clamp_whole_prompt_fits_everywhere_and_shorter_than_window():
    out = clamp_and_redistribute(np.array([[40, 8], [8, 8]]), 5, window=8)
    assert out.tolist() == [[5, 5], [5, 5]]


def test_clamp_per_layer_limits_and_batched_budgets():
    b = np.array([[[30, 10]], [[10, 30]]])
    out = clamp_and_redistribute(b, [25, 100], limits=[None])
    assert out.tolist() == [[[25, 15]], [[10, 30]]]
    out = clamp_and_redistribute([[30, 10], [10, 10]], 100, limits=[12, None])
    assert out == [[12, 12], [18, 18]]


def test_scale_to_prompt_uses_shares():
    out = scale_to_prompt([[0.5, 0.25], [0.25, 0.0]], prompt_len=100, ratio=0.2, window=2)
    assert int(out.sum()) == 80 and out.min() >= 2 and out[0, 0] > out[0, 1] > out[1, 1]


# ---- GQA reduction -------------------------------------------------------------------------------------

def test_gqa_reduction_named_and_applied_at_kv_head_granularity():
    q = np.zeros((30, 9))
    q[0, :3] = [0.9, 0.0, 0.0]      # KV head 0 of layer 0: one strong query head
    q[0, 3:6] = [0.3, 0.3, 0.3]     # KV head 1: three medium ones
    q[1:, :] = 0.01
    p = head_profile(scores=q)
    by_max = allocate("headkv", [p], capacity=64, window=8, beta=1.5, reduction="max")
    by_sum = allocate("headkv", [p], capacity=64, window=8, beta=1.5, reduction="sum")
    by_mean = allocate("headkv", [p], capacity=64, window=8, beta=1.5, reduction="mean")
    assert np.array(by_max.budgets).shape == (30, 3) and by_max.granularity == "kv_head"
    assert by_max.budgets[0][0] > by_max.budgets[0][1]       # max: 0.9 > 0.3
    assert by_sum.budgets[0][1] == by_sum.budgets[0][0]       # sum: 0.9 == 0.9 (ties → same)
    assert by_mean.budgets == by_sum.budgets                  # mean and sum differ by a constant factor
    assert by_max.method["reduction"] == "max" and by_max.total == 64 * 90


# ---- DynamicKV, combined, baselines ---------------------------------------------------------------------

def test_dynamickv_sums_to_B_times_L_and_follows_shares():
    rp = retention_profile(1)
    cap, window = 128, 8
    bm = allocate("dynamickv", [rp], capacity=cap, window=window, task="code")
    b = np.array(bm.budgets)
    B, L, H = cap - window, 30, 3
    assert int((b - window).sum()) == B * L * H and bm.total == cap * L * H
    # per KV head column the non-window budgets sum to B·L (within rounding of the even split)
    assert np.all(np.abs((b - window).sum(axis=0) - B * L) <= L)
    shares = np.array(rp.retention["code"].mean)
    layer = (b - window).sum(axis=1)
    assert np.all(np.abs(layer - shares * B * L * H) < 1 + 1e-9)
    assert np.all(b.max(axis=1) - b.min(axis=1) <= 1)  # even within each layer
    mix = allocate("dynamickv", [rp], capacity=cap, window=window, task={"code": 1, "single_doc_qa": 1})
    mshares = (np.array(rp.retention["code"].mean) + np.array(rp.retention["single_doc_qa"].mean)) / 2
    assert np.all(np.abs((np.array(mix.budgets) - window).sum(axis=1) - mshares * B * L * H) < 1 + 1e-9)
    with pytest.raises(HeadprobeError, match="not in the layer-retention profile"):
        allocate("dynamickv", [rp], task="summarisation")


def test_combined_keeps_dynamickv_layer_totals_and_orders_heads_by_score():
    hp, rp = head_profile(5), retention_profile(2)
    dyn = np.array(allocate("dynamickv", [rp], task="code").budgets)
    comb = allocate("combined", [hp, rp], task="code", beta=1.5)
    c = np.array(comb.budgets)
    assert np.array_equal(c.sum(axis=1), dyn.sum(axis=1)) and comb.total == 128 * 90
    kv = np.array(hp.kv_heads)
    for layer in range(30):
        order = np.argsort(-kv[layer], kind="stable")
        assert np.all(np.diff(c[layer][order]) <= 0)
    assert [s["kind"] for s in comb.method["sources"]] == ["retrieval_reasoning", "layer_retention"]
    assert allocate("combined", [rp, hp], task="code", beta=1.5).budgets == comb.budgets


def test_uniform_and_pyramid():
    u = allocate("uniform", model=SMOL, capacity=100, window=8)
    assert {x for r in u.budgets for x in r} == {100}
    p = allocate("pyramid", model=SMOL, capacity=100, window=8)
    per_layer = np.array(p.budgets).sum(axis=1)
    assert p.total == 100 * 90 and np.all(np.diff(per_layer) <= 0) and per_layer[0] > per_layer[-1]
    assert math.isclose(pyramid_layer_weights(30).mean(), 1.0)


def test_budget_maps_are_valid_files(tmp_path):
    from headprobe.budget_map import BudgetMap
    for i, bm in enumerate((allocate("headkv", [head_profile()]), allocate("pyramid", model=SMOL),
                            allocate("combined", [head_profile(), retention_profile()]))):
        path = bm.save(tmp_path / f"b{i}.json")
        back = BudgetMap.load(path)
        assert back.budgets == bm.budgets and back.method == bm.method
        assert math.isclose(sum(map(sum, back.shares)), 1.0)


# ---- errors ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    ({"beta": 1.0}, "beta must be a number larger than 1"),
    ({"beta": 0.5}, "beta must be a number larger than 1"),
    ({"capacity": 8, "window": 8}, "capacity 8 must be larger than the window"),
    ({"capacity": 10, "window": 8, "sink": 4}, "capacity 10 must be larger"),
    ({"ratio": 0.1}, "needs a prompt length"),
])
def test_bad_parameters_are_one_line_errors(kwargs, match):
    with pytest.raises(HeadprobeError, match=match) as info:
        allocate("headkv", [head_profile()], **kwargs)
    assert "\n" not in str(info.value)


def test_unknown_method_and_missing_profile():
    with pytest.raises(HeadprobeError, match="unknown allocation method 'snap'"):
        allocate("snap", [head_profile()])
    with pytest.raises(HeadprobeError, match="needs a layer_retention profile"):
        allocate("dynamickv", [head_profile()])


def test_profile_of_another_model_says_what_differs():
    other = ModelIdentity(name="google/gemma-3-270m", source="t", architecture="gemma3_text", num_layers=18,
                          num_query_heads=4, num_kv_heads=1, head_dim=256, layer_types=("full_attention",) * 18)
    with pytest.raises(ModelMismatchError, match=r"num_layers 30 vs 18.*num_kv_heads 3 vs 1"):
        allocate("headkv", [head_profile()], model=other)


@pytest.mark.parametrize("fill", [0.0, float("nan")])
def test_degenerate_scores_refused_unless_fallback_asked(fill):
    p = head_profile(scores=np.full((30, 9), fill))
    p.kv_heads = np.full((30, 3), fill).tolist()
    with pytest.raises(HeadprobeError, match="all-zero|NaN"):
        allocate("headkv", [p])
    bm = allocate("headkv", [p], allow_fallback=True)
    assert bm.method["fallback"] == "uniform" and {x for r in bm.budgets for x in r} == {128}


def test_find_newest_matching_profile(tmp_path):
    local, shipped = tmp_path / "a", tmp_path / "b"
    local.mkdir(), shipped.mkdir()
    head_profile(1, created="2025-01-01T00:00:00+00:00").save(local / "old.json")
    head_profile(2, created="2025-03-01T00:00:00+00:00").save(shipped / "new.json")
    head_profile(3, kind="retrieval", created="2025-06-01T00:00:00+00:00").save(local / "r.json")
    (local / "junk.json").write_text("{}")
    found = newest_profile(SMOL, dirs=[local, shipped])
    assert found.path.name == "new.json"
    assert [f.path.name for f in find_profiles(SMOL, "retrieval", [local, shipped])] == ["r.json"]
    other = ModelIdentity(name="x/y", source="t", architecture="llama", num_layers=30, num_query_heads=9,
                          num_kv_heads=3, head_dim=64, layer_types=("full_attention",) * 30)
    with pytest.raises(HeadprobeError, match="headprobe profile --probe retrieval_reasoning"):
        newest_profile(other, dirs=[local, shipped])


# ---- the registry of methods ---------------------------------------------------------------------------------

def test_every_registered_method_runs_by_name_on_the_profiles_it_needs():
    made = {"head_scores": head_profile(), "layer_retention": retention_profile()}
    for name, allocator in ALLOCATORS.items():
        assert allocator.name == name and allocator.description and "\n" not in allocator.description
        bm = allocate(name, [made[n] for n in allocator.needs], model=SMOL)
        # a layer split keeps whole layers or windows: at most the capacity, at the model's context
        assert bm.method["allocator"] == name and (bm.total <= 128 * 90 if "layer_split" in bm.method else
                                                   bm.total == 128 * 90)
        assert [s["kind"] for s in bm.method.get("sources", [])] == list(allocator.default_kinds)
        if allocator.needs:
            with pytest.raises(HeadprobeError, match=f"method {name} needs "):
                allocate(name, [], model=SMOL)


def test_missing_profiles_name_every_kind_the_method_reads():
    with pytest.raises(HeadprobeError) as info:
        allocate("combined", [head_profile()])
    kinds = tuple(HEAD_SCORE_KINDS)                 # every registered pass's head-score kinds
    assert str(info.value) == (f"method combined needs a head-score profile ({', '.join(kinds[:-1])} or {kinds[-1]}) "
                               "and a layer_retention profile; make one with "
                               "`headprobe profile --probe retrieval_reasoning layer_retention`")


def test_profiles_for_method_finds_the_newest_of_each_kind(tmp_path):
    head_profile(1, created="2025-01-01T00:00:00+00:00").save(tmp_path / "old.json")
    head_profile(2, created="2025-02-01T00:00:00+00:00").save(tmp_path / "new.json")
    retention_profile(1).save(tmp_path / "layers.json")
    found = profiles_for_method("combined", SMOL, dirs=[tmp_path])
    assert [f.path.name for f in found] == ["new.json", "layers.json"]
    assert [f.path.name for f in profiles_for_method("dynamickv", SMOL.name, dirs=[tmp_path])] == ["layers.json"]
    assert profiles_for_method("pyramid", SMOL, dirs=[tmp_path]) == []
    with pytest.raises(HeadprobeError, match="unknown allocation method 'snap'"):
        profiles_for_method("snap", SMOL, dirs=[tmp_path])


def test_errors_name_parameters_in_the_callers_spelling():
    p = head_profile(scores=np.zeros((30, 9)))
    p.kv_heads = np.zeros((30, 3)).tolist()
    with pytest.raises(HeadprobeError, match=r"pass allow_fallback=True to allocate uniformly"):
        allocate("headkv", [p])
    with pytest.raises(HeadprobeError, match=r"a prompt length \(prompt_len\)"):
        allocate("headkv", [head_profile()], ratio=0.1)
    with flag_spelling({"allow_fallback": "--fallback-uniform"}):
        with pytest.raises(HeadprobeError, match=r"pass --fallback-uniform to allocate uniformly"):
            allocate("headkv", [p])
        with pytest.raises(HeadprobeError, match=r"a prompt length \(--prompt-len\)"):
            allocate("headkv", [head_profile()], ratio=0.1)


# ---- temperature and huge scores: log-space weights, never a silent uniform map -------------------------

def test_tiny_temperature_gives_the_pool_to_the_best_head():
    p = head_profile(3)
    kv = np.asarray(p.kv_heads)
    bm = allocate("headkv", [p], capacity=128, window=8, beta=1.2, temperature=1e-5)
    b = np.asarray(bm.budgets)
    floor = headkv_floor(128, 8, 1.2)
    best = np.unravel_index(kv.argmax(), kv.shape)
    assert b[best] == floor + (128 - floor) * kv.size     # score ** 1e5: all of the pool
    assert np.count_nonzero(b != floor) == 1
    assert bm.method["temperature"] == 1e-5 and bm.method["fallback"] is None


@pytest.mark.parametrize("temperature", [0.5, 2.0, 3.0])
def test_temperature_weights_are_score_to_the_power_one_over_t(temperature):
    from headprobe.allocation.common import prepare_scores

    s = np.random.default_rng(1).random((30, 3)) ** 2
    s[4, 1] = 0.0
    weights, fell_back = prepare_scores(s, temperature)
    direct = s ** (1 / temperature)
    assert not fell_back and weights[4, 1] == 0.0
    np.testing.assert_allclose(weights, direct / direct.sum(), rtol=1e-12)


def test_huge_temperature_spreads_evenly_over_scored_heads():
    from headprobe.allocation.common import prepare_scores

    s = np.random.default_rng(2).random((30, 3))
    s[0, 0] = 0.0
    weights, _ = prepare_scores(s, 1e300)
    assert weights[0, 0] == 0.0
    np.testing.assert_allclose(weights.ravel()[1:], 1 / 89, rtol=1e-12)


@pytest.mark.parametrize("temperature", [None, 1.0, 0.7])
def test_scores_whose_sum_overflows_allocate_like_the_same_scores_scaled_down(temperature):
    q = np.random.default_rng(4).random((30, 9)) ** 3
    q[12, 4] = q[20, 7] = 1.0                                  # the two largest
    huge = head_profile(scores=q * 1e308)                     # their sum is inf in float64
    small = head_profile(scores=q)
    a = allocate("headkv", [huge], temperature=temperature)
    b = allocate("headkv", [small], temperature=temperature)
    assert a.budgets == b.budgets and a.method["fallback"] is None
    assert len({x for row in a.budgets for x in row}) > 2      # not the uniform map


def test_largest_remainder_survives_an_overflowing_sum_and_refuses_nan():
    assert largest_remainder(np.array([1e308, 1e308, 0.0]), 9).tolist() == [5, 4, 0]
    with pytest.raises(ValueError, match="finite"):
        largest_remainder(np.array([1.0, np.nan]), 4)


@pytest.mark.parametrize("kwargs, names", [
    ({"prompt_len": -5, "clamp": True}, ["prompt_len=-5"]),
    ({"capacity": 10**20}, [f"capacity={10**20}", "2147483647"]),
    ({"window": -1}, ["window=-1"]),
    ({"temperature": 0.0}, ["temperature=0.0"]),
    ({"temperature": float("inf")}, ["temperature=inf"]),
])
def test_out_of_range_parameters_name_themselves(kwargs, names):
    with pytest.raises(HeadprobeError) as info:
        allocate("headkv", [head_profile()], **kwargs)
    message = str(info.value)
    assert "\n" not in message and all(n in message for n in names), message


@pytest.mark.parametrize("method, compat", [("headkv", None), ("headkv", "headkv"), ("combined", None)])
def test_a_negative_query_head_score_is_refused_whatever_the_stored_kv_scores(method, compat):
    prof = head_profile()
    scores = [row[:] for row in prof.query_heads]
    scores[3][4] = -1.0                                   # an edited file: kv_heads still say all is well
    bad = dataclasses.replace(prof, query_heads=scores)
    profiles = [bad] if method != "combined" else [bad, retention_profile()]
    kwargs = {"compat": compat} if compat else {}
    with pytest.raises(HeadprobeError) as info:
        allocate(method, profiles, capacity=128, **kwargs)
    assert "field 'scores.query_heads[3][4]': expected a score of at least 0, found -1.0" in str(info.value)
    near_zero = [row[:] for row in prof.query_heads]
    near_zero[3][4] = -1e-4                               # a learned gate's end, read as 0
    assert allocate("headkv", [dataclasses.replace(prof, query_heads=near_zero)], capacity=128).total > 0
