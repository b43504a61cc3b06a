"""``headprobe tune`` on the real SmolLM2 (slow, short): a window-8 and a window-32 SnapKV selection, uniform and
HeadKV budgets, one needle held out. The chosen setting's map, run as a setting, answers as its label does."""

from __future__ import annotations

import json

import pytest
from headprobe_cli.main import main

pytestmark = pytest.mark.slow


def test_tune_chooses_a_setting_whose_map_runs_as_it_does(tmp_path, capsys, one_thread):
    out = tmp_path / "t.json"
    assert main(["tune", "--model", "smollm2-135m", "--device", "cpu", "--capacities", "48", "--lengths", "500",
                 "--depths", "50", "--needle-ids", "r01", "r02", "r03", "--holdout-ids", "r03",
                 "--policies", "snapkv", "--allocations", "uniform", "headkv", "--head-kinds", "retrieval",
                 "--values", "window=8,32", "kernel_size=7", "pooling=max", "beta=1.2", "--no-preset-candidates",
                 "--presets", "full", "snapkv", "headkv-r", "--max-new-tokens", "16", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    cap = report["capacities"][0]
    rows = {r["label"]: r for r in cap["holdout"]}
    assert rows["full"]["accuracy"] > 0.5                        # SmolLM2 finds the held-out needle at 500 tokens
    standings = cap["stages"][1]["rungs"][-1]["standings"]
    assert standings[0]["label"] == cap["chosen"]["label"]
    assert all(s["mean"] <= standings[0]["mean"] for s in standings)
    chosen, held_as = cap["chosen"]["label"], cap["chosen"]["held_out_as"]
    assert set(rows) == {"full", "snapkv@48", "headkv-r@48", held_as} and rows[held_as]["chosen"]
    # the map setting reproduces the chosen setting's held-out trial: same answer, same bytes
    ev = tmp_path / "e.json"
    assert main(["eval", "--model", "smollm2-135m", "--device", "cpu", "--settings", cap["chosen"]["setting_string"],
                 chosen, "--lengths", "500", "--depths", "50", "--needle-ids", "r03", "--max-new-tokens", "16",
                 "--out", str(ev), "--plot", "none"]) == 0
    a, b = json.loads(ev.read_text())["cells"]
    assert a["trials"][0]["response"] == b["trials"][0]["response"]
    assert a["trials"][0]["cache_bytes"] == b["trials"][0]["cache_bytes"]
    held = json.loads((tmp_path / "t.runs" / "holdout.json").read_text())
    mine = next(c for c in held["cells"] if c["setting"] == held_as)
    assert mine["trials"][0]["response"] == b["trials"][0]["response"]
