"""benchmarks/merge_eval_results.py: a grid run as one process per needle, joined, equals the grid run once."""

import importlib.util
from pathlib import Path

import pytest
import torch

import headprobe
from headprobe import HeadprobeError
from headprobe.eval.items import items_from_needles
from headprobe.eval.result import EvalResult
from headprobe.eval.runner import EvalRequest, run_eval
from headprobe.eval.settings import expand_settings

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[2]


def _merge_module():
    spec = importlib.util.spec_from_file_location("merge_eval_results", ROOT / "benchmarks" / "merge_eval_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(lm, ids, out):
    needles = headprobe.load_needles(headprobe.shipped_needle_file("retrieval"), ids)
    task = {"kind": "needle", "needle_ids": ids, "haystack_fingerprint": headprobe.load_haystack().fingerprint}
    req = EvalRequest(expand_settings(["full", "snapkv[window=8]"], [16]), items_from_needles(needles), [300],
                      [0.0, 1.0], headprobe.load_haystack(), task, max_new_tokens=2, chat_template=False)
    return run_eval(lm, req, out)


def test_merged_parts_equal_one_run(tiny_llama, tmp_path):
    merge = _merge_module().merge
    whole = _run(tiny_llama, ["r01", "r02"], tmp_path / "whole.json")
    a = _run(tiny_llama, ["r01"], tmp_path / "a.json")
    b = _run(tiny_llama, ["r02"], tmp_path / "b.json")
    merged = merge([EvalResult.load(tmp_path / "a.json"), EvalResult.load(tmp_path / "b.json")])
    assert merged.complete and merged.task["needle_ids"] == ["r01", "r02"]
    by = {c["trial"]: c for c in merged.cells}
    assert set(by) == {c["trial"] for c in whole.cells}
    for cell in whole.cells:
        got = by[cell["trial"]]
        assert got["n"] == 2 and got["accuracy"] == pytest.approx(cell["accuracy"])
        assert got["used_bytes"] == pytest.approx(cell["used_bytes"])
        assert [t["response"] for t in got["trials"]] == [t["response"] for t in cell["trials"]]
    merged.save(tmp_path / "m.json")
    assert EvalResult.load(tmp_path / "m.json").summary() == merged.summary()
    with pytest.raises(HeadprobeError, match="share needles"):
        merge([a, a])
    with pytest.raises(HeadprobeError, match="at least two"):
        merge([a])
    b.grid = {"lengths": [420], "depths": [0.0, 1.0]}
    with pytest.raises(HeadprobeError, match="grid"):
        merge([a, b])
