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
