"""The held-out report always has the full cache's row, whatever ``presets`` names (``--presets snapkv``)."""

from __future__ import annotations

import torch
from tune.synthetic_scores import install

import headprobe
from headprobe.tune.halving import HalvingRule
from headprobe.tune.report import write_tune_outputs
from headprobe.tune.request import TuneRequest, TuneTask
from headprobe.tune.runner import run_tune
from headprobe.tune.space import SearchSpace
from headprobe.tune.split import split_items

torch.set_num_threads(1)


def _request(presets):
    """A one-candidate tune at capacity 40 on three needles, r03 held out, with ``presets``; and its items."""
    needles = headprobe.load_needles(headprobe.shipped_needle_file("retrieval"), ["r01", "r02", "r03"])
    items = headprobe.items_from_needles(needles)
    task = TuneTask("needle", [200], [0.5], {"kind": "needle", "needle_ids": [i.id for i in items]}, items=items,
                    haystack=headprobe.load_haystack())
    space = SearchSpace(policies=("snapkv",), allocations=("uniform",),
                        values={"window": (4,), "kernel_size": (7,), "pooling": ("max",)}, presets=False)
    return TuneRequest([40], space, split_items(task.ids, holdout_ids=["r03"]), task,
                       HalvingRule(eta=3, resamples=100), presets, max_new_tokens=2, chat_template=False), items


def test_the_full_cache_is_held_out_when_the_presets_leave_it_out(tiny_llama, tmp_path, monkeypatch):
    install(monkeypatch)
    request, _ = _request(["snapkv"])
    out = tmp_path / "tune.json"
    outcome = run_tune(tiny_llama, request, out)
    assert outcome.holdout_settings[0].label == "full"
    report = write_tune_outputs(tiny_llama, outcome, out, None)
    rows = report["capacities"][0]["holdout"]
    assert [r["kind"] for r in rows if r["label"] == "full"] == ["full"]
    assert {r["label"] for r in rows} >= {"full", "snapkv@40"}


def test_a_layer_split_is_held_out_beside_the_chosen_setting_and_scores_as_eval_runs_it(tiny_llama, tmp_path,
                                                                                        monkeypatch):
    # what a user deploys on vLLM / TensorRT-LLM / llama.cpp (a layer split file) is compared in tune's held-out
    # report under the engines' rule, and the row is the same setting eval runs from the same file
    from headprobe.allocation.layer_split_choice import split_budget_map
    from headprobe.layer_split import GLOBAL, LayerSplit

    install(monkeypatch)
    split = LayerSplit(model=tiny_llama.identity, engine="vllm", layers=(16, GLOBAL, 16, 16), sink=0, context=200)
    path = tmp_path / "split.json"
    split_budget_map(split).save(path)
    request, items = _request(["full", f"layer_window:{path}"])
    outcome = run_tune(tiny_llama, request, tmp_path / "tune.json")
    report = write_tune_outputs(tiny_llama, outcome, tmp_path / "tune.json", None)
    rows = {r["label"]: r for r in report["capacities"][0]["holdout"]}
    split_label = next(label for label in rows if label.startswith(f"layer_window:{path}"))
    assert rows[split_label]["kind"] == "setting" and split_label.endswith("@62")    # the map's own capacity
    # three local layers of four keep 16 of about 200 tokens: the split holds well under the full cache
    assert rows[split_label]["cache_bytes"] < 0.75 * rows["full"]["cache_bytes"]
    eval_request = headprobe.EvalRequest(headprobe.expand_settings([split_label], []), [items[2]], [200], [0.5],
                                         headprobe.load_haystack(), {"kind": "needle"}, 2, False)
    [cell] = headprobe.run_eval(tiny_llama, eval_request, tmp_path / "e.json").cells
    assert cell["accuracy"] == rows[split_label]["accuracy"]
