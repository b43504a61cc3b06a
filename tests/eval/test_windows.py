"""Observation windows in eval: published presets, the question window, budgets allocated for the window,
capacities pinned per setting."""

import dataclasses

import numpy as np
import pytest
import torch

import headprobe
from headprobe import HeadprobeError
from headprobe.allocation.headkv import headkv_floor
from headprobe.allocation.registry import ALLOCATORS, DEFAULT_BETA
from headprobe.eval.items import items_from_needles
from headprobe.eval.presets import EVAL_PRESETS, PUBLISHED
from headprobe.eval.runner import EvalRequest, resolve_budget, run_eval
from headprobe.eval.setting_run import run_setting
from headprobe.eval.settings import QUESTION_WINDOW, EvalSetting, expand_settings
from headprobe.haystack.context import build_context
from headprobe.runtime.generate import generate_compressed
from headprobe.runtime.policies import POLICIES

torch.set_num_threads(1)

LENGTHS, DEPTHS = [300, 420], [0.0, 0.5]


def _items(n=1):
    return items_from_needles(headprobe.load_needles(headprobe.shipped_needle_file("retrieval"))[:n])


def _request(settings, capacities=(80,), needles=1, **kw):
    return EvalRequest(expand_settings(list(settings), list(capacities)), _items(needles), LENGTHS, DEPTHS,
                       headprobe.load_haystack(), {"kind": "needle"}, max_new_tokens=3, chat_template=False, **kw)


# ---- presets at their published settings ---------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(EVAL_PRESETS))
def test_every_preset_runs_at_its_published_setting(name):
    """The policy a preset builds carries every published policy value; allocation values are the
    defaults of the allocator's options (HeadKV's beta 1.2, PyramidKV's taper 20)."""
    preset = PUBLISHED[name]
    policy, _, _, options = EVAL_PRESETS[name]
    built = headprobe.make_policy(policy, **options)
    fields = {f.name for f in dataclasses.fields(built)}
    allocator_defaults = ALLOCATORS[preset.allocation].options().as_dict() if preset.allocation else {}
    for key, value in preset.published.items():
        if key in fields:
            assert getattr(built, key) == value, (name, key)
        elif key in allocator_defaults:
            assert allocator_defaults[key] == value, (name, key)
        else:
            raise AssertionError(f"{name}: published {key} is neither a policy option nor an allocation option")
    if preset.allocation == "pyramid":
        assert preset.published["taper"] == 20
    elif preset.allocation == "headkv":
        assert preset.published["beta"] == 1.2
    assert preset.sources or name == "full"


def test_snapkv_runs_at_snapkvs_window_and_headkv_at_headkvs():
    settings = {s.name: s for s in expand_settings(["snapkv", "headkv-r", "pyramid", "dynamickv"], [64])}
    assert settings["snapkv"].window() == 32
    assert settings["headkv-r"].window() == settings["pyramid"].window() == settings["dynamickv"].window() == 8
    assert expand_settings(["snapkv[window=8]"], [64])[0].window() == 8
    assert expand_settings(["headkv-r[window=question]"], [64])[0].window() == QUESTION_WINDOW


def test_a_capacity_below_the_window_is_refused_before_any_trial(tiny_llama, tmp_path):
    from headprobe.eval.cell_log import cell_log_path

    with pytest.raises(HeadprobeError, match=r"snapkv@16: a capacity of 16 tokens per head is smaller than the "
                                             r"snapkv window \(32 tokens\)"):
        run_eval(tiny_llama, _request(["full", "snapkv"], capacities=(16,)), tmp_path / "w.json")
    assert not cell_log_path(tmp_path / "w.json").exists()


# ---- capacities pinned per setting -------------------------------------------------------------------

def test_capacities_pinned_after_at_replace_the_common_list():
    settings = expand_settings(["full", "snapkv@32,256", "headkv-r[window=32]@64,128", "streaming"], [32, 64])
    assert [s.label for s in settings] == ["full", "snapkv@32", "snapkv@256", "headkv-r[window=32]@64",
                                           "headkv-r[window=32]@128", "streaming@32", "streaming@64"]
    assert settings[3].name == "headkv-r[window=32]" and settings[3].options == {"window": 32}
    with pytest.raises(HeadprobeError, match="full cache has no capacity"):
        expand_settings(["full@64"], [64])
    with pytest.raises(HeadprobeError, match="positive token counts"):
        expand_settings(["snapkv@0"], [64])


# ---- where the question is ---------------------------------------------------------------------------

def test_question_span_holds_the_question_and_what_follows_it(tiny_llama):
    """The span decodes to the question sentence; in the plain form only the answer cue follows it."""
    tok = tiny_llama.tokenizer
    needle = headprobe.load_needles(headprobe.shipped_needle_file("retrieval"))[0]
    ctx = build_context(tok, headprobe.load_haystack(), needle, 300, 0.5, chat_template=False)
    s, e = ctx.question_span
    assert tok.decode(ctx.input_ids[s:e]).strip() == needle.question
    assert tok.decode(ctx.input_ids[e:]) == "\nAnswer:"
    assert ctx.text.endswith("Answer in a short phrase, based on the document above.\nQuestion: "
                             f"{needle.question}\nAnswer:")
    assert ctx.after_question == ctx.length - e and ctx.question_window == ctx.length - s
    assert ctx.question_window == ctx.after_question + (e - s)
    # a question given by the item (bAbI, long generation) is measured the same way
    asked = "Where did the secret code go?"
    ctx2 = build_context(tok, headprobe.load_haystack(), needle, 300, 0.5, chat_template=False, question=asked)
    s2, e2 = ctx2.question_span
    assert tok.decode(ctx2.input_ids[s2:e2]).strip() == asked


# ---- window=question through the grid ----------------------------------------------------------------

def test_question_window_trials_equal_runs_at_that_fixed_window(tiny_llama, tmp_path):
    """Each trial runs with its prompt's question window: the same answer and bytes as a setting with that
    window in tokens, and the cache holds the whole question plus the selected tokens, no more."""
    result = run_eval(tiny_llama, _request(["full", "snapkv[window=question]"]), tmp_path / "q.json")
    setting = next(s for s in expand_settings(["snapkv[window=question]"], [64]))
    item = _items()[0]
    by_full = {(c["length"], c["depth"]): c["trials"][0]["used_bytes"] for c in result.cells if c["setting"] == "full"}
    seen = set()
    for cell in result.cells:
        if cell["setting"] == "full":
            continue
        ctx = build_context(tiny_llama.tokenizer, headprobe.load_haystack(), item.needle, cell["length"],
                            cell["depth"], chat_template=False)
        (trial,) = cell["trials"]
        assert trial["window"] == ctx.question_window > ctx.after_question
        seen.add(trial["window"])
        fixed = run_setting(tiny_llama, ctx.input_ids, setting.with_window(ctx.question_window), 80, 3)
        assert (fixed.text, fixed.used_bytes, fixed.cache_bytes) == (trial["response"], trial["used_bytes"],
                                                                     trial["cache_bytes"])
        assert trial["used_bytes"] < 0.5 * by_full[(cell["length"], cell["depth"])]
    assert seen


def test_question_window_keeps_every_question_token(tiny_llama):
    tok = tiny_llama.tokenizer
    needle = headprobe.load_needles(headprobe.shipped_needle_file("retrieval"))[1]
    ctx = build_context(tok, headprobe.load_haystack(), needle, 420, 0.0, chat_template=False)
    res = generate_compressed(tiny_llama, input_ids=torch.tensor([ctx.input_ids]), policy="snapkv", budget=96,
                              policy_options={"window": ctx.question_window}, max_new_tokens=1)
    for store in res.cache.stores:
        view = store.padded()
        for seg in range(view["positions"].shape[0]):
            kept = view["positions"][seg][view["valid"][seg]].tolist()
            assert set(range(ctx.question_span[0], ctx.length)) <= set(kept) and len(kept) == 96


def test_a_question_longer_than_the_capacity_is_refused_before_any_trial(tiny_llama, tmp_path):
    from headprobe.eval.cell_log import cell_log_path

    with pytest.raises(HeadprobeError, match=r"snapkv\[window=question\]@8: a question window of \d+ tokens does "
                                             r"not fit a capacity of 8 tokens per head \(item r01\)"):
        run_eval(tiny_llama, _request(["full", "snapkv[window=question]"], capacities=(8,)), tmp_path / "x.json")
    assert not cell_log_path(tmp_path / "x.json").exists()
    with pytest.raises(HeadprobeError, match="window=question needs a prompt"):
        from headprobe.eval.datasets import QAExample, run_dataset_eval

        run_dataset_eval(tiny_llama, [QAExample("a", "text", "q?", ("x",))],
                         expand_settings(["snapkv[window=question]"], [64]), tmp_path / "d.json")
    with pytest.raises(HeadprobeError, match="option 'windw' is an option of neither policy snapkv"):
        expand_settings(["snapkv[windw=question]"], [64])
    expand_settings(["snapkv[window=question]"], [64])[0].check_policy()


# ---- budget maps allocated for the window the policy uses ---------------------------------------------

def test_headkv_map_is_allocated_for_the_policys_window(tiny_llama, tmp_path):
    """A HeadKV setting at window 12 gets a map whose floor holds 12 tokens (HeadKV's floor at that window),
    summing to the same total as the uniform capacity; a map allocated for window 8 cannot run at 12."""
    from conftest import write_random_profile

    path = tmp_path / "tiny.retrieval.json"
    write_random_profile(tiny_llama, "retrieval", path)
    heads = tiny_llama.identity.num_layers * tiny_llama.identity.num_kv_heads
    setting = expand_settings([f"snapkv:headkv:{path}[window=12]"], [16])[0]
    bm = resolve_budget(tiny_llama, setting)
    budgets = np.asarray(bm.budgets)
    assert bm.method["window"] == 12 and budgets.min() >= headkv_floor(16, 12, DEFAULT_BETA) >= 12
    assert budgets.sum() == 16 * heads and len(set(budgets.ravel().tolist())) > 1
    # the same map the allocator gives for that window
    prof = headprobe.load_file(path)
    assert bm.budgets == headprobe.allocate("headkv", [prof], tiny_llama.identity, capacity=16, window=12).budgets
    # the map allocated for HeadKV's default window 8 has heads below 12 tokens and is refused at window 12
    old = resolve_budget(tiny_llama, setting, window=8)
    assert min(min(r) for r in old.budgets) < 12
    with pytest.raises(HeadprobeError, match="smaller than the snapkv window"):
        generate_compressed(tiny_llama, "The river ran past the old mill. " * 8, policy="snapkv", budget=old,
                            policy_options={"window": 12}, max_new_tokens=1)
    # through the grid: runs, and holds the bytes of uniform SnapKV at the same window and capacity
    result = run_eval(tiny_llama, _request([f"snapkv:headkv:{path}[window=12]", "snapkv[window=12]"],
                                           capacities=(16,)), tmp_path / "h.json")
    by = {(c["setting"], c["length"], c["depth"]): c for c in result.cells}
    for (label, length, depth), cell in by.items():
        if label.startswith("snapkv:headkv"):
            assert cell["trials"][0]["used_bytes"] == by[("snapkv[window=12]@16", length, depth)]["trials"][0][
                "used_bytes"]


def test_question_window_budget_maps_are_allocated_per_window(tiny_llama, tmp_path):
    from conftest import write_random_profile

    path = tmp_path / "tiny.retrieval.json"
    write_random_profile(tiny_llama, "retrieval", path)
    setting = expand_settings([f"snapkv:headkv:{path}[window=question]"], [96])[0]
    with pytest.raises(HeadprobeError, match="window is set per prompt"):
        resolve_budget(tiny_llama, setting)
    result = run_eval(tiny_llama, _request(["full", f"snapkv:headkv:{path}[window=question]"], capacities=(96,)),
                      tmp_path / "q.json")
    for cell in result.cells:
        for t in cell["trials"]:
            if "window" in t:
                bm = resolve_budget(tiny_llama, setting, window=t["window"])
                assert min(min(r) for r in bm.budgets) >= t["window"] and bm.method["window"] == t["window"]


def test_policies_with_an_observation_window_take_the_question_window(tiny_llama, tmp_path):
    names = [n for n, cls in POLICIES.items() if n not in ("full", "keydiff")]
    specs = ["full"] + [f"{n}[window=question]" for n in names]
    result = run_eval(tiny_llama, _request(specs), tmp_path / "all.json")
    assert result.complete and all("window" in t for c in result.cells if c["setting"] != "full"
                                   for t in c["trials"])
    assert isinstance(EvalSetting("x", "snapkv", options={"window": QUESTION_WINDOW}).question_window, bool)


def test_describe_window_tells_published_from_matched_settings():
    from headprobe.eval.presets import describe_window

    specs = ["full", "snapkv", "snapkv[window=8]", "headkv-r", "headkv-r[window=question]", "streaming",
             "snapkv[window=64,kernel_size=5]", "snapkv:headkv:retrieval"]
    got = {s.name: describe_window(s.to_json(), [29, 34] if s.question_window else ())
           for s in expand_settings(specs, [64])}
    assert got["full"] == ("full", "–", "–")
    assert got["snapkv"] == ("snapkv", "32", "published")
    assert got["snapkv[window=8]"] == ("snapkv", "8", "matched")
    assert got["headkv-r"] == ("headkv-r", "8", "published")
    assert got["headkv-r[window=question]"] == ("headkv-r", "question (29–34)", "matched")
    assert got["streaming"] == ("streaming", "none", "published")
    assert got["snapkv[window=64,kernel_size=5]"][1:] == ("64", "custom")
    assert got["snapkv:headkv:retrieval"] == ("snapkv:headkv:retrieval", "8", "custom")
