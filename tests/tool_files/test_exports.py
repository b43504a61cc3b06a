"""Importers and exporters on synthetic files: malformed input, identity checks, tie-free scores."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SMOLLM2_IDENTITY

from headprobe.allocation.api import allocate
from headprobe.errors import FileFormatError, HeadprobeError
from headprobe.profile import Profile, reduce_groups
from headprobe.tool_files.duoattention import (
    binarise,
    choose_split,
    ranked_pattern,
    read_duoattention,
    write_duoattention,
)
from headprobe.tool_files.headkv_json import read_headkv_json, write_headkv_json
from headprobe.tool_files.layer_list import read_layer_list, write_layer_list

SMOL = SMOLLM2_IDENTITY


def smol_profile(seed=0) -> Profile:
    q = (np.random.default_rng(seed).random((30, 9)) ** 2).tolist()
    return Profile(kind="retrieval_reasoning", model=SMOL, probe={}, trials={"total": 3, "passed": 3},
                   query_heads=q, kv_heads=reduce_groups(q, 3, "mean"))


def _write(path, obj):
    path.write_text(json.dumps(obj))
    return path


def test_synthetic_score_json_round_trip(tmp_path):
    p = smol_profile()
    out = write_headkv_json(p, tmp_path / "smol.json")
    keys = list(json.loads(out.read_text()))
    assert keys[:10] == [f"0-{h}" for h in range(9)] + ["1-0"] and len(keys) == 270
    back = read_headkv_json(out, model=SMOL)
    assert back.query_heads == p.query_heads and back.model.source == f"import:{out}"
    assert back.model.fingerprint == SMOL.fingerprint


@pytest.mark.parametrize("obj, match", [
    ({"0-0": [1], "0_1": [1]}, "keys must look like"),
    ({"0-0": [1], "0-1": [1], "1-0": [1]}, "field '1-1': missing"),
    ({"0-0": [], "0-1": [1]}, "non-empty list of numbers"),
    ({"0-0": ["a"]}, "non-empty list of numbers"),
    ([1, 2], "expected a JSON object"),
])
def test_malformed_score_json(tmp_path, obj, match):
    with pytest.raises(FileFormatError, match=match) as info:
        read_headkv_json(_write(tmp_path / "x.json", obj), model=SMOL)
    assert "\n" not in str(info.value) and "x.json" in str(info.value)


def test_score_json_of_wrong_shape_for_model(tmp_path):
    obj = {f"{l}-{h}": [0.1] for l in range(2) for h in range(2)}
    with pytest.raises(HeadprobeError, match="holds 2 layers x 2 query heads but .*SmolLM2.* has 30 x 9"):
        read_headkv_json(_write(tmp_path / "x.json", obj), model=SMOL)
    with pytest.raises(HeadprobeError, match="cannot tell the model"):
        read_headkv_json(_write(tmp_path / "unknown_model_heads.json", obj))


def test_ragged_tsv_is_refused(tmp_path):
    (tmp_path / "full_attention_heads.tsv").write_text("0.1\t0.2\t0.3\n0.4\t0.5\n")
    with pytest.raises(FileFormatError, match=r"row 1.*ragged"):
        read_duoattention(tmp_path, model=SMOL)
    (tmp_path / "full_attention_heads.tsv").write_text("0.1\tx\t0.3\n")
    with pytest.raises(FileFormatError, match="tab-separated numbers"):
        read_duoattention(tmp_path, model=SMOL)


def test_duoattention_export_of_headprobe_profile(tmp_path):
    p = smol_profile(4)
    kv = np.array(p.kv_heads)
    kv[3] = kv[3, 0]  # a tied row
    p.kv_heads = kv.tolist()
    out = write_duoattention(p, tmp_path / "duo", sink_size=4, recent_size=64)
    vals = np.loadtxt(out / "full_attention_heads.tsv", delimiter="\t")
    assert vals.shape == (30, 3) and vals.min() >= 0 and vals.max() <= 1
    assert len(np.unique(vals)) == 90 and (vals > 0.5).sum() == 45  # default: the top half full
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["sink_size"] == 4 and cfg["recent_size"] == 64 and cfg["sparsity"] == 0.5
    back = read_duoattention(out, model=SMOL)
    assert np.array_equal(np.array(back.kv_heads), vals)
    with pytest.raises(HeadprobeError, match="exists; pass force=True"):
        write_duoattention(p, out)
    write_duoattention(p, out, force=True, full_share=1 / 3)
    assert (np.loadtxt(out / "full_attention_heads.tsv") > 0.5).sum() == 30
    write_duoattention(p, out, force=True, full_share=1 / 3, binary=True)
    assert np.loadtxt(out / "full_attention_heads.tsv").sum() == 30
    with pytest.raises(HeadprobeError, match="exact=True writes the scores as stored"):
        write_duoattention(p, out, force=True, exact=True, full_share=0.5)


def test_ranked_pattern_keeps_order_and_breaks_ties_by_layer_head():
    s = np.array([[1.0, 1.0], [0.5, 1.0]])
    split = choose_split(s, full_share=0.5)
    assert split.full.tolist() == [[True, True], [False, False]] and split.tie == (1.0, 3, 2)
    u = ranked_pattern(s, split.full)
    assert u[0, 0] > u[0, 1] > 0.5 > u[1, 1] > u[1, 0] and u.min() >= 0 and u.max() <= 1
    assert np.diff(np.sort(u.ravel())).min() >= 1e-5 - 1e-12
    assert binarise(s, full_share=0.5).tolist() == [[1, 1], [0, 0]]
    assert binarise(s, threshold=0.75).tolist() == [[1, 1], [0, 1]]
    with pytest.raises(HeadprobeError, match="threshold=2 makes no KV head full"):
        choose_split(s, threshold=2)
    with pytest.raises(HeadprobeError, match="full_share=1.5: expected a share of heads in"):
        choose_split(s, full_share=1.5)


def test_layer_list_export(tmp_path):
    bm = allocate("pyramid", model=SMOL, capacity=64, window=8)
    data = read_layer_list(write_layer_list(bm, tmp_path / "l.json"))
    assert data["per_layer_total"] == bm.per_layer and sum(data["per_head"]) * 3 == bm.total
    assert data["per_head"][0] > data["per_head"][-1]
    txt = write_layer_list(bm, tmp_path / "l.txt")
    assert [int(x) for x in txt.read_text().split()] == data["per_head"]
    (tmp_path / "bad.json").write_text(json.dumps({**data, "total": 1}))
    with pytest.raises(FileFormatError, match="total"):
        read_layer_list(tmp_path / "bad.json")
