"""``run_tune`` end to end on the tiny random model with a stubbed scorer whose best setting is known:
the bookkeeping of every candidate's trials and bytes, the choice, the held-out eval, the outputs, resume."""

import json

import pytest
import torch
from tune.synthetic_scores import install, true_mean

import headprobe
from headprobe.eval.result import EvalResult
from headprobe.eval.settings import EvalSetting
from headprobe.tune.halving import HalvingRule, rung_items
from headprobe.tune.report import load_tune_report, write_tune_outputs
from headprobe.tune.request import TuneRequest, TuneTask
from headprobe.tune.runner import run_tune, runs_dir
from headprobe.tune.space import SearchSpace
from headprobe.tune.split import split_items

torch.set_num_threads(1)

LENGTHS, DEPTHS = [200, 260], [0.25, 0.75]
#: ``pyramid[pooling=avg,taper=5]`` runs the same as the known best: the held-out eval runs it once, under this name
PRESETS = ["full", "snapkv", "pyramid", "streaming", "snapkv[window=8]", "pyramid[pooling=avg,taper=5]"]


def tiny_request(capacities=(16, 24), keep=1) -> TuneRequest:
    needles = headprobe.load_needles(headprobe.shipped_needle_file("retrieval"), ["r01", "r02", "r03", "r04", "r05"])
    items = headprobe.items_from_needles(needles)
    haystack = headprobe.load_haystack()
    task = TuneTask("needle", list(LENGTHS), list(DEPTHS), {"kind": "needle", "needle_ids": [i.id for i in items]},
                    items=items, haystack=haystack)
    space = SearchSpace(policies=("snapkv", "streaming"), allocations=("uniform", "pyramid"),
                        values={"window": (4, 8), "kernel_size": (7,), "pooling": ("max", "avg")},
                        keep_selections=keep)
    split = split_items(task.ids, holdout_ids=["r04", "r05"])
    return TuneRequest(list(capacities), space, split, task, HalvingRule(eta=3, resamples=300), list(PRESETS),
                       max_new_tokens=2, chat_template=False)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One tune of the tiny model with the stubbed scorer, shared by the tests that read it."""
    from conftest import make_tiny_llama

    from headprobe.eval import runner

    original = runner.run_trial
    counter = install()
    try:
        lm = make_tiny_llama()
        out = tmp_path_factory.mktemp("tuned") / "tune.json"
        outcome = run_tune(lm, tiny_request(), out)
        report = write_tune_outputs(lm, outcome, out, out.with_suffix(".png"))
    finally:
        runner.run_trial = original
    return outcome, report, out, counter


def test_the_known_best_is_chosen_and_a_full_evaluation_agrees(tuned, tiny_llama):
    outcome, _report, _out, _ = tuned
    for cap in (16, 24):
        chosen = outcome.chosen[cap]
        assert chosen.label == f"snapkv:pyramid[pooling=avg,taper=5.0]@{cap}"
        assert chosen.capacity == cap
        # a full evaluation of every candidate either stage raced ranks the chosen one first
        raced = [c for races in (outcome.stage1, outcome.stage2) for race in races if race.capacity == cap
                 for c in race.candidates]
        assert max(raced, key=true_mean).label == chosen.label
        assert true_mean(chosen) == pytest.approx(0.9)


def test_every_candidate_s_trials_and_bytes_are_booked_exactly(tuned):
    _outcome, report, out, counter = tuned
    per_item = len(LENGTHS) * len(DEPTHS)
    sizes = rung_items(3, 3)                                   # [1, 3] calibration items
    cells = {}
    for run in report["cost"]["runs"]:
        result = EvalResult.load(runs_dir(out) / run["file"])
        assert result.complete
        assert run["trials"] == sum(len(c["trials"]) for c in result.cells)
        assert run["settings"] == len(result.settings)
        for c in result.cells:
            for t in c["trials"]:
                key = (c["setting"], t["item"], c["length"], c["depth"])
                assert key not in cells                          # no trial is ever run twice
                cells[key] = t
    assert report["cost"]["trials"] == len(cells) == counter["trials"]
    assert report["cost"]["search_trials"] + report["cost"]["holdout_trials"] == len(cells)
    for cap in report["capacities"]:
        for cand in cap["candidates"]:
            stages = cand["stages"].values()
            if all("skipped" in s for s in stages):
                assert cand["n"] == 0 and cand["status"] == "skipped"
                continue
            reached = max(s["rungs_run"] for s in stages if "rungs_run" in s)
            assert cand["n"] == sizes[reached - 1] * per_item == len(cand["trials"])
            mine = [cells[(cand["label"], t["item"], t["length"], t["depth"])] for t in cand["trials"]]
            assert all(t["item"] in ("r01", "r02", "r03") for t in cand["trials"])      # calibration only
            assert cand["accuracy"] == pytest.approx(sum(t["score"] for t in mine) / len(mine), abs=1e-6)
            assert cand["cache_bytes"] == pytest.approx(sum(t["cache_bytes"] for t in mine) / len(mine), abs=0.1)
            assert cand["interval"][0] <= cand["accuracy"] <= cand["interval"][1]
            for stage in stages:
                if stage.get("dropped_at_rung") is not None:
                    assert stage["reason"]
        statuses = [c["status"] for c in cap["candidates"]]
        assert statuses.count("chosen") == 1
        # the held-out rows: the full cache, the presets that fit and the chosen setting, on r04 and r05 only
        rows = {r["label"]: r for r in cap["holdout"]}
        assert cap["chosen"]["held_out_as"] == f"pyramid[pooling=avg,taper=5]@{cap['capacity']}"
        assert rows[cap["chosen"]["held_out_as"]]["chosen"] and rows[cap["chosen"]["held_out_as"]]["kind"] == "chosen"
        assert cap["chosen"]["label"] not in rows
        assert rows["full"]["kind"] == "full" and rows["full"]["accuracy"] > 0.95
        for row in cap["holdout"]:
            scores = [cells[(row["label"], i, L, d)]["score"] for i in ("r04", "r05") for L in LENGTHS for d in DEPTHS]
            assert row["n"] == 8 and row["accuracy"] == pytest.approx(sum(scores) / 8, abs=1e-6)
        best = cap["best_preset_holdout"]
        presets = [r for r in cap["holdout"] if r["preset"] not in (None, "full")]
        assert {r["label"] for r in presets} == {f"pyramid@{cap['capacity']}", f"streaming@{cap['capacity']}"}
        assert rows[f"snapkv[window=8]@{cap['capacity']}"]["kind"] == "setting"      # compared, not a preset
        assert cap["chosen"]["holdout"]["accuracy"] == rows[cap["chosen"]["held_out_as"]]["accuracy"]
        assert best["label"] == max(presets, key=lambda r: r["accuracy"])["label"]
        assert best["verdict"] == "chosen better"                # 0.9 against at most 0.6, on 8 trials


def test_no_stage_spends_more_than_its_planned_bound(tuned):
    outcome, report, _out, _ = tuned
    stages = report["cost"]["stages"]
    assert set(stages) == {"selection", "allocation", "holdout"}
    assert sum(s["trials"] for s in stages.values()) == report["cost"]["trials"]
    for name, stage in stages.items():
        assert stage["trials"] <= stage["at_most"] == getattr(outcome.plan, name)
    per_item = len(LENGTHS) * len(DEPTHS)
    held = 1 + 2 * (len(outcome.request.presets) + 1)            # the full cache, presets and chosen, 2 capacities
    assert outcome.plan.holdout == held * 2 * per_item           # r04 and r05 held out


def test_presets_that_cannot_run_are_left_out_with_their_reason(tuned):
    outcome, _report, _, _ = tuned
    assert "snapkv@16" in outcome.holdout_skipped                 # a 32-token window in 16 tokens
    assert "smaller than the snapkv window (32 tokens)" in outcome.holdout_skipped["snapkv@16"]
    race = outcome.stage2[0]
    assert "snapkv@16" in race.skipped


def test_the_outputs_run_in_eval_and_read_back(tuned, tiny_llama, tmp_path):
    outcome, report, out, _ = tuned
    assert load_tune_report(out)["format"] == "headprobe.tune"
    assert out.with_suffix(".png").stat().st_size > 1000
    for cap in report["capacities"]:
        chosen = cap["chosen"]
        path = out.parent / chosen["budget_map"]
        bm = headprobe.BudgetMap.load(path)
        assert bm.method["allocator"] == "pyramid" and bm.method["capacity"] == cap["capacity"]
        assert bm.method["run_with"] == {"policy": "snapkv", "options": {"pooling": "avg", "window": 8}}
        assert bm.total == cap["capacity"] * 4 * 2
        assert chosen["setting_string"] == f"snapkv:{path}[window=8,kernel_size=7,pooling=avg]"
        setting = EvalSetting.parse(chosen["setting_string"])
        assert setting.allocation == "map" and setting.capacity == cap["capacity"]
        assert setting.options == {"pooling": "avg", "window": 8, "kernel_size": 7}
    # the map settings run in eval beside the presets, with the same bytes as the settings they came from
    specs = [c["chosen"]["setting_string"] for c in report["capacities"]]
    request = headprobe.EvalRequest(headprobe.expand_settings(specs + ["pyramid[window=8]"], [16]),
                                    outcome.request.task.subset(["r04"]), LENGTHS[:1], DEPTHS[:1],
                                    outcome.request.task.haystack, {"kind": "needle"}, 2, False)
    result = headprobe.run_eval(tiny_llama, request, tmp_path / "again.json")
    got = {c["setting"]: c for c in result.cells}
    holdout = {r["label"]: r for r in report["capacities"][0]["holdout"]}
    map16 = next(k for k in got if k.endswith("@16") and "budget" in k)
    chosen16 = report["capacities"][0]["chosen"]["held_out_as"]
    store = outcome.store.trials[chosen16][("r04", LENGTHS[0], DEPTHS[0])]
    assert got[map16]["trials"][0]["cache_bytes"] == store["cache_bytes"]
    assert got[map16]["trials"][0]["response"] == store["response"]
    assert holdout[chosen16]["n"] == 8


def test_an_interrupted_tune_resumes_without_redoing_a_trial(tiny_llama, tmp_path, monkeypatch):
    from headprobe.eval import cell_log

    counter = install(monkeypatch)
    whole = run_tune(tiny_llama, tiny_request(), tmp_path / "a" / "tune.json")
    full_count = counter["trials"]

    counter["trials"] = 0
    original, calls = cell_log.CellLog.add, {"n": 0}

    def add_then_stop(self, records):
        original(self, records)
        calls["n"] += 1
        if calls["n"] == 7:                                    # after the 7th logged cell group
            raise KeyboardInterrupt

    monkeypatch.setattr(cell_log.CellLog, "add", add_then_stop)
    out = tmp_path / "b" / "tune.json"
    with pytest.raises(KeyboardInterrupt):
        run_tune(tiny_llama, tiny_request(), out)
    first = counter["trials"]
    assert 0 < first < full_count
    monkeypatch.setattr(cell_log.CellLog, "add", original)
    with pytest.raises(headprobe.HeadprobeError, match="pass resume=True to continue it"):
        run_tune(tiny_llama, tiny_request(), out)
    counter["trials"] = 0
    resumed = run_tune(tiny_llama, tiny_request(), out, resume=True)
    assert first + counter["trials"] == full_count               # nothing finished was run again
    assert {c: s.label for c, s in resumed.chosen.items()} == {c: s.label for c, s in whole.chosen.items()}
    a = write_tune_outputs(tiny_llama, whole, tmp_path / "a" / "tune.json")
    b = write_tune_outputs(tiny_llama, resumed, out, resumed=True)
    for ra, rb in zip(a["capacities"], b["capacities"]):
        def strip(c):
            return json.loads(json.dumps(c).replace(str(tmp_path / "a"), "X").replace(str(tmp_path / "b"), "X"))

        assert strip(ra) == strip(rb)


def test_a_choice_made_without_a_single_answer_says_it_is_no_finding(tuned):
    # a capacity at which nothing answers any calibration item still yields a "chosen" setting (the tie-break
    # picks the fewest bytes); the text a user reads must say that this is no finding
    import copy

    from headprobe.tune.report import format_tune_report

    _, report, _, _ = tuned
    assert all(c["chosen"]["calibration"]["accuracy"] > 0 for c in report["capacities"])
    assert "no finding" not in format_tune_report(report)
    silent = copy.deepcopy(report)
    silent["capacities"][0]["chosen"]["calibration"]["accuracy"] = 0.0
    lines = format_tune_report(silent).splitlines()
    flagged = [i for i, line in enumerate(lines) if "no finding" in line]
    assert len(flagged) == 1
    n = silent["capacities"][0]["chosen"]["calibration"]["n"]
    assert f"none of its {n} calibration items" in lines[flagged[0]]
    assert lines[flagged[0] - 1].startswith(f"capacity {silent['capacities'][0]['capacity']}: chosen")
