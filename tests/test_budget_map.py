"""Budget map files: the format name other versions wrote is the one read, and the totals are checked."""

from __future__ import annotations

import json

import pytest

from headprobe import BudgetMap, FileFormatError

SMALL_MODEL = {"name": "tiny", "source": "test", "architecture": "llama", "num_layers": 2, "num_query_heads": 4,
               "num_kv_heads": 2, "head_dim": 8, "layer_types": ["full_attention"] * 2}


def _file(tmp_path, **changes):
    obj = {"format": "headprobe.budget", "version": 1, "model": SMALL_MODEL, "granularity": "kv_head",
           "method": {"allocator": "uniform", "capacity": 16, "window": 8},
           "shares": [[0.25, 0.25], [0.25, 0.25]], "budgets": [[16, 16], [16, 16]], "totals": {"total": 64}}
    obj.update(changes)
    path = tmp_path / "b.json"
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def test_a_budget_file_in_the_documented_format_loads(tmp_path):
    bm = BudgetMap.load(_file(tmp_path))
    assert bm.total == 64 and bm.budgets == [[16, 16], [16, 16]]
    assert BudgetMap.load(bm.save(tmp_path / "again.json")).budgets == bm.budgets
    assert json.loads((tmp_path / "again.json").read_text())["format"] == "headprobe.budget"


def test_another_format_name_or_a_wrong_total_is_refused(tmp_path):
    with pytest.raises(FileFormatError, match="field 'format': expected 'headprobe.budget'"):
        BudgetMap.load(_file(tmp_path, format="headprobe.budget_map"))
    with pytest.raises(FileFormatError, match="field 'totals.total': expected 64"):
        BudgetMap.load(_file(tmp_path, totals={"total": 65}))


def test_totals_are_required_and_checked_on_read(tmp_path):
    """docs/formats.md lists totals.total as checked on read: a map without it is not a budget map."""
    obj = json.loads(_file(tmp_path).read_text())
    del obj["totals"]
    (tmp_path / "b.json").write_text(json.dumps(obj))
    with pytest.raises(FileFormatError, match="field 'totals': missing"):
        BudgetMap.load(tmp_path / "b.json")
    with pytest.raises(FileFormatError, match="field 'totals.total': missing"):
        BudgetMap.load(_file(tmp_path, totals={"per_layer": [32, 32]}))
    with pytest.raises(FileFormatError, match="field 'totals.total': expected an integer, found str"):
        BudgetMap.load(_file(tmp_path, totals={"total": "64"}))
    with pytest.raises(FileFormatError, match=r"field 'totals.per_layer\[1\]': expected 32 \(the sum of layer 1's "
                                              r"budgets\), found 31"):
        BudgetMap.load(_file(tmp_path, totals={"total": 64, "per_layer": [32, 31]}))
    assert BudgetMap.load(_file(tmp_path, totals={"total": 64, "per_layer": [32, 32]})).total == 64


def test_a_map_its_reader_would_refuse_is_not_written(tmp_path):
    """Every map is read back by BudgetMap.from_json before it is written (negative budgets used to be written
    by ``allocate --compat headkv`` and refused by every reader after)."""
    from headprobe import HeadprobeError

    good = BudgetMap.load(_file(tmp_path))
    bad = BudgetMap(model=good.model, method=good.method, shares=[[0.5, 0.5], [0.0, 0.0]],
                    budgets=[[40, -8], [16, 16]])
    with pytest.raises(HeadprobeError, match=r"out.json: not written, its reader would refuse it: field 'budgets': "
                                             r"expected non-negative token counts"):
        bad.save(tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()
    skewed = BudgetMap(model=good.model, method=good.method, shares=[[0.5, 0.5], [0.5, 0.5]], budgets=good.budgets)
    with pytest.raises(HeadprobeError, match="field 'shares': expected non-negative values summing to 1"):
        skewed.save(tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()


def test_saving_never_replaces_a_map_another_run_wrote_meanwhile(tmp_path):
    """``allocate`` checks its output before it works; a map that appears at that name in between (a second
    ``allocate`` to the same file) is refused as the file is put in place, and stays; ``force`` replaces it."""
    from headprobe import HeadprobeError

    bm = BudgetMap.load(_file(tmp_path))
    out = tmp_path / "out.json"
    out.write_text("written by another run", encoding="utf-8")
    with pytest.raises(HeadprobeError, match="exists"):
        bm.save(out)
    assert out.read_text(encoding="utf-8") == "written by another run"
    assert BudgetMap.load(bm.save(out, force=True)).total == 64
