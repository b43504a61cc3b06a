"""Layer splits: which layers stay global at a memory target, under each engine's rule, and the split file."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import headprobe as hp
from headprobe.allocation.layer_split_choice import (
    SplitTarget,
    choose_layer_split,
    layer_scores,
    split_budget_map,
)
from headprobe.errors import FileFormatError, HeadprobeError
from headprobe.layer_split import GLOBAL, LayerSplit
from headprobe.models.identity import ModelIdentity
from tests.conftest import SMOLLM2_IDENTITY

#: Gemma 3 270M's shape: 18 layers, global every 6th, window 512.
GEMMA3 = ModelIdentity(name="google/gemma-3-270m", source="test", architecture="gemma3_text", num_layers=18,
                       num_query_heads=4, num_kv_heads=1, head_dim=256, sliding_window=512,
                       layer_types=tuple("full_attention" if i % 6 == 5 else "sliding_attention" for i in range(18)))


def scores(n: int, best: dict[int, float]) -> list[float]:
    return [best.get(i, 0.01 * (n - i)) for i in range(n)]


def test_share_target_keeps_the_best_layers_global_and_the_bytes_add_up():
    s = scores(30, {4: 9.0, 20: 8.0, 7: 7.0, 11: 6.0})
    split = choose_layer_split(SMOLLM2_IDENTITY, s, engine="vllm", window=256,
                               target=SplitTarget(context=4096, capacity=1024))
    # 30 layers at 256 tokens = 7,680; each global layer adds 3,840; a quarter of 30 · 4,096 is 30,720.
    assert len(split.global_layers) == (30 * 1024 - 30 * 256) // (4096 - 256) == 6
    assert split.global_layers == [0, 1, 4, 7, 11, 20]
    kept = split.kept_tokens()
    assert all(kept[i] == 4096 for i in split.global_layers) and all(kept[i] == 256 for i in split.local_layers)
    assert split.kept_bytes() == sum(kept) * 2 * 3 * 64 * 2 <= split.full_bytes() // 4
    assert split.full_bytes() == 30 * 4096 * 2 * 3 * 64 * 2


def test_global_layers_and_ties_go_to_the_lower_layer():
    split = choose_layer_split(SMOLLM2_IDENTITY, [1.0] * 30, engine="vllm", window=64,
                               target=SplitTarget(context=1000, global_layers=3))
    assert split.global_layers == [0, 1, 2]
    assert split.layers[3] == 64


def test_refusals_name_the_parameter():
    target = SplitTarget(context=4096, capacity=100)
    with pytest.raises(HeadprobeError, match="capacity=100 at prompt_len=4096: every layer local keeps 256"):
        choose_layer_split(SMOLLM2_IDENTITY, [1.0] * 30, engine="vllm", window=256, target=target)
    with pytest.raises(HeadprobeError, match="sink=4: vllm keeps no sink"):
        choose_layer_split(SMOLLM2_IDENTITY, [1.0] * 30, engine="vllm", window=256, sink=4,
                           target=SplitTarget(context=4096, global_layers=2))
    with pytest.raises(HeadprobeError, match="global_layers=31: the model has 30 layers"):
        choose_layer_split(SMOLLM2_IDENTITY, [1.0] * 30, engine="vllm", window=256,
                           target=SplitTarget(context=4096, global_layers=31))
    with pytest.raises(HeadprobeError, match="engine='sglang': expected one of"):
        choose_layer_split(SMOLLM2_IDENTITY, [1.0] * 30, engine="sglang", window=256,
                           target=SplitTarget(context=4096, global_layers=2))


def test_gemma3_sliding_layers_stay_local_at_most_at_their_window():
    s = [1.0] * 18
    trt = choose_layer_split(GEMMA3, s, engine="tensorrt-llm", window=1024, sink=4,
                             target=SplitTarget(context=8192, global_layers=2))
    assert trt.global_layers == [5, 11]
    assert trt.layers[17] == 1024 and trt.layers[0] == 512          # a native layer keeps its own 512
    vllm = choose_layer_split(GEMMA3, s, engine="vllm", window=256, target=SplitTarget(context=8192, global_layers=3))
    assert vllm.global_layers == [5, 11, 17] and vllm.layers[0] == 256
    with pytest.raises(HeadprobeError, match="window=1024: google/gemma-3-270m's own sliding layers keep 512"):
        choose_layer_split(GEMMA3, s, engine="vllm", window=1024, target=SplitTarget(context=8192, global_layers=3))


def test_layer_scores_from_retention_and_from_heads():
    retention = hp.load_profile("profiles/smollm2-135m.layer_retention.json")
    r = layer_scores(retention)
    assert r.shape == (30,) and abs(r.sum() - 1) < 1e-9
    heads = hp.load_profile("profiles/smollm2-135m.retrieval_reasoning.json")
    kv = [sum(row) for row in heads.kv_heads]
    assert list(layer_scores(heads, layer_score="sum")) == pytest.approx(kv)
    assert list(layer_scores(heads, layer_score="mean")) == pytest.approx([k / 3 for k in kv])


def test_split_file_round_trip_and_refusals(tmp_path):
    split = choose_layer_split(SMOLLM2_IDENTITY, [1.0] * 30, engine="tensorrt-llm", window=128, sink=4,
                               target=SplitTarget(context=2048, global_layers=5), source={"profile": {"kind": "x"}})
    path = split.save(tmp_path / "split.json")
    back = LayerSplit.load(path)
    assert back.layers == split.layers and back.sink == 4 and back.context == 2048 and back.engine == "tensorrt-llm"
    obj = json.loads(path.read_text())
    assert obj["format"] == "headprobe.layer_split" and obj["version"] == 1
    assert obj["bytes"] == split.kept_bytes() and obj["share"] == pytest.approx(split.kept_bytes() / split.full_bytes())
    for field, value, match in (("layers", [GLOBAL] * 29, "layers.*expected 30 entries"),
                                ("engine", "sglang", "engine.*expected one of"),
                                ("layers", [4] + [GLOBAL] * 29, r"layers\[0\].*larger than the sink \(4\)")):
        bad = dict(obj, **{field: value})
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(FileFormatError, match=match):
            LayerSplit.load(tmp_path / "bad.json")


def test_allocate_writes_a_budget_map_that_carries_the_split():
    profile = hp.load_profile("profiles/smollm2-135m.layer_retention.json")
    bm = hp.allocate("layer_split", [profile], window=256, ratio=0.25, prompt_len=4096, capacity=None, engine="vllm")
    split = LayerSplit.from_json(bm.method["layer_split"])
    assert bm.method["run_with"] == {"policy": "layer_window", "options": {"sink": 0}}
    assert [row[0] for row in bm.budgets] == split.kept_tokens()
    assert bm.total == sum(split.kept_tokens()) * 3 <= 30 * 3 * 1024
    assert bm.method["sources"][0]["kind"] == "layer_retention"
    assert split_budget_map(replace(split)).budgets == bm.budgets
    with pytest.raises(HeadprobeError, match="sized at a context length: pass prompt_len"):
        hp.allocate("layer_split", [profile], replace(profile.model, max_context=None), window=256, global_layers=2)
    at_context = hp.allocate("layer_split", [profile], window=256, global_layers=2)    # the model's own context
    assert LayerSplit.from_json(at_context.method["layer_split"]).context == profile.model.max_context
    heads = hp.load_profile("profiles/smollm2-135m.retrieval_reasoning.json")
    bm2 = hp.allocate("layer_split_heads", [heads], window=128, sink=4, prompt_len=2048, global_layers=4,
                      engine="tensorrt-llm", layer_score="mean")
    assert len(LayerSplit.from_json(bm2.method["layer_split"]).global_layers) == 4


def test_bytes_target_keeps_as_many_global_layers_as_the_bytes_allow():
    retention = hp.load_profile("profiles/smollm2-135m.layer_retention.json")
    heads = hp.load_profile("profiles/smollm2-135m.retrieval_reasoning.json")
    token = 2 * 3 * 64 * 2                          # one token of one layer: K and V of 3 KV heads, bfloat16
    for size, text in ((12 * 2**20, "12MiB"), (40_000_000, "40MB"), (30 * 256 * token, str(30 * 256 * token))):
        count = (size // token - 30 * 256) // (4096 - 256)
        for method, profiles in (("layer_split", [retention]), ("layer_split_heads", [heads]),
                                 ("layer_split_random", [])):
            bm = hp.allocate(method, profiles, model=SMOLLM2_IDENTITY, window=256, prompt_len=4096,
                             cache_bytes=text)
            split = LayerSplit.from_json(bm.method["layer_split"])
            assert len(split.global_layers) == count
            assert split.kept_bytes() <= size < split.kept_bytes() + (4096 - 256) * token
            assert bm.method["cache_bytes"] == text and split.source["bytes"] == size
    # a byte target of exactly C tokens per KV head makes the capacity target's split
    by_bytes = hp.allocate("layer_split", [retention], window=256, prompt_len=4096, cache_bytes=str(30 * 1024 * token))
    by_capacity = hp.allocate("layer_split", [retention], window=256, prompt_len=4096, capacity=1024)
    assert by_bytes.budgets == by_capacity.budgets


def test_bytes_target_refusals():
    retention = hp.load_profile("profiles/smollm2-135m.layer_retention.json")
    sized = {"window": 256, "prompt_len": 4096}
    with pytest.raises(HeadprobeError, match="cache_bytes=5898239 at prompt_len=4096: every layer local keeps "
                                             "5898240 bytes; lower the window or raise the bytes"):
        hp.allocate("layer_split", [retention], cache_bytes="5898239", **sized)
    with pytest.raises(HeadprobeError, match="cache_bytes='lots': expected a size such as 2GiB"):
        hp.allocate("layer_split", [retention], cache_bytes="lots", **sized)
    with pytest.raises(HeadprobeError, match="cache_bytes='8MiB': give one target, not it and global_layers"):
        hp.allocate("layer_split_random", model=SMOLLM2_IDENTITY, cache_bytes="8MiB", global_layers=2, **sized)
    with pytest.raises(HeadprobeError, match="cache_share='25%': give one target, not it and cache_bytes"):
        hp.allocate("layer_split", [retention], cache_bytes="8MiB", cache_share="25%", **sized)
    with pytest.raises(HeadprobeError, match="cache_share='half': expected a share of the full cache"):
        hp.allocate("layer_split", [retention], cache_share="half", **sized)
    with pytest.raises(HeadprobeError, match="cache_share=0.05 at prompt_len=4096: every layer local keeps 6.2% "
                                             "of the full cache; lower the window or raise the share"):
        hp.allocate("layer_split", [retention], cache_share="5%", **sized)


def test_share_target_is_the_ratio_of_the_full_cache():
    retention = hp.load_profile("profiles/smollm2-135m.layer_retention.json")
    for share, text in ((0.25, "25%"), (0.1, "0.1"), (0.5, "50%")):
        bm = hp.allocate("layer_split", [retention], window=256, prompt_len=4096, cache_share=text)
        split = LayerSplit.from_json(bm.method["layer_split"])
        count = (int(share * 4096 * 30) - 30 * 256) // (4096 - 256)
        assert len(split.global_layers) == count and split.kept_bytes() <= share * split.full_bytes()
        assert split.kept_bytes() + (4096 - 256) * 768 > share * split.full_bytes()
        ratio = hp.allocate("layer_split", [retention], window=256, prompt_len=4096, ratio=share, capacity=None)
        assert bm.budgets == ratio.budgets and bm.method["cache_share"] == text


# ---- the random baseline: the same split with the global layers drawn at random --------------------------------

def test_random_split_keeps_as_many_global_layers_and_bytes_as_the_chosen_split():
    retention = hp.load_profile("profiles/smollm2-135m.layer_retention.json")
    for window, ratio, count in ((64, 0.10, 2), (256, 0.25, 4), (256, 0.50, 12)):
        sized = {"window": window, "ratio": ratio, "prompt_len": 2000, "capacity": None}
        chosen = LayerSplit.from_json(hp.allocate("layer_split", [retention], **sized).method["layer_split"])
        for seed in (0, 1, 2):
            bm = hp.allocate("layer_split_random", model=retention.model, seed=seed, **sized)
            split = LayerSplit.from_json(bm.method["layer_split"])
            assert len(split.global_layers) == len(chosen.global_layers) == count
            assert split.kept_bytes() == chosen.kept_bytes() and split.full_bytes() == chosen.full_bytes()
            assert sorted(split.kept_tokens()) == sorted(chosen.kept_tokens())
            assert bm.total == sum(split.kept_tokens()) * 3
            assert bm.method["run_with"] == {"policy": "layer_window", "options": {"sink": 0}}
            assert bm.method["seed"] == seed and bm.method["sources"] == [] and split.source["seed"] == seed


def test_random_split_is_reproducible_by_seed():
    def drawn(seed, count=4):
        bm = hp.allocate("layer_split_random", model=SMOLLM2_IDENTITY, seed=seed, window=256, prompt_len=2000,
                         global_layers=count)
        return LayerSplit.from_json(bm.method["layer_split"]).global_layers

    assert drawn(1) == drawn(1) == [5, 11, 12, 27]          # numpy's PCG64 permutation of the 30 layers
    assert drawn(2) == [3, 11, 15, 20] and drawn(3) == [0, 4, 7, 20]
    default = hp.allocate("layer_split_random", model=SMOLLM2_IDENTITY, window=256, prompt_len=2000, global_layers=4)
    assert default.method["seed"] == 0 and LayerSplit.from_json(default.method["layer_split"]).global_layers == drawn(0)
    # every layer is drawn over seeds: the draw is over all 30, not a fixed few
    seen = {layer for seed in range(60) for layer in drawn(seed)}
    assert seen == set(range(30))


def test_random_split_draws_only_layers_that_may_be_global():
    picks = set()
    for seed in range(20):
        bm = hp.allocate("layer_split_random", model=GEMMA3, seed=seed, window=256, prompt_len=4000, global_layers=2)
        split = LayerSplit.from_json(bm.method["layer_split"])
        assert len(split.global_layers) == 2 and set(split.global_layers) <= {5, 11, 17}
        assert all(split.layers[i] == 256 for i in split.local_layers)
        picks.add(tuple(split.global_layers))
    assert picks == {(5, 11), (5, 17), (11, 17)}


def test_random_split_refusals():
    with pytest.raises(HeadprobeError, match="seed=-1: expected 0 or more"):
        hp.allocate("layer_split_random", model=SMOLLM2_IDENTITY, seed=-1, window=256, prompt_len=2000)
    with pytest.raises(HeadprobeError, match="seed=1.5: expected an integer"):
        hp.allocate("layer_split_random", model=SMOLLM2_IDENTITY, seed=1.5, window=256, prompt_len=2000)
    with pytest.raises(HeadprobeError, match="sink=4: vllm keeps no sink"):
        hp.allocate("layer_split_random", model=SMOLLM2_IDENTITY, sink=4, window=256, prompt_len=2000,
                    global_layers=2)
    with pytest.raises(HeadprobeError, match="seed=1: does not apply to method layer_split "):
        hp.allocate("layer_split", [hp.load_profile("profiles/smollm2-135m.layer_retention.json")], seed=1)
