"""headprobe's files through kvpress itself (NVIDIA/kvpress 0.5.5): presses built from a budget map, a
profile, a DuoAttention folder and per-layer ratios, on the real SmolLM2 and on tiny models.

Runs where ``headprobe[kvpress]`` is installed (its own CI environment, ``.ci/kvpress``); skipped elsewhere.
"""

from __future__ import annotations

import json
import random
import warnings

import numpy as np
import pytest
import torch

kvpress = pytest.importorskip("kvpress")

from transformers import DynamicCache, pipeline

from headprobe.allocation.api import allocate
from headprobe.budget_arithmetic import clamp_and_redistribute
from headprobe.budget_map import BudgetMap
from headprobe.errors import HeadprobeError, ModelMismatchError
from headprobe.library_bridges.kvpress import (
    BudgetMapPress,
    DuoAttentionFolderPress,
    per_layer_press,
)
from headprobe.models.cache_argument import with_cache
from headprobe.paths import shipped_profiles_dir
from headprobe.profile import Profile
from headprobe.tool_files.duoattention import write_duoattention
from headprobe.tool_files.layer_list import kvpress_layer_ratios

NEEDLE = "The secret passcode for the vault is 4817-TULIP."
QUESTION = "What is the secret passcode for the vault?"
_S = ["The farmer", "A young teacher", "The old captain", "My neighbour", "The baker", "An engineer"]
_V = ["walked to", "wrote about", "painted", "visited", "repaired", "described"]
_O = ["the harbour", "a small garden", "the northern bridge", "the village market", "a wooden boat"]
_T = ["before the rain started.", "on a cold afternoon.", "with great care.", "after a long week."]


def haystack(sentences: int = 180, seed: int = 0) -> str:
    rng = random.Random(seed)
    s = [f"{rng.choice(_S)} {rng.choice(_V)} {rng.choice(_O)} {rng.choice(_T)}" for _ in range(sentences)]
    s.insert(sentences // 2, NEEDLE)
    return " ".join(s)


@pytest.fixture(scope="module")
def smollm2():
    import headprobe as hp

    torch.set_num_threads(1)
    return hp.load_model("smollm2-135m")


def chat_ids(lm, text: str) -> torch.Tensor:
    prompt = lm.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=False)
    return lm.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids


def export(source, folder, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return write_duoattention(source, folder, **kw)


@pytest.mark.slow
def test_budget_map_press_keeps_the_maps_budgets_and_finds_the_needle(smollm2):
    prof = Profile.load(shipped_profiles_dir() / "smollm2-135m.retrieval_reasoning.json")
    bm = allocate("headkv", [prof], capacity=128, window=8, beta=1.2)
    press = BudgetMapPress(bm)
    ids = chat_ids(smollm2, haystack() + "\n\n" + QUESTION)
    n = ids.shape[1]
    assert n > 2000
    cache = DynamicCache()
    with torch.no_grad(), press(smollm2.model):               # kvpress' documented generate usage
        out = smollm2.model.generate(ids, **with_cache(smollm2.model, cache), max_new_tokens=16, do_sample=False)
    answer = smollm2.tokenizer.decode(out[0, n:], skip_special_tokens=True)
    assert "4817" in answer
    # each KV head keeps the map's budget (window included) clamped to the prompt, as headprobe's runtime
    # does, 128 a head on average
    want = np.asarray(clamp_and_redistribute(bm.budgets, n, window=8, weights=bm.shares))
    assert max(map(max, bm.budgets)) > n                       # the largest head needs the clamp
    assert press.kept_tokens_.tolist() == want.tolist() and press.context_tokens_ == n
    assert int(press.kept_tokens_.sum()) == bm.total == 128 * 90
    assert press.compression_ratio == pytest.approx(1 - 128 / n)
    for layer in (2, 5, 17):
        masked = smollm2.model.model.layers[layer].self_attn.masked_key_indices
        per_head = torch.bincount(masked[1], minlength=3)
        assert per_head.tolist() == [n - b for b in want[layer].tolist()]
    # kvpress masks keys; the cache still holds every token of every head
    assert cache.layers[5].keys.shape[2] == out.shape[1] - 1


@pytest.mark.slow
def test_budget_map_press_from_profile_in_the_pipeline(smollm2):
    pipe = pipeline("kv-press-text-generation", model=smollm2.model, tokenizer=smollm2.tokenizer)
    press = BudgetMapPress.from_profile(shipped_profiles_dir() / "smollm2-135m.retrieval_reasoning.json",
                                        capacity=256)
    # the pipeline compresses the context only; put the question in it for question-aware selection
    answer = pipe(haystack() + "\n\n" + QUESTION, question=QUESTION, press=press, max_new_tokens=16)["answer"]
    assert "4817" in answer
    assert int(press.kept_tokens_.sum()) == 256 * 90


@pytest.mark.slow
def test_duoattention_folder_press_streams_the_exported_heads(smollm2, tmp_path):
    prof = Profile.load(shipped_profiles_dir() / "smollm2-135m.retrieval.json")
    folder = export(prof, tmp_path / "duo", full_share=0.5)
    values = np.loadtxt(folder / "full_attention_heads.tsv", delimiter="\t")
    config = json.loads((folder / "config.json").read_text())
    press = DuoAttentionFolderPress(pattern_dir=folder)             # ratio: the folder's sparsity
    pipe = pipeline("kv-press-text-generation", model=smollm2.model, tokenizer=smollm2.tokenizer)
    answer = pipe(haystack(), question=QUESTION, press=press, max_new_tokens=16)["answer"]
    assert "4817" in answer
    assert press.head_compression_ratio == config["sparsity"] == 0.5
    assert np.array_equal(press.streaming_mask.numpy(), values <= 0.5)   # kvpress streams our streaming heads
    layer = int(np.nonzero(values <= 0.5)[0][0])
    masked = smollm2.model.model.layers[layer].self_attn.masked_key_indices
    counts = torch.bincount(masked[1], minlength=3)
    n = press.compression_ratio_                                    # set by the forward pass
    assert n > 0.3
    stream = torch.as_tensor(values[layer] <= 0.5)
    assert (counts[~stream] == 0).all() and len(set(counts[stream].tolist())) == 1
    assert int(counts[stream][0]) > 1000                            # all but sink 128 + recent 256 of ~2100


def test_duoattention_folder_press_one_kv_head(tmp_path):
    from conftest import make_tiny_gemma3

    lm = make_tiny_gemma3()
    ident = lm.identity
    q = (np.arange(4 * 4, dtype=float).reshape(4, 4) % 5 / 10).tolist()
    prof = Profile(kind="retrieval", model=ident, probe={}, trials={"total": 1, "passed": 1}, query_heads=q,
                   kv_heads=[[max(r)] for r in q], group_reduction="max")
    folder = export(prof, tmp_path / "duo", full_share=0.5, sink_size=2, recent_size=4)
    ids = torch.randint(3, 300, (1, 40))
    press = DuoAttentionFolderPress(pattern_dir=folder)
    cache = DynamicCache(config=lm.model.config)
    with torch.no_grad(), press(lm.model):
        lm.model.model(input_ids=ids, **with_cache(lm.model.model, cache))
    assert press.streaming_mask.shape == (4, 1) and int(press.streaming_mask.sum()) == 2
    values = np.loadtxt(folder / "full_attention_heads.tsv", delimiter="\t", ndmin=2)
    assert np.array_equal(press.streaming_mask.numpy(), values <= 0.5)
    for layer in range(4):
        masked = lm.model.model.layers[layer].self_attn.masked_key_indices
        k_len = cache.layers[layer].keys.shape[2]                  # sliding layers hold their window only
        assert len(masked[0]) == (k_len - 6 if press.streaming_mask[layer, 0] else 0)
    assert any(len(lm.model.model.layers[i].self_attn.masked_key_indices[0]) > 0 for i in range(4))
    # kvpress' own reading of the same folder (np.loadtxt without ndmin) masks nothing
    plain = kvpress.DuoAttentionPress(head_compression_ratio=0.5)
    flat = np.clip(np.loadtxt(folder / "full_attention_heads.tsv", delimiter="\t"), 0, 1)
    assert flat.shape == (4,)
    plain.load_attention_pattern = lambda model: (2, 4, flat)
    with torch.no_grad(), plain(lm.model):
        lm.model.model(input_ids=ids, **with_cache(lm.model.model, DynamicCache(config=lm.model.config)))
    assert all(len(lm.model.model.layers[i].self_attn.masked_key_indices[0]) == 0 for i in range(4))
    assert plain.compression_ratio > 0                               # while reporting compression


@pytest.mark.slow
def test_per_layer_ratios_keep_each_layers_budget(smollm2):
    prof = Profile.load(shipped_profiles_dir() / "smollm2-135m.retrieval_reasoning.json")
    bm = allocate("headkv", [prof], capacity=128, window=8, beta=1.2)
    ids = chat_ids(smollm2, haystack())
    n = ids.shape[1]
    info = kvpress_layer_ratios(bm, n)
    press = per_layer_press(bm, n)
    cache = DynamicCache()
    with torch.no_grad(), press(smollm2.model):
        smollm2.model.model(input_ids=ids, **with_cache(smollm2.model.model, cache))
    kept = [cache.layers[i].keys.shape[2] for i in range(30)]
    assert kept == info["kept_per_head"] and sum(kept) * 3 == bm.total
    assert press.compression_ratio == pytest.approx(info["compression_ratio"])


def test_presses_refuse_what_they_cannot_apply(tmp_path):
    from conftest import make_tiny_llama

    lm = make_tiny_llama()
    other = allocate("uniform", model=Profile.load(shipped_profiles_dir() / "smollm2-135m.retrieval.json").model,
                     capacity=32, window=4)
    with pytest.raises(ModelMismatchError, match="num_layers 30 vs 4"), BudgetMapPress(other)(lm.model):
        pass
    compat = allocate("headkv", [Profile.load(shipped_profiles_dir() / "smollm2-135m.retrieval.json")],
                      capacity=64, window=8, beta=1.2, compat="headkv")
    with pytest.raises(HeadprobeError, match="per query head"):
        BudgetMapPress(compat)
    with pytest.raises(HeadprobeError, match="needs pattern_dir"):
        DuoAttentionFolderPress(head_compression_ratio=0.5)
    bm = allocate("uniform", model=lm.identity, capacity=16, window=4)
    path = bm.save(tmp_path / "bm.json")
    press = BudgetMapPress(path)                                    # from a file
    assert isinstance(press.budget_map, BudgetMap)
    ids = torch.randint(3, 300, (1, 50))
    with torch.no_grad(), press(lm.model):
        lm.model.model(input_ids=ids, **with_cache(lm.model.model, DynamicCache()))
    assert press.kept_tokens_.tolist() == [[16, 16]] * 4
