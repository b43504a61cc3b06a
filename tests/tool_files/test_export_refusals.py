"""Exports that would mean nothing are refused (an all-zero profile, a budget map below its window); a
DuoAttention export keeps its split in the model's dtype; HeadKV files hold lists of finite scores."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import SMOLLM2_IDENTITY
from headprobe_cli.main import main

from headprobe import HeadprobeError
from headprobe.allocation.api import allocate
from headprobe.budget_map import BudgetMap
from headprobe.paths import shipped_profiles_dir
from headprobe.profile import Profile, reduce_groups
from headprobe.tool_files.duoattention import read_tsv, write_duoattention
from headprobe.tool_files.headkv_json import read_headkv_json
from headprobe.tool_files.layer_list import write_kvpress_ratios, write_layer_list

pytestmark = pytest.mark.filterwarnings("ignore:the split runs through")

SMOL_R2 = shipped_profiles_dir() / "smollm2-135m.retrieval_reasoning.json"


def _one_error(capsys) -> str:
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("headprobe: error:")]
    assert len(lines) == 1, lines
    return lines[0]


def duo_full_heads(folder, dtype: torch.dtype, group: int = 3) -> np.ndarray:
    """The KV heads DuoAttention's eval patch makes full (restated from mit-han-lab/duo-attention:
    ``load_attn_pattern`` reads the TSV with ``np.loadtxt`` and clips it to [0, 1]; the patch turns each
    layer's row into ``torch.tensor(row, dtype=model.dtype)``, repeats it per query head and cuts at 0.5)."""
    heads = np.clip(np.loadtxt(folder / "full_attention_heads.tsv", dtype=float, delimiter="\t", ndmin=2), 0, 1)
    rows = []
    for row in heads:
        t = torch.tensor(row, dtype=dtype)
        mask = torch.repeat_interleave(t, repeats=group) > 0.5
        rows.append(mask.view(-1, group)[:, 0].numpy())
    return np.array(rows)


# ---- DuoAttention in the model's dtype -----------------------------------------------------------

@pytest.mark.parametrize("share", [None, 0.25, 0.9])
def test_the_duoattention_split_survives_float16_and_bfloat16(tmp_path, share):
    profile = Profile.load(SMOL_R2)
    folder = write_duoattention(profile, tmp_path / "duo", full_share=share)
    info = json.loads((folder / "config.json").read_text())["headprobe"]
    expected = duo_full_heads(folder, torch.float32)
    assert expected.sum() == info["full_heads"]                    # 45 of 90 at the default share
    for dtype in (torch.float16, torch.bfloat16):
        assert np.array_equal(duo_full_heads(folder, dtype), expected), dtype
    # the ranked reading is unchanged: the values keep the scores' order
    values = read_tsv(folder / "full_attention_heads.tsv").ravel()
    assert np.diff(np.sort(values)).min() >= 1e-5 - 1e-12


def test_the_default_smollm2_export_has_45_full_heads_in_every_dtype(tmp_path):
    folder = write_duoattention(Profile.load(SMOL_R2), tmp_path / "duo")
    assert [int(duo_full_heads(folder, d).sum()) for d in (torch.float32, torch.float16, torch.bfloat16)] == [45] * 3


# ---- all-zero profiles, budget maps below their window ---------------------------------------------

def _zero_profile(tmp_path):
    q = [[0.0] * 9 for _ in range(30)]
    path = tmp_path / "p_zero.json"
    Profile(kind="retrieval", model=SMOLLM2_IDENTITY, probe={}, trials={"total": 4, "passed": 4}, query_heads=q,
            kv_heads=reduce_groups(q, 3, "mean")).save(path)
    return path


def test_an_all_zero_profile_is_not_exported_to_duoattention(tmp_path, capsys):
    path = _zero_profile(tmp_path)
    with pytest.raises(HeadprobeError, match="the retrieval profile has all-zero scores: nothing to choose the full "
                                             "heads by"):
        write_duoattention(Profile.load(path), tmp_path / "duo")
    assert main(["export", str(path), "--to", "duoattention", "-o", str(tmp_path / "duo")]) == 2
    assert "all-zero scores" in _one_error(capsys)
    assert not (tmp_path / "duo").exists()
    assert main(["allocate", "--profile", str(path), "-o", str(tmp_path / "b.json")]) == 2      # as allocate does
    assert "all-zero scores" in _one_error(capsys)


def _zero_budget_map(tmp_path, value=0):
    bm = allocate("headkv", [Profile.load(SMOL_R2)], capacity=128, window=8, beta=1.2)
    bm = BudgetMap(model=bm.model, method=bm.method, shares=bm.shares,
                   budgets=[[value] * len(row) for row in bm.budgets], granularity=bm.granularity)
    path = tmp_path / "b_zero.json"
    bm.save(path)
    return path


@pytest.mark.parametrize("to, extra", [("kvpress-layers", ["--prompt-len", "2048"]), ("layers", []),
                                       ("duoattention", [])])
@pytest.mark.parametrize("value", [0, 7])
def test_a_budget_map_below_its_window_is_not_exported(tmp_path, capsys, to, extra, value):
    path = _zero_budget_map(tmp_path, value)
    out = tmp_path / ("duo" if to == "duoattention" else "out.json")
    assert main(["export", str(path), "--to", to, *extra, "-o", str(out)]) == 2
    assert _one_error(capsys).endswith(
        f"the budget map gives head 0-0 (budgets[0][0]) {value} tokens, smaller than its window (8 tokens): every "
        "head keeps its window whatever the budget (generate --budget refuses this map too); allocate the map again")
    assert not out.exists()


def test_the_library_refuses_the_same_maps(tmp_path):
    bm = BudgetMap.load(_zero_budget_map(tmp_path))
    for write in (lambda: write_layer_list(bm, tmp_path / "l.json"),
                  lambda: write_kvpress_ratios(bm, tmp_path / "r.json", 2048)):
        with pytest.raises(HeadprobeError, match="smaller than its window"):
            write()
    good = allocate("headkv", [Profile.load(SMOL_R2)], capacity=128, window=8, beta=1.2)
    write_layer_list(good, tmp_path / "l.json")                     # a map that keeps its window exports


# ---- HeadKV score files --------------------------------------------------------------------------

def _headkv_file(tmp_path, value) -> str:
    obj = {f"{layer}-{h}": [0.5] for layer in range(30) for h in range(9)}
    obj["0-0"] = value
    path = tmp_path / "x_retrieval_heads.json"
    path.write_text(json.dumps(obj))
    return path


@pytest.mark.parametrize("value, found", [(5, "5"), ("high", "'high'"), ([], "an empty list"),
                                          ([1, "a"], "a list with a value that is not a number"),
                                          ({"a": 1}, "{'a': 1}")])
def test_a_headkv_value_that_is_not_a_list_of_numbers_is_refused(tmp_path, value, found):
    with pytest.raises(HeadprobeError, match=r"field '0-0': expected a non-empty list of numbers \(the per-trial "
                                             rf"scores\), found {found.replace('[', '.').replace('{', '.')}"):
        read_headkv_json(_headkv_file(tmp_path, value), model="smollm2-135m")


def test_huge_finite_headkv_scores_are_averaged_not_refused(tmp_path):
    profile = read_headkv_json(_headkv_file(tmp_path, [1e308, 1e308]), model="smollm2-135m")
    assert profile.query_heads[0][0] == 1e308
    path = _headkv_file(tmp_path, [1e308, float("inf")])
    with pytest.raises(HeadprobeError, match="field '0-0': scores must be finite, found"):
        read_headkv_json(path, model="smollm2-135m")


def test_import_refuses_a_scalar_value_in_one_line(tmp_path, capsys):
    path = _headkv_file(tmp_path, 5)
    assert main(["import", str(path), "--model", "smollm2-135m", "-o", str(tmp_path / "p.json")]) == 2
    assert "field '0-0': expected a non-empty list of numbers" in _one_error(capsys)
    assert not (tmp_path / "p.json").exists()
