"""Tune on the other tasks: an outside QA dataset (one prompt per row, no grid) and bAbI-style questions."""

from __future__ import annotations

import json

import torch

import headprobe
from headprobe.tune.halving import HalvingRule
from headprobe.tune.report import write_tune_outputs
from headprobe.tune.request import TuneRequest, TuneTask
from headprobe.tune.runner import run_tune
from headprobe.tune.space import SearchSpace
from headprobe.tune.split import split_items

torch.set_num_threads(1)

SPACE = SearchSpace(policies=("snapkv",), allocations=("uniform", "pyramid"),
                    values={"window": (8, "question"), "kernel_size": (7,), "pooling": ("max",), "taper": (20.0,)})


def test_a_dataset_task_searches_rows_and_holds_rows_out(tiny_llama, tmp_path):
    rows = [{"context": f"The keeper of lighthouse {i} kept a red notebook. " * 20, "input": f"Who kept notebook {i}?",
             "answers": ["the keeper"], "_id": f"q{i}"} for i in range(4)]
    (tmp_path / "qa.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    examples = headprobe.load_qa_dataset(str(tmp_path / "qa.jsonl"))
    task = TuneTask("dataset", [300], [None], {"dataset": "qa.jsonl"}, examples=examples)
    request = TuneRequest([16], SPACE, split_items(task.ids, holdout_ids=["q3"]), task, HalvingRule(resamples=200),
                          ["full", "snapkv[window=8]"], max_new_tokens=2, chat_template=False)
    outcome = run_tune(tiny_llama, request, tmp_path / "t.json")
    report = write_tune_outputs(tiny_llama, outcome, tmp_path / "t.json")
    cap = report["capacities"][0]
    skipped = {c["label"]: c for c in cap["candidates"] if c["status"] == "skipped"}
    assert "snapkv[window=question]@16" in skipped                 # a dataset prompt has no placed question
    for cand in cap["candidates"]:
        assert all(t["item"] in ("q0", "q1", "q2") and t["depth"] is None and t["length"] == 300
                   for t in cand["trials"])
    rows_held = {r["label"]: r for r in cap["holdout"]}
    assert set(rows_held) >= {"full", cap["chosen"]["label"]} and all(r["n"] == 1 for r in rows_held.values())
    assert report["task"]["kind"] == "dataset"


def test_a_babi_task_runs_its_questions_over_the_grid(tiny_llama, tmp_path):
    questions = headprobe.generate_questions(3, list(headprobe.BABI_TASKS), seed=0)
    items = headprobe.items_from_babi(questions)
    task = TuneTask("babi", [200], [0.5], {"kind": "babi"}, items=items, haystack=headprobe.load_haystack())
    split = split_items(task.ids, holdout_share=0.3)
    request = TuneRequest([16], SPACE, split, task, HalvingRule(resamples=200), ["full"], max_new_tokens=2,
                          chat_template=False)
    outcome = run_tune(tiny_llama, request, tmp_path / "t.json")
    report = write_tune_outputs(tiny_llama, outcome, tmp_path / "t.json")
    held = set(split.holdout)
    for cand in report["capacities"][0]["candidates"]:
        assert not {t["item"] for t in cand["trials"]} & held
    assert {r["label"] for r in report["capacities"][0]["holdout"]} == {"full", report["capacities"][0]["chosen"]["label"]}


def test_a_needle_task_names_its_needle_file_portably():
    task = TuneTask.needles(headprobe.shipped_needle_file("retrieval"), ["r02", "r01"], [200], [0.5],
                            headprobe.load_haystack())
    record = task.description["needles"]
    assert record["path"] == "needles/retrieval.jsonl" and record["shipped"] is True
    assert record["ids"] == task.ids == ["r02", "r01"] and len(record["fingerprint"]) > 8   # as given
    assert task.description["kind"] == "needle"


def test_outputs_another_run_wrote_meanwhile_are_refused_not_replaced(tiny_llama, tmp_path):
    questions = headprobe.generate_questions(2, list(headprobe.BABI_TASKS), seed=0)
    task = TuneTask("babi", [200], [0.5], {"kind": "babi"}, items=headprobe.items_from_babi(questions),
                    haystack=headprobe.load_haystack())
    request = TuneRequest([16], SPACE, split_items(task.ids, holdout_share=0.3), task, HalvingRule(resamples=100),
                          ["full"], max_new_tokens=2, chat_template=False)
    out = tmp_path / "t.json"
    outcome = run_tune(tiny_llama, request, out)
    out.write_text('{"another": "run"}')                       # written while this run worked
    try:
        write_tune_outputs(tiny_llama, outcome, out)
    except headprobe.HeadprobeError as exc:
        assert "exists; pass force=True to overwrite it" in str(exc)
    else:
        raise AssertionError("the other run's report was replaced")
    assert json.loads(out.read_text()) == {"another": "run"}
    assert write_tune_outputs(tiny_llama, outcome, out, replace=True)["format"] == "headprobe.tune"   # --force / --resume
