"""The eval grid runner on tiny random models: plumbing, result file, resume, bad input."""

import json

import pytest
import torch

import headprobe
from headprobe import HeadprobeError
from headprobe.eval.cell_log import cell_log_path
from headprobe.eval.items import items_from_needles
from headprobe.eval.result import EvalResult
from headprobe.eval.runner import EvalRequest, run_eval
from headprobe.eval.settings import expand_settings, parse_setting
from headprobe.plots.eval_figures import needle_grid

torch.set_num_threads(1)

LENGTHS, DEPTHS = [300, 420], [0.0, 0.5]


#: SnapKV at the 8-token window these plumbing tests were written for: a capacity of 16 cannot hold the
#: published 32-token window of the ``snapkv`` preset.
SNAPKV8 = "snapkv[window=8]"


def _request(settings=("full", SNAPKV8, "streaming"), capacities=(16,), needles=2, **kw):
    items = items_from_needles(headprobe.load_needles(headprobe.shipped_needle_file("retrieval"))[:needles])
    return EvalRequest(expand_settings(list(settings), list(capacities)), items, LENGTHS, DEPTHS,
                       headprobe.load_haystack(), {"kind": "needle"}, max_new_tokens=3, chat_template=False, **kw)


def test_grid_plumbing_and_result_file(tiny_llama, tmp_path):
    out = tmp_path / "eval.json"
    seen = []
    result = run_eval(tiny_llama, _request(), out, progress=seen.append)
    assert sum(seen) == 3 * 4 * 2
    assert result.complete and len(result.cells) == 3 * 4
    loaded = EvalResult.load(out)
    raw = json.loads(out.read_text())
    assert raw["format"] == "headprobe.eval" and raw["version"] == 1 and raw["complete"] is True
    assert [s["label"] for s in raw["settings"]] == ["full", "snapkv[window=8]@16", "streaming@16"]
    assert {(c["length"], c["depth"]) for c in loaded.cells} == {(L, d) for L in LENGTHS for d in DEPTHS}
    summary = {s["setting"]: s for s in loaded.summary()}
    for cell in loaded.cells:
        assert 0.0 <= cell["accuracy"] <= 1.0 and cell["n"] == 2 and cell["ms_per_token"] > 0
        for t in cell["trials"]:
            assert t["prompt_len"] <= cell["length"] and t["new_tokens"] >= 1
            assert t["answer_span"][1] > t["answer_span"][0]
    # real cache bytes: a 16-token budget per head holds far less than the full cache
    assert summary["snapkv[window=8]@16"]["used_bytes"] < 0.25 * summary["full"]["used_bytes"]
    assert summary["full"]["used_bytes"] <= summary["full"]["cache_bytes"]
    assert summary["full"]["full_cache_bytes"] == pytest.approx(summary["snapkv[window=8]@16"]["full_cache_bytes"], rel=0.02)
    # one log line per cell after the header
    lines = cell_log_path(out).read_text().strip().split("\n")
    assert len(lines) == 1 + 12
    fig = needle_grid(loaded)
    assert len([a for a in fig.axes if a.get_title()]) == 3
    headprobe.save_figure(fig, tmp_path / "grid.png")
    assert (tmp_path / "grid.png").stat().st_size > 1000


def test_gemma3_hybrid_layers_run_through_the_grid(tiny_gemma3, tmp_path):
    req = _request(settings=("full", SNAPKV8), needles=1)
    result = run_eval(tiny_gemma3, req, tmp_path / "g.json")
    assert result.complete and len(result.cells) == 2 * 4


def test_shared_prefill_gives_the_same_cells_as_separate_runs(tiny_llama, tmp_path):
    settings = ("full", SNAPKV8, "streaming", "dynamickv", "keydiff")
    shared = run_eval(tiny_llama, _request(settings=settings), tmp_path / "a.json")
    alone = run_eval(tiny_llama, _request(settings=settings, share_prefill=False), tmp_path / "b.json")
    assert [c["trial"] for c in shared.cells] == [c["trial"] for c in alone.cells]
    for a, b in zip(shared.cells, alone.cells):
        assert a["accuracy"] == b["accuracy"] and a["cache_bytes"] == b["cache_bytes"]
        for ta, tb in zip(a["trials"], b["trials"]):
            assert ta["response"] == tb["response"] and ta["used_bytes"] == tb["used_bytes"]
            assert ta["shared_prefill"] == (a["setting"] != "keydiff@16") and not tb["shared_prefill"]


def test_long_generation_is_scored_against_the_full_cache(tiny_llama, tmp_path, monkeypatch):
    import headprobe.eval.runner as grid
    from headprobe.eval.items import items_from_longgen

    needles = headprobe.load_needles(headprobe.shipped_needle_file("retrieval"))[:1]
    req = EvalRequest(expand_settings(["keepkv", "full", "morphkv"], [40]), items_from_longgen(needles), [300],
                      [0.5], headprobe.load_haystack(), {"kind": "longgen"}, max_new_tokens=40, chat_template=False)
    real, full_runs = grid.run_trial, []

    def counting(lm, ctx, item, setting, *rest, **kw):
        full_runs.extend([setting.label] if setting.policy == "full" else [])
        return real(lm, ctx, item, setting, *rest, **kw)

    monkeypatch.setattr(grid, "run_trial", counting)
    result = run_eval(tiny_llama, req, tmp_path / "long.json")
    assert full_runs == ["full"]      # the full setting's answer is the reference; it is not generated twice
    by = {c["setting"]: c for c in result.cells}
    full = by["full"]["trials"][0]
    assert full["reference"] == full["response"] and by["full"]["accuracy"] == 1.0
    for label in ("morphkv@40", "keepkv@40"):
        t = by[label]["trials"][0]
        assert t["reference"] == full["response"] and 0.0 <= t["score"] <= 1.0 and "needle_recall" in t
    # constant-size caches: 40 tokens per head, far below the full cache after ~300 + 40 tokens
    assert by["morphkv@40"]["used_bytes"] < 0.2 * by["full"]["used_bytes"]
    keep = {s["setting"]: s for s in result.summary()}["keepkv@40"]
    assert keep["needle_recall"] == pytest.approx(by["keepkv@40"]["trials"][0]["needle_recall"])


def test_interrupted_grid_resumes_from_the_last_finished_cell(tiny_llama, tmp_path, monkeypatch):
    out = tmp_path / "eval.json"
    calls = []
    import headprobe.eval.runner as grid

    real = grid.run_trial

    def counting(*args, **kwargs):
        calls.append(args[3].label)
        if len(calls) == 7:      # mid-cell: cells 1-3 are done, cell 4 has one trial
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(grid, "run_trial", counting)
    with pytest.raises(KeyboardInterrupt):
        run_eval(tiny_llama, _request(), out)
    partial = EvalResult.load(out)
    assert len(partial.cells) == 3 and not partial.complete
    with pytest.raises(HeadprobeError, match="pass resume=True"):
        run_eval(tiny_llama, _request(), out)
    calls.clear()
    monkeypatch.setattr(grid, "run_trial", real)
    monkeypatch.setattr(grid, "run_trial", lambda *a, **k: (calls.append(a[3].label), real(*a, **k))[1])
    result = run_eval(tiny_llama, _request(), out, resume=True)
    assert len(calls) == (12 - 3) * 2            # finished cells are never redone
    assert result.complete and len(result.cells) == 12
    ids = [c["trial"] for c in result.cells]
    assert len(set(ids)) == 12
    # a resume with other settings is refused, naming what differs
    with pytest.raises(HeadprobeError, match="settings"):
        run_eval(tiny_llama, _request(capacities=(32,)), out, resume=True)


def test_a_torn_last_line_is_dropped_on_resume(tiny_llama, tmp_path):
    out = tmp_path / "eval.json"
    run_eval(tiny_llama, _request(settings=("full",), needles=1), out)
    log = cell_log_path(out)
    lines = log.read_text().split("\n")
    log.write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])      # 2 cells + a torn third
    result = run_eval(tiny_llama, _request(settings=("full",), needles=1), out, resume=True)
    assert len(result.cells) == 4 and result.complete


def test_bad_settings_fail_before_any_trial(tiny_llama, tmp_path):
    with pytest.raises(HeadprobeError, match="unknown policy 'snapkvv'"):
        expand_settings(["snapkvv"], [32], policies=tuple(headprobe.POLICIES))
    with pytest.raises(HeadprobeError, match="unknown allocation"):
        parse_setting("snapkv:headkvv")
    with pytest.raises(HeadprobeError, match="given twice"):
        expand_settings(["snapkv", "snapkv"], [32])
    # a shipped SmolLM2 profile does not fit the tiny model: refused with the difference named
    req = _request(settings=("headkv-r2",))
    req.profile_dirs = [headprobe.paths.shipped_profiles_dir()] if hasattr(headprobe, "paths") else None
    with pytest.raises(HeadprobeError, match="headkv-r2@16|no retrieval_reasoning profile"):
        run_eval(tiny_llama, req, tmp_path / "x.json")
    with pytest.raises(HeadprobeError, match="beyond the model's context"):
        bad = _request()
        bad.lengths = [10_000]
        run_eval(tiny_llama, bad, tmp_path / "y.json")
    assert not cell_log_path(tmp_path / "x.json").exists() and not cell_log_path(tmp_path / "y.json").exists()


def test_allocated_settings_use_their_profile(tiny_llama, tmp_path):
    """A head profile of the tiny model, found by kind: headkv budgets reach the cache and differ by head."""
    from conftest import write_random_profile

    path = tmp_path / "profiles" / "tiny.retrieval_reasoning.json"
    write_random_profile(tiny_llama, "retrieval_reasoning", path)
    req = _request(settings=(f"snapkv:headkv:{path}",), needles=1)
    result = run_eval(tiny_llama, req, tmp_path / "h.json")
    assert result.complete and result.settings[0]["allocation"] == "headkv"
    # the budget map really differs by head and reaches the cache
    from headprobe.eval.runner import resolve_budget
    from headprobe.eval.settings import EvalSetting

    bm = resolve_budget(tiny_llama, EvalSetting("h", "snapkv", "headkv", (str(path),), 16))
    assert len({b for row in bm.budgets for b in row}) > 1
    # found by kind in a profile folder, too
    bm2 = resolve_budget(tiny_llama, EvalSetting("h", "snapkv", "headkv", ("retrieval_reasoning",), 16),
                         [tmp_path / "profiles"])
    assert bm2.budgets == bm.budgets


def test_settings_carry_their_own_policy_options():
    settings = expand_settings(["keepkv[key_merge=zip,threshold=0.9]", "keepkv", "keepkv[window=16]"],
                               [64], options={"key_merge": "values_only"})
    by = {s.label: s for s in settings}
    assert by["keepkv[key_merge=zip,threshold=0.9]@64"].options == {"key_merge": "zip", "threshold": 0.9}
    # an option given for every setting is named in the label of each setting it changes
    assert by["keepkv[key_merge=values_only]@64"].options == {"key_merge": "values_only"}
    assert by["keepkv[window=16,key_merge=values_only]@64"].options == {"window": 16, "key_merge": "values_only"}
    assert expand_settings(["snapkv:headkv:retrieval[window=16]"], [64])[0].options == {"window": 16}
    with pytest.raises(HeadprobeError, match=r"expected KEY=VALUE"):
        expand_settings(["keepkv[zip]"], [64])
