"""headprobe's HeadKV score files read by HeadKV's and KVCache-Factory's own procedures.

Restated from FYYFU/HeadKV (0862a09, ``headkv/snapkv_utils.py``, ``ReasonSnapKVCluster.__init__`` and
``update_kv``) and Zefan-Cai/KVCache-Factory (``run_longbench.py`` with ``--method HeadKV``,
``pyramidkv/pyramidkv_utils.py``, ``HeadKVCluster.update_kv``):

- both read the first line of the file with ``json.loads``, take ``np.mean`` of each key's list in file
  order, divide by the Python ``sum`` of those means and reshape to ``[layers][query heads]``;
- HeadKV then raises the shares to ``temp`` and divides by their ``torch.sum``; its base capacity is
  ``max_capacity_prompts − 8`` (window 8), a head keeps ``round(S·(b // β)·L·H + (b − b // β))``
  top tokens plus the 8-token window;
- KVCache-Factory has no ``temp``; it uses ``max_capacity_prompts`` itself as ``b`` and also keeps the
  8-token window on top.

headprobe's side is ``allocate("headkv", compat="headkv")``: HeadKV's ``--max_capacity_prompts C`` is
``capacity=C``, KVCache-Factory's is ``capacity=C + 8``; HeadKV's ``temp`` is ``1 / temperature``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from headprobe.allocation.api import allocate
from headprobe.allocation.common import prepare_scores
from headprobe.paths import shipped_profiles_dir
from headprobe.profile import Profile
from headprobe.tool_files.headkv_json import read_headkv_json, write_headkv_json

REF = Path(__file__).resolve().parents[3] / "shared" / "reference"
PUBLISHED = sorted((REF / "headkv").glob("*.json")) + sorted((REF / "retrieval-head").glob("*.json")) \
    if REF.is_dir() else []
SHIPPED = sorted(p for p in shipped_profiles_dir().glob("*.json") if "layer_retention" not in p.name)
CAPACITIES = (64, 128, 256, 512, 1024, 2048)
BETAS = (1.005, 1.01, 1.1, 1.2, 1.5, 2, 5, 10)
WINDOW = 8


def _source(path: Path) -> Profile:
    return Profile.load(path) if path.parent == shipped_profiles_dir() else read_headkv_json(path)


def _file_scores(path: Path) -> tuple[torch.Tensor, int, int]:
    """Shares as both tools build them, with the layer and head counts the keys imply."""
    with open(path) as file:
        head_list = json.loads(file.readline())
    head_score_list = [np.mean(v[1]) for v in head_list.items()]
    share = torch.tensor(head_score_list / sum(head_score_list))
    layers = 1 + max(int(k.split("-")[0]) for k in head_list)
    return share, layers, len(head_list) // layers


def headkv_head_capacity(path: Path, max_capacity_prompts: int, beta: float, temp: float = 1.0) -> torch.Tensor:
    share, layers, heads = _file_scores(path)
    share = torch.pow(share, temp)
    share = share / torch.sum(share)
    total_attention = share.reshape(layers, heads)
    base_capacity = max_capacity_prompts - WINDOW
    total_pool_capacity = (base_capacity // beta) * layers * heads
    min_num = base_capacity - base_capacity // beta
    return torch.round(total_attention * total_pool_capacity + min_num).int()


def kvcache_factory_head_capacity(path: Path, max_capacity_prompts: int, head_beta: float) -> torch.Tensor:
    share, layers, heads = _file_scores(path)
    total_attention = share.reshape(layers, heads)
    total_pool_capacity = (max_capacity_prompts // head_beta) * layers * heads
    min_num = max_capacity_prompts - max_capacity_prompts // head_beta
    return torch.round(total_attention * total_pool_capacity + min_num).int()


def _export(path: Path, tmp_path: Path) -> tuple[Profile, Path]:
    prof = _source(path)
    return prof, write_headkv_json(prof, tmp_path / f"{path.stem}_heads.json")


FILES = PUBLISHED + SHIPPED


def test_the_files_are_there():
    assert len(SHIPPED) == 4 and (not REF.is_dir() or len(PUBLISHED) == 5)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_headkv_keeps_what_compat_headkv_allocates(path, tmp_path):
    prof, exported = _export(path, tmp_path)
    for capacity in CAPACITIES:
        for beta in BETAS:
            kept = headkv_head_capacity(exported, capacity, beta) + WINDOW          # top tokens + window
            ours = allocate("headkv", [prof], capacity=capacity, window=WINDOW, beta=beta, compat="headkv")
            assert kept.tolist() == ours.budgets, (capacity, beta)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_kvcache_factory_max_capacity_prompts_is_capacity_plus_window(path, tmp_path):
    prof, exported = _export(path, tmp_path)
    for c in CAPACITIES:
        for beta in BETAS:
            kept = kvcache_factory_head_capacity(exported, c, beta) + WINDOW
            ours = allocate("headkv", [prof], capacity=c + WINDOW, window=WINDOW, beta=beta, compat="headkv")
            assert kept.tolist() == ours.budgets, (c, beta)


@pytest.mark.parametrize("temperature", [0.5, 2.0, 4.0])
def test_headkv_temp_is_one_over_temperature(temperature, tmp_path):
    path = shipped_profiles_dir() / "smollm2-135m.enhanced_retrieval.json"
    prof, exported = _export(path, tmp_path)
    share, layers, heads = _file_scores(exported)
    theirs = torch.pow(share, 1 / temperature)
    theirs = (theirs / torch.sum(theirs)).reshape(layers, heads).numpy()
    ours, _ = prepare_scores(prof.query_heads, temperature=temperature)
    np.testing.assert_allclose(theirs, ours, rtol=1e-12, atol=1e-15)
    assert not np.allclose(ours, prepare_scores(prof.query_heads)[0])             # the temperature matters
