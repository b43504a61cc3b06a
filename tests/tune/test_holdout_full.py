"""The held-out report always has the full cache's row, whatever ``presets`` names (``--presets snapkv``)."""

from __future__ import annotations

import torch
from tune.synthetic_scores import install

import headprobe
from headprobe.tune import (
    HalvingRule,
    SearchSpace,
    TuneRequest,
    TuneTask,
    run_tune,
    split_items,
    write_tune_outputs,
)

torch.set_num_threads(1)


def test_the_full_cache_is_held_out_when_the_presets_leave_it_out(tiny_llama, tmp_path, monkeypatch):
    install(monkeypatch)
    needles = headprobe.load_needles(headprobe.shipped_needle_file("retrieval"), ["r01", "r02", "r03"])
    items = headprobe.items_from_needles(needles)
    task = TuneTask("needle", [200], [0.5], {"kind": "needle", "needle_ids": [i.id for i in items]}, items=items,
                    haystack=headprobe.load_haystack())
    space = SearchSpace(policies=("snapkv",), allocations=("uniform",),
                        values={"window": (4,), "kernel_size": (7,), "pooling": ("max",)}, presets=False)
    request = TuneRequest([40], space, split_items(task.ids, holdout_ids=["r03"]), task,
                          HalvingRule(eta=3, resamples=100), ["snapkv"], max_new_tokens=2, chat_template=False)
    out = tmp_path / "tune.json"
    outcome = run_tune(tiny_llama, request, out)
    assert outcome.holdout_settings[0].label == "full"
    report = write_tune_outputs(tiny_llama, outcome, out, None)
    rows = report["capacities"][0]["holdout"]
    assert [r["kind"] for r in rows if r["label"] == "full"] == ["full"]
    assert {r["label"] for r in rows} >= {"full", "snapkv@40"}
