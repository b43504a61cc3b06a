"""HeadKV's and KVCache-Factory's arithmetic, restated from their code, against explain's.

Restated (read, not copied) from FYYFU/HeadKV at 0862a09 and Zefan-Cai/KVCache-Factory at c97f9d7; each
step names its file and line. The score files are the shipped profiles exported as HeadKV JSON and the
published HeadKV / Retrieval_Head files in ``shared/reference`` (skipped when absent).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from headprobe.explain.api import explain_budget
from headprobe.explain.convert import headkv_kv_budgets
from headprobe.explain.engines.headkv import headkv_allocation, headkv_capacities, kept_at
from headprobe.explain.engines.kvcache_factory import (
    factory_allocation,
    factory_capacities,
    kv_head_capacities,
)
from headprobe.explain.setting import Setting
from headprobe.paths import shipped_profiles_dir
from headprobe.profile import Profile
from headprobe.tool_files.headkv_json import read_headkv_json, write_headkv_json

REF = next((p / "shared" / "reference" for p in Path(__file__).resolve().parents
            if (p / "shared" / "reference").is_dir()), None)
PUBLISHED = (sorted((REF / "headkv").glob("*.json")) + sorted((REF / "retrieval-head").glob("*.json"))) if REF else []
SHIPPED = sorted(p for p in shipped_profiles_dir().glob("*.json") if "layer_retention" not in p.name)
CAPACITIES = (64, 128, 512, 2048)
BETAS = (1.005, 1.2, 1.5, 5)
CONTEXTS = (50, 500, 900, 4096)
WINDOW = 8


# ---- the engines' steps, restated ----------------------------------------------------------------------------

def headkv_head_capacity(path: Path, max_capacity_prompts: int, beta: float, temp: float, layers: int,
                         heads: int) -> torch.Tensor:
    """FYYFU/HeadKV headkv/snapkv_utils.py: ReasonSnapKVCluster.__init__."""
    base_capacity = max_capacity_prompts - WINDOW                      # :347 (window_size 8: run_longbench.py:217)
    with open(path) as file:
        head_list = json.loads(file.readline())                                    # :379-380
    head_score_list = [np.mean(v[1]) for v in head_list.items()]                   # :381
    head_score_list = torch.tensor(head_score_list / sum(head_score_list))         # :382
    head_score_list = torch.pow(head_score_list, temp)                              # :383
    head_score_list = head_score_list / torch.sum(head_score_list)                  # :384
    total_attention = head_score_list.reshape(layers, heads)                        # :385
    total_pool_capacity = (base_capacity // beta) * layers * heads                  # :387
    min_num = base_capacity - base_capacity // beta                                 # :388
    return torch.round(total_attention * total_pool_capacity + min_num).int()       # :389


def headkv_kept(head_capacity: torch.Tensor, max_capacity_prompts: int, q_len: int) -> list[list[int]]:
    """FYYFU/HeadKV headkv/snapkv_utils.py: ReasonSnapKVCluster.update_kv, per layer and query head."""
    base_capacity = max_capacity_prompts - WINDOW
    prefix = torch.arange(max(q_len - WINDOW, 0))            # attn_score covers the q_len - window prefix (:405-413)
    out = []
    for layer in range(head_capacity.shape[0]):
        if base_capacity > prefix.shape[-1]:                  # :444: not compressed, every head keeps q_len (:445-447)
            out.append([q_len] * head_capacity.shape[1])
            continue
        row = []
        for head_idx in range(head_capacity.shape[1]):
            cache_index = prefix[..., :head_capacity[layer][head_idx]]               # :467
            row.append(cache_index.shape[-1] + WINDOW)                                # :469
        out.append(row)
    return out


def factory_head_capacity(path: Path, max_capacity_prompts: int, head_beta: float, layers: int,
                          heads: int) -> torch.Tensor:
    """Zefan-Cai/KVCache-Factory run_longbench.py:272-281 (--method HeadKV)."""
    with open(path) as file:
        head_list = json.loads(file.readline())
    head_score_list = [np.mean(v[1]) for v in head_list.items()]
    head_score_list = torch.tensor(head_score_list / sum(head_score_list))
    total_attention = head_score_list.reshape(layers, heads)
    total_pool_capacity = (max_capacity_prompts // head_beta) * layers * heads
    min_num = max_capacity_prompts - max_capacity_prompts // head_beta
    return torch.round(total_attention * total_pool_capacity + min_num).int()


def factory_kept(head_capacity: torch.Tensor, max_capacity_prompts: int, q_len: int, groups: int,
                 granularity: str) -> list[list[int]]:
    """Zefan-Cai/KVCache-Factory pyramidkv/pyramidkv_utils.py: HeadKVCluster.update_kv."""
    base_capacity = max_capacity_prompts - WINDOW                                      # :1103
    prefix = torch.arange(max(q_len - WINDOW, 0))
    out = []
    for layer in range(head_capacity.shape[0]):
        head_capacity_row = head_capacity[layer]                                         # :1197
        if granularity == "kv_head" and groups > 1:                                      # :1198-1199
            num_heads = head_capacity_row.shape[0] // groups
            head_capacity_row = head_capacity_row.reshape(num_heads, groups).float().mean(dim=-1).round().to(
                head_capacity_row.dtype)
        if base_capacity > prefix.shape[-1]:                                             # :1179
            out.append([q_len] * head_capacity_row.shape[0])
            continue
        out.append([prefix[..., :c].shape[-1] + WINDOW for c in head_capacity_row])      # :1213-1215
    return out


# ---- the cases --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=SHIPPED + PUBLISHED, ids=lambda p: p.name)
def score_file(request, tmp_path_factory) -> tuple[Path, Profile]:
    """A HeadKV score file and the profile headprobe reads from it (shipped profiles are exported first)."""
    path = request.param
    if path.parent == shipped_profiles_dir():
        exported = tmp_path_factory.mktemp("heads") / f"{path.stem}_heads.json"
        write_headkv_json(Profile.load(path), exported)
        return exported, read_headkv_json(exported, Profile.load(path).model)
    return path, read_headkv_json(path)


def test_the_published_files_are_there():
    assert len(SHIPPED) == 4 and (REF is None or len(PUBLISHED) == 5)


def test_headkv_capacities_and_kept_tokens_are_headkvs(score_file):
    path, prof = score_file
    m = prof.model
    scores = np.asarray(prof.query_heads)
    for capacity in CAPACITIES:
        for beta in BETAS:
            theirs = headkv_head_capacity(path, capacity, beta, 1.0, m.num_layers, m.num_query_heads)
            ours = headkv_capacities(scores, capacity, beta)
            assert theirs.tolist() == ours.tolist(), (capacity, beta)
            for n in CONTEXTS:
                assert headkv_kept(theirs, capacity, n) == kept_at(ours, capacity - WINDOW, n).tolist(), (capacity, n)


@pytest.mark.parametrize("temp", [0.5, 2.0])
def test_headkv_temp_is_headkvs(score_file, temp):
    path, prof = score_file
    m = prof.model
    theirs = headkv_head_capacity(path, 128, 1.2, temp, m.num_layers, m.num_query_heads)
    assert theirs.tolist() == headkv_capacities(np.asarray(prof.query_heads), 128, 1.2, temp).tolist()


def test_kvcache_factory_capacities_and_kept_tokens_are_its_own(score_file):
    path, prof = score_file
    m = prof.model
    scores = np.asarray(prof.query_heads)
    for capacity in CAPACITIES:
        for beta in BETAS:
            theirs = factory_head_capacity(path, capacity, beta, m.num_layers, m.num_query_heads)
            ours = factory_capacities(scores, capacity, beta)
            assert theirs.tolist() == ours.tolist(), (capacity, beta)
            kv = kv_head_capacities(ours, m.group_size)
            for n in CONTEXTS:
                assert factory_kept(theirs, capacity, n, m.group_size, "query_head") == \
                    kept_at(ours, capacity - WINDOW, n).tolist()
                assert factory_kept(theirs, capacity, n, m.group_size, "kv_head") == \
                    kept_at(kv, capacity - WINDOW, n).tolist()


def test_the_rows_hold_what_the_engines_keep_and_grow_one_token_a_head_a_step(score_file):
    path, prof = score_file
    m = prof.model
    if m.architecture not in ("llama", "mistral"):
        pytest.skip("HeadKV patches Llama and Mistral only")
    setting = Setting(900, 1, "bfloat16", 10)
    scores = np.asarray(prof.query_heads)
    row = headkv_allocation(scores, m, setting, 128, 1.5)
    theirs = np.array(headkv_kept(headkv_head_capacity(path, 128, 1.5, 1.0, m.num_layers, m.num_query_heads), 128, 900))
    assert row.stored == "query_head" and (row.held == theirs).all() and (row.held_end == theirs + 9).all()
    assert row.bytes_prefill == int(theirs.sum()) * 2 * m.head_dim * 2
    kv = factory_allocation(scores, m, setting, 120, 1.5, "kv_head")
    fac = np.array(factory_kept(factory_head_capacity(path, 120, 1.5, m.num_layers, m.num_query_heads), 120, 900,
                                m.group_size, "kv_head"))
    assert kv.stored == "kv_head" and (kv.held == fac).all()


def test_kvcache_factory_at_c_minus_8_is_headkv_at_c(score_file):
    """What docs/interop.md states: KVCache-Factory's --max_capacity_prompts C keeps HeadKV's C + 8."""
    path, prof = score_file
    m = prof.model
    for capacity in CAPACITIES:
        for beta in BETAS:
            assert headkv_head_capacity(path, capacity, beta, 1.0, m.num_layers, m.num_query_heads).tolist() == \
                factory_head_capacity(path, capacity - WINDOW, beta, m.num_layers, m.num_query_heads).tolist()


def test_the_converted_map_is_kvcache_factorys_kv_head_cache(score_file):
    path, prof = score_file
    m = prof.model
    scores = np.asarray(prof.query_heads)
    for n in CONTEXTS:
        budgets = headkv_kv_budgets(scores, m, n, 128, 1.2)
        fac = factory_kept(factory_head_capacity(path, 120, 1.2, m.num_layers, m.num_query_heads), 120, n,
                           m.group_size, "kv_head")
        assert budgets.tolist() == fac
        summed = headkv_kv_budgets(scores, m, n, 128, 1.2, gqa="sum")
        per_query = np.array(headkv_kept(headkv_head_capacity(path, 128, 1.2, 1.0, m.num_layers, m.num_query_heads),
                                         128, n))
        assert summed.tolist() == np.minimum(per_query.reshape(m.num_layers, m.num_kv_heads, -1).sum(-1), n).tolist()


def test_budgets_are_cut_at_the_prefix_and_the_cut_is_lost():
    """The worked check of the reference notes: Llama-3 R2 at capacity 128, beta 1.5 gives a head 1273 slots; of a
    900-token prompt it keeps 892 + 8, and the 381 slots beyond are given to no other head."""
    path = REF / "headkv" / "Meta-Llama-3-8B-Instruct_retrieval_reasoning_heads.json" if REF else None
    if path is None or not path.exists():
        pytest.skip("published HeadKV files absent")
    prof = read_headkv_json(path)
    caps = headkv_capacities(np.asarray(prof.query_heads), 128, 1.5)
    assert caps.max() == 1273 and caps.min() == 40
    row = headkv_allocation(np.asarray(prof.query_heads), prof.model, Setting(900), 128, 1.5)
    assert row.held.max() == 900 and row.held.sum() < (caps + WINDOW).sum()
    assert any("given more than the 892 prefix tokens" in n for n in row.notes)


def test_explain_on_a_score_file_shows_both_engines_and_the_equivalent_map(score_file):
    path, prof = score_file
    if prof.model.architecture not in ("llama", "mistral"):
        pytest.skip("HeadKV patches Llama and Mistral only")
    ex = explain_budget(path, model=None if path in PUBLISHED else "smollm2-135m", context=1000, capacity=128,
                        beta=1.2)
    rows = {(e.engine, e.stored): e for e in ex.engines}
    hk = rows[("HeadKV", "query_head")]
    kvf = rows[("KVCache-Factory", "kv_head")]
    assert (ex.budget == kvf.held).all()
    assert (rows[("headprobe", "kv_head")].held == ex.budget).all()
    assert ex.budget_map.granularity == "kv_head" and ex.budget_map.method["prompt_len"] == 1000
    if prof.model.group_size > 1:
        assert hk.bytes_prefill > kvf.bytes_prefill                               # query-head copies of each KV head
    assert rows[("kvpress", "kv_head")].frees_memory is False
