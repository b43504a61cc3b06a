"""Eval settings: bracketed options go to the policy or the allocation that declares them, labels read back
to the same setting, and every bad key is refused in one line before the model loads."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import SMOLLM2_IDENTITY
from hypothesis import given, settings
from hypothesis import strategies as st

from headprobe.allocation.allocator import Allocator
from headprobe.allocation.api import allocate
from headprobe.allocation.options import AllocatorOptions, option
from headprobe.allocation.registry import ALLOCATORS
from headprobe.errors import HeadprobeError, flag_spelling
from headprobe.eval.runner import resolve_budget
from headprobe.eval.settings import EvalSetting, expand_settings, make_setting, parse_setting
from headprobe.profile import Profile, reduce_groups
from headprobe.runtime.policies import POLICIES

#: snapkv's options as its dataclass declares them (refusals list them in that order).
SNAPKV_OPTIONS = ", ".join(f.name for f in dataclasses.fields(POLICIES["snapkv"]))

SMOL = dataclasses.replace(SMOLLM2_IDENTITY, max_context=8192)


def _profile(path, scores=None):
    q = (np.random.default_rng(0).random((30, 9)) ** 3) if scores is None else np.asarray(scores)
    Profile(kind="retrieval_reasoning", model=SMOL, probe={}, trials={"total": 4, "passed": 4},
            query_heads=q.tolist(), kv_heads=reduce_groups(q.tolist(), 3, "mean")).save(path)
    return str(path)


# ---- routing -------------------------------------------------------------------------------------------------

def test_each_key_goes_to_whichever_declares_it():
    s, = expand_settings(["snapkv:headkv:retrieval[beta=1.01,window=32]"], [64])
    assert (s.policy, s.allocation, s.profiles) == ("snapkv", "headkv", ("retrieval",))
    assert s.options == {"window": 32} and s.allocation_options == {"beta": 1.01}
    s, = expand_settings(["headkv-r[beta=1.01]"], [64])
    assert s.label == "headkv-r[beta=1.01]@64" and s.allocation == "headkv" and s.allocation_options == {"beta": 1.01}
    s, = expand_settings(["pyramid[taper=10,window=16]"], [64])
    assert s.allocation_options == {"taper": 10} and s.options == {"window": 16}
    s, = expand_settings(["combined[task=code:0.5,single_doc_qa:0.5,beta=1.5]"], [64])
    assert s.allocation_options == {"task": "code:0.5,single_doc_qa:0.5", "beta": 1.5}
    s, = expand_settings(["headkv-r2[allow_fallback=true,reduction=max,window=question]"], [64])
    assert s.allocation_options == {"allow_fallback": True, "reduction": "max"} and s.question_window


@pytest.mark.parametrize("spec, message", [
    ("headkv-r[window=32,window=8]", "headkv-r[window=32,window=8]: option 'window' given twice"),
    ("headkv-r[beta=1.01,beta=1.5]", "option 'beta' given twice"),
    ("headkv-r[bogus=1]", (f"headkv-r[bogus=1]: option 'bogus' is an option of neither policy snapkv "
                          f"({SNAPKV_OPTIONS}) nor allocation headkv (beta, temperature, "
                          "reduction, allow_fallback, compat)")),
    ("snapkv[beta=1.01]", (f"option 'beta' is an option of neither policy snapkv ({SNAPKV_OPTIONS}) "
                          "nor allocation uniform (none)")),
    ("keepkv[beta=1.01]", ("option 'beta' is not an option of policy keepkv (window, threshold, key_merge, "
                          "score_estimator, ema_decay, score_window, kernel_size), and the setting has no allocation")),
    ("pyramid[beta=20]", "option 'beta' is an option of neither policy snapkv"),
    ("headkv-r[task=code]", "option 'task' is an option of neither policy snapkv"),
    ("headkv-r[beta=0.5]", "headkv-r[beta=0.5]: beta must be a number larger than 1, got 0.5"),
    ("headkv-r[reduction=median]", "reduction must be one of mean, max, sum, got 'median'"),
    ("headkv-r[temperature=0]", ("headkv-r[temperature=0]: setting option temperature=0: expected a positive finite "
                                "number")),
    ("pyramid[taper=1]", "setting option taper=1: expected a number larger than 1"),
    ("combined[task=code:x]", "task mix 'code:x': weight 'x' of 'code' is not a number"),
    ("headkv-r[allow_fallback=yes]", "setting option allow_fallback=yes: expected true or false"),
])
def test_bad_keys_and_values_are_refused_naming_the_setting_and_the_key(spec, message):
    with flag_spelling({"spec": "--settings", "specs": "--settings"}), pytest.raises(HeadprobeError) as info:
        expand_settings([spec], [64])
    assert str(info.value).startswith("--settings ") and message in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_a_key_both_declare_is_refused(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class Clash(AllocatorOptions):
        kernel_size: int = option(3, "a key snapkv declares too")

    both = Allocator("both", (), "declares kernel_size", Clash, lambda *a: None)
    monkeypatch.setitem(ALLOCATORS, "both", both)
    with pytest.raises(HeadprobeError, match=r"option 'kernel_size' is declared by both policy snapkv and "
                                             r"allocation both, so the setting cannot tell which it is for"):
        expand_settings(["snapkv:both[kernel_size=5]"], [64])
    assert expand_settings(["snapkv:both[window=5]"], [64])[0].options == {"window": 5}


def test_duplicate_keys_are_refused_by_the_command_before_the_model_loads(capsys):
    from headprobe_cli.main import main

    assert main(["eval", "--settings", "headkv-r[window=32,window=8]", "--capacities", "64", "--device", "cpu",
                 "--model", "/nonexistent/model"]) == 2
    assert capsys.readouterr().err == ("headprobe: error: --settings headkv-r[window=32,window=8]: option 'window' "
                                       "given twice\n")


def test_options_given_for_every_setting_are_named_in_the_labels_they_change():
    got = expand_settings(["snapkv", "headkv-r", "keepkv[window=16]", "full"], [64], options={"window": 32})
    assert [s.label for s in got] == ["snapkv@64", "headkv-r[window=32]@64", "keepkv[window=16]@64", "full"]
    assert [s.options.get("window") for s in got] == [32, 32, 16, None]
    got = expand_settings(["headkv-r", "pyramid[window=16]"], [64], options={"kernel_size": 5})
    assert [s.label for s in got] == ["headkv-r[kernel_size=5]@64", "pyramid[window=16,kernel_size=5]@64"]
    with pytest.raises(HeadprobeError, match=r"snapkv\[beta=1.01\]'?: option 'beta' is an option of neither"):
        expand_settings(["headkv-r", "snapkv"], [64], options={"beta": 1.01})


def test_a_setting_without_allocation_options_is_recorded_as_before():
    plain, tuned = expand_settings(["headkv-r", "headkv-r[beta=1.01]"], [64])
    assert "allocation_options" not in plain.to_json()
    assert tuned.to_json()["allocation_options"] == {"beta": 1.01}
    for s in (plain, tuned):
        assert EvalSetting.from_json(json.loads(json.dumps(s.to_json()))) == s


# ---- labels read back ----------------------------------------------------------------------------------------

WRITTEN = ["full", "snapkv", "headkv-r", "headkv-r[window=question]", "snapkv:headkv:retrieval[beta=1.01,window=32]",
           "combined[task=code:0.5,single_doc_qa:0.5]", "pyramid[taper=7.5]", "keepkv[key_merge=zip,threshold=0.9]",
           "snapkv[adaptive=true]@32,128", "streaming[sink=8]", "dynamickv:dynamickv[task=code]"]


@pytest.mark.parametrize("spec", WRITTEN)
def test_a_written_setting_reads_back_from_its_label(spec):
    for s in expand_settings([spec], [64]):
        assert EvalSetting.parse(s.label) == s


BASES = ["snapkv", "headkv-r", "headkv-er", "headkv-r2", "pyramid", "combined", "keepkv", "dynamickv", "streaming",
         "morphkv", "keydiff", "snapkv:headkv:retrieval", "snapkv:pyramid", "snapkv:combined",
         "keepkv:dynamickv:layer_retention", "snapkv:uniform"]
ALLOCATION_VALUES = {
    "beta": st.floats(1.0001, 100), "taper": st.floats(1.0001, 100) | st.integers(2, 100),
    "temperature": st.floats(1e-3, 1e3), "reduction": st.sampled_from(["mean", "max", "sum"]),
    "allow_fallback": st.booleans(), "compat": st.just("headkv"),
    "task": st.sampled_from(["code", "code:0.5,single_doc_qa:0.5", "single_doc_qa,code", "code:1"]),
}
POLICY_VALUES = st.integers(0, 4096) | st.booleans() | st.floats(0.001, 0.999) | st.sampled_from(
    ["max", "avg", "question", "zip", "values_only", "normalized"])


@st.composite
def generated_settings(draw):
    base = draw(st.sampled_from(BASES))
    plain = parse_setting(base)
    keys = POLICIES[plain.policy].option_names()
    options = {k: draw(POLICY_VALUES) for k in draw(st.lists(st.sampled_from(keys), unique=True, max_size=4))}
    names = ALLOCATORS[plain.allocation].options.names() if plain.allocation else ()
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names))) if names else []
    return base, draw(st.integers(1, 100_000)), options, {k: draw(ALLOCATION_VALUES[k]) for k in chosen}


@given(generated_settings())
@settings(max_examples=300, deadline=None)
def test_a_generated_setting_reads_back_from_its_label_and_names_every_option(case):
    base, capacity, options, allocation_options = case
    s = make_setting(base, capacity, options, allocation_options)
    assert EvalSetting.parse(s.label) == s
    assert expand_settings([s.label], [7]) == [s]
    assert EvalSetting.from_json(json.loads(json.dumps(s.to_json()))) == s
    preset = parse_setting(base).options
    assert s.options == {**preset, **options} and s.allocation_options == allocation_options
    for key, value in options.items():
        assert (f"{key}=" in s.name) == (key not in preset or preset[key] != value)
    for key in allocation_options:
        assert f"{key}=" in s.name


@pytest.mark.parametrize("kwargs, message", [
    ({"options": {"pooling": "8"}}, "policy option pooling='8' does not read back from the setting's name (it reads 8)"),
    ({"allocation_options": {"window": 8}}, ("allocation option window=8 does not read back from the setting's name "
                                             "(it reads a policy option)")),
    ({"options": {"beta": 1.5}}, "policy option beta=1.5 does not read back"),
    ({"options": {"pooling": "a,b"}}, "expected KEY=VALUE"),
])
def test_a_setting_that_cannot_be_written_is_refused(kwargs, message):
    with pytest.raises(HeadprobeError) as info:
        make_setting("snapkv:headkv", 64, **kwargs)
    assert message in str(info.value)
    with pytest.raises(HeadprobeError, match="give the options and the capacity apart from the base"):
        make_setting("snapkv[window=8]", 64)


# ---- the allocation options reach the budget map -------------------------------------------------------------

def test_allocation_options_reach_the_budget_map(tmp_path):
    lm = SimpleNamespace(identity=SMOL)
    path = _profile(tmp_path / "p.json")
    tuned, plain = expand_settings([f"snapkv:headkv:{path}[beta=1.01]", f"snapkv:headkv:{path}"], [64])
    bm = resolve_budget(lm, tuned)
    want = allocate("headkv", [Profile.load(path)], SMOL, capacity=64, window=8, beta=1.01)
    assert bm.method["beta"] == 1.01 and bm.budgets == want.budgets
    assert resolve_budget(lm, plain).budgets != bm.budgets and resolve_budget(lm, plain).method["beta"] == 1.2
    with pytest.raises(HeadprobeError, match=r"compat=headkv\]@64: the map is allocated per query head"):
        resolve_budget(lm, expand_settings([f"snapkv:headkv:{path}[compat=headkv]"], [64])[0])
    steep = resolve_budget(lm, expand_settings(["pyramid[taper=5]"], [64])[0])
    assert steep.method["beta"] == 5.0
    assert steep.budgets == allocate("pyramid", model=SMOL, capacity=64, window=8, taper=5).budgets


def test_an_allocation_refusal_in_eval_names_the_setting_option(tmp_path):
    """It used to advise --allow-fallback, a flag eval does not have."""
    from headprobe_cli.cmd_eval import FLAGS

    lm = SimpleNamespace(identity=SMOL)
    zero = _profile(tmp_path / "zero.json", np.zeros((30, 9)))
    with flag_spelling(FLAGS), pytest.raises(HeadprobeError) as info:
        resolve_budget(lm, expand_settings([f"snapkv:headkv:{zero}"], [64])[0])
    text = str(info.value)
    assert text.startswith(f"setting snapkv:headkv:{zero}@64: ") and "all-zero scores" in text
    assert "(pass setting option allow_fallback=true to allocate uniformly instead)" in text
    assert "--allow-fallback" not in text
    bm = resolve_budget(lm, expand_settings([f"snapkv:headkv:{zero}[allow_fallback=true]"], [64])[0])
    assert bm.method["fallback"] == "uniform" and {b for row in bm.budgets for b in row} == {64}
