"""Eval settings that run a budget-map file: ``POLICY:FILE.json[OPTIONS]``."""

from __future__ import annotations

import pytest
from conftest import SMOLLM2_IDENTITY

import headprobe
from headprobe import HeadprobeError
from headprobe.eval.runner import resolve_budgets
from headprobe.eval.settings import EvalSetting, expand_settings, parse_setting


def _map(path, identity=SMOLLM2_IDENTITY, capacity=64, window=32, run_with=None, **kw):
    bm = headprobe.allocate("uniform", [], identity, capacity=capacity, window=window, **kw)
    if run_with is not None:
        bm.method["run_with"] = run_with
    bm.save(path)
    return path


def test_a_map_setting_takes_its_capacity_from_the_map_and_reads_back(tmp_path):
    path = _map(tmp_path / "m.json", capacity=48)
    spec = f"snapkv:{path}[window=32]"
    [setting] = expand_settings([spec], [16, 128])                  # the capacities of the others do not apply
    assert setting.allocation == "map" and setting.profiles == (str(path),)
    assert setting.capacity == 48 and setting.options == {"window": 32}
    assert setting.label == f"{spec}@48"
    assert EvalSetting.parse(setting.label) == setting
    assert EvalSetting.from_json(setting.to_json()) == setting


def test_a_converted_map_without_a_capacity_is_labelled_by_its_mean(tmp_path):
    bm = headprobe.allocate("uniform", [], SMOLLM2_IDENTITY, capacity=64, window=8)
    bm.method["capacity"] = None
    bm.budgets[0][0] += 90                                          # 30 x 3 heads: mean 64 + 1
    obj = bm.to_json()
    headprobe.frontend.atomic_write_json(tmp_path / "m.json", obj)
    [setting] = expand_settings([f"snapkv:{tmp_path / 'm.json'}"], [])
    assert setting.capacity == 65


def test_the_map_s_own_run_with_options_are_the_default(tmp_path):
    path = _map(tmp_path / "m.json", run_with={"policy": "snapkv", "options": {"window": 32, "pooling": "avg"}})
    assert parse_setting(f"snapkv:{path}").options == {"window": 32, "pooling": "avg"}
    assert parse_setting(f"snapkv:{path}[pooling=max]").options == {"window": 32, "pooling": "max"}
    assert parse_setting(f"streaming:{path}").options == {}           # run_with names another policy


@pytest.mark.parametrize("suffix, message", [
    ("@64", None),
    ("@32", "a budget map.s capacity is its own \\(64 tokens per KV head\\); pin none after @"),
])
def test_a_pinned_capacity_must_be_the_map_s(tmp_path, suffix, message):
    path = _map(tmp_path / "m.json")
    if message is None:
        assert expand_settings([f"snapkv:{path}{suffix}"], [])[0].capacity == 64
    else:
        with pytest.raises(HeadprobeError, match=message):
            expand_settings([f"snapkv:{path}{suffix}"], [])


def test_bad_map_settings_are_refused_before_any_model(tmp_path):
    path = _map(tmp_path / "m.json")
    with pytest.raises(HeadprobeError, match="spec='snapkv:nosuch.json': budget map 'nosuch.json': no such file"):
        expand_settings(["snapkv:nosuch.json"], [])
    with pytest.raises(HeadprobeError, match="a budget map takes no profiles"):
        expand_settings([f"snapkv:{path}:retrieval"], [])
    with pytest.raises(HeadprobeError, match="option 'beta' is not an option of policy snapkv"):
        expand_settings([f"snapkv:{path}[beta=1.2]"], [])
    prof = headprobe.load_profile(headprobe.paths.shipped_profiles_dir() / "smollm2-135m.retrieval.json")
    compat = headprobe.allocate("headkv", [prof], compat="headkv")
    compat.save(tmp_path / "q.json")
    with pytest.raises(HeadprobeError, match="has budgets per query head"):
        expand_settings([f"snapkv:{tmp_path / 'q.json'}"], [])


def test_a_map_for_another_model_or_too_small_for_the_window_is_refused_before_any_trial(tiny_llama, tmp_path):
    other = _map(tmp_path / "other.json")                        # made for SmolLM2
    with pytest.raises(HeadprobeError, match="budget map .* was made for HuggingFaceTB/SmolLM2-135M-Instruct but the "
                                             "model is tiny-llama"):
        resolve_budgets(tiny_llama, expand_settings([f"snapkv:{other}[window=8]"], []))
    small = _map(tmp_path / "small.json", identity=tiny_llama.identity, capacity=16, window=8)
    [ok] = expand_settings([f"snapkv:{small}[window=8]"], [])
    budget = resolve_budgets(tiny_llama, [ok])[ok.label]
    assert isinstance(budget, headprobe.BudgetMap) and budget.total == 16 * 4 * 2
    with pytest.raises(HeadprobeError, match="the map gives a head 16 tokens, fewer than the snapkv window "
                                             "\\(32 tokens\\)"):
        resolve_budgets(tiny_llama, expand_settings([f"snapkv:{small}[window=32]"], []))


def test_a_map_setting_runs_in_eval_as_the_setting_it_came_from(tiny_llama, tmp_path):
    """The uniform map at 16 tokens, run as a file, keeps what ``snapkv[window=8]@16`` keeps."""
    path = _map(tmp_path / "u.json", identity=tiny_llama.identity, capacity=16, window=8)
    items = headprobe.items_from_needles(headprobe.load_needles(headprobe.shipped_needle_file("retrieval"), ["r01"]))
    request = headprobe.EvalRequest(expand_settings([f"snapkv:{path}[window=8]", "snapkv[window=8]"], [16]), items,
                                    [200], [0.5], headprobe.load_haystack(), {"kind": "needle"}, 3, False)
    result = headprobe.run_eval(tiny_llama, request, tmp_path / "e.json")
    a, b = result.cells
    assert a["trials"][0]["response"] == b["trials"][0]["response"]
    assert a["trials"][0]["cache_bytes"] == b["trials"][0]["cache_bytes"]
