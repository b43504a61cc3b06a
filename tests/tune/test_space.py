"""The search space: candidates generated from the allocators' option declarations and the policies' options."""

import dataclasses

import pytest
from conftest import SMOLLM2_IDENTITY

import headprobe
from headprobe import HeadprobeError
from headprobe.allocation.options import option
from headprobe.eval.settings import EvalSetting
from headprobe.tune.space import (
    UNIFORM,
    Allocation,
    SearchSpace,
    allocations,
    candidate,
    canonical,
    count_candidates,
    dedupe,
    parse_tune_values,
    preset_seeds,
    searched_policy_options,
    selections,
)


@pytest.fixture(scope="module")
def smollm2_profiles():
    return {k: headprobe.newest_profile(SMOLLM2_IDENTITY.name, k).profile
            for k in ("retrieval", "enhanced_retrieval", "retrieval_reasoning", "layer_retention")}


def test_policy_options_are_searched_only_where_the_policy_declares_them():
    assert searched_policy_options("snapkv") == ("window", "kernel_size", "pooling")
    assert searched_policy_options("dynamickv") == ("window", "kernel_size")
    assert searched_policy_options("streaming") == ()          # keeps recent tokens: no observation window
    assert searched_policy_options("keydiff") == ()


def test_selections_cross_the_searched_values_and_read_back_as_settings():
    space = SearchSpace(policies=("snapkv", "streaming"), values={"window": (8, 32, "question"), "pooling": ("max",)})
    sels = selections(space)
    assert len(sels) == 3 * 2 * 1 + 1                         # window x kernel (5, 7) x pooling, and streaming
    labels = [candidate(s, UNIFORM, 64).label for s in sels]
    assert "snapkv@64" in labels                             # window 32, kernel 7, max: the preset itself
    assert "snapkv[window=8]@64" in labels and "snapkv[kernel_size=5,window=question]@64" in labels
    for s, label in zip(sels, labels):
        setting = EvalSetting.parse(label)
        assert setting == candidate(s, UNIFORM, 64)
        full = {**dataclasses.asdict(headprobe.POLICIES[s.policy]()), **setting.options}
        assert all(full[k] == v for k, v in s.options)


def test_allocations_come_from_the_declared_search_values(smollm2_profiles):
    space = SearchSpace(policies=("snapkv",), allocations=("headkv", "pyramid", "dynamickv"))
    found = allocations(space, smollm2_profiles)
    headkv = [a for a in found if a.method == "headkv"]
    assert {a.profiles for a in headkv} == {("retrieval",), ("enhanced_retrieval",), ("retrieval_reasoning",)}
    assert sorted(dict(a.options).get("beta", 1.2) for a in headkv if a.profiles == ("retrieval",)) == \
        sorted(headprobe.allocation.headkv.BETA_SEARCH)
    assert sorted(dict(a.options).get("taper", 20.0) for a in found if a.method == "pyramid") == [2.0, 5.0, 20.0]
    tasks = [dict(a.options).get("task") for a in found if a.method == "dynamickv"]
    assert tasks == [None, *sorted(smollm2_profiles["layer_retention"].retention)]
    # options equal to their default are left out, so the label names only what differs
    assert Allocation("headkv", ("retrieval",), ()) in headkv


def test_a_missing_profile_leaves_its_allocations_out(smollm2_profiles):
    space = SearchSpace(policies=("snapkv",))
    only_heads = {k: v for k, v in smollm2_profiles.items() if k == "retrieval"}
    methods = {a.method for a in allocations(space, only_heads)}
    # dynamickv and combined need layer retention: every allocator that reads only head scores is in
    from headprobe.allocation.registry import ALLOCATORS

    assert methods == {n for n, a in ALLOCATORS.items() if set(a.needs) <= {"head_scores"} and a.policy is None}
    assert {"uniform", "headkv", "pyramid"} <= methods and not {"dynamickv", "combined"} & methods


def test_a_new_allocator_option_reaches_the_space_by_its_declaration(monkeypatch, smollm2_profiles):
    """Declaring ``search`` on a new option is all it takes: nothing in tune names it."""
    from headprobe.allocation import pyramid, registry

    @dataclasses.dataclass(frozen=True)
    class Wider(pyramid.PyramidOptions):
        smoothing: float = option(0.0, "a new knob", search=(0.0, 0.5))

    allocator = dataclasses.replace(registry.ALLOCATORS["pyramid"], options=Wider)
    monkeypatch.setitem(registry.ALLOCATORS, "pyramid", allocator)
    found = [a for a in allocations(SearchSpace(policies=("snapkv",), allocations=("pyramid",)), {})]
    assert len(found) == 3 * 2
    assert {dict(a.options).get("smoothing", 0.0) for a in found} == {0.0, 0.5}
    # --values replaces the declared values
    found = allocations(SearchSpace(policies=("snapkv",), allocations=("pyramid",), values={"smoothing": (0.25,)}),
                        {})
    assert {dict(a.options)["smoothing"] for a in found} == {0.25}


def test_a_candidate_equal_to_a_preset_takes_its_name():
    sel = selections(SearchSpace(policies=("snapkv",), values={"window": (8,), "kernel_size": (7,),
                                                                "pooling": ("max",)}))[0]
    generated = candidate(sel, Allocation("headkv", ("retrieval",), ()), 64)
    assert generated.label == "snapkv:headkv:retrieval@64"
    seeds = preset_seeds(SearchSpace(policies=("snapkv",)), 64)
    preset = next(s for s in seeds if s.name == "headkv-r")
    assert canonical(generated) == canonical(preset)
    assert [s.label for s in dedupe([preset, generated])] == ["headkv-r@64"]


def test_preset_seeds_follow_the_searched_policies_and_head_kinds():
    labels = [s.label for s in preset_seeds(SearchSpace(policies=("snapkv",), head_kinds=("retrieval",)), 32)]
    assert labels == ["snapkv@32", "pyramid@32", "headkv-r@32"]


def test_candidate_counts(smollm2_profiles):
    space = SearchSpace(policies=("snapkv",), allocations=("uniform", "headkv"), head_kinds=("retrieval",),
                        values={"window": (8, 32), "kernel_size": (7,), "pooling": ("max",), "beta": (1.01, 1.2)},
                        keep_selections=2)
    assert count_candidates(space, smollm2_profiles) == (2, 2 * (2 + 1) + 2)   # + snapkv and headkv-r


def test_values_parse_as_setting_options_read_them():
    assert parse_tune_values(["window=8,32,question", "beta=1.01,1.2", "temperature=none,2", "adaptive=true"]) == {
        "window": (8, 32, "question"), "beta": (1.01, 1.2), "temperature": (None, 2), "adaptive": (True,)}


@pytest.mark.parametrize("items, message", [
    (["window"], "values='window': expected KEY=V1\\[,V2,...\\]"),
    (["window=8,,32"], "values='window=8,,32': an empty value"),
    (["window=8", "window=32"], "values='window=32': option 'window' given twice"),
])
def test_bad_values_are_refused(items, message):
    with pytest.raises(HeadprobeError, match=message):
        parse_tune_values(items)


@pytest.mark.parametrize("space, message", [
    (SearchSpace(policies=("full",)), "policies='full': reads no budget; expected some of"),
    (SearchSpace(policies=("nosuch",)), "policies='nosuch': is no policy"),
    (SearchSpace(allocations=("nosuch",)), "allocations='nosuch': expected some of headkv"),
    (SearchSpace(head_kinds=("layer_retention",)), "head_kinds='layer_retention': expected some of retrieval"),
    (SearchSpace(values={"bogus": (1,)}), "values='bogus': no searched policy or allocation has option 'bogus'"),
    (SearchSpace(values={"kernel_size": (4,)}), "values='kernel_size=4': policy snapkv: kernel_size 4: expected an odd"),
    (SearchSpace(values={"beta": (0.5,)}), "values='beta=0.5': beta must be a number larger than 1"),
    (SearchSpace(keep_selections=0), "keep_selections=0: expected 1 or more"),
])
def test_bad_spaces_are_refused_in_one_line(space, message):
    with pytest.raises(HeadprobeError) as err:
        space.check()
    assert message in str(err.value) and "\n" not in str(err.value)


def test_allocations_bound_to_one_policy_are_refused_with_the_way_to_run_them():
    """A layer split is made for one context and window, not at tune's capacities: each allocation the registry
    binds to one policy is refused before any trial, naming allocate and the preset form that runs it."""
    from headprobe.allocation.registry import ALLOCATORS

    bound = [name for name, allocator in ALLOCATORS.items() if allocator.policy is not None]
    assert bound, "the registry holds the layer-split allocations"
    for name in bound:
        with pytest.raises(HeadprobeError) as err:
            SearchSpace(allocations=(name,)).check()
        message = str(err.value)
        assert f"allocations={name!r}" in message and f"allocate --method {name}" in message
        assert f"--presets {ALLOCATORS[name].policy}:split.json" in message and "\n" not in message


def test_head_kinds_are_the_registered_head_score_kinds():
    """Tune searches every registered pass's head-score kinds: the shipped own-data kinds and a pass
    registered later, without a second list to edit."""
    from headprobe.probes import registry

    SearchSpace(head_kinds=("query_focus", "context_retrieval")).check()
    toy = registry.ProbePass("toy_heads", ("toy_heads",), "head_scores", registry.get_pass("retrieval").implementation)
    registry.register_pass(toy)
    try:
        SearchSpace(head_kinds=("toy_heads",)).check()
    finally:
        registry.unregister_pass("toy_heads")
    with pytest.raises(HeadprobeError, match="head_kinds='toy_heads'"):
        SearchSpace(head_kinds=("toy_heads",)).check()


def test_every_generated_candidate_reads_back_from_its_label(smollm2_profiles):
    """Every candidate the whole space generates (every budget policy of the registry, every allocator and its
    declared values, the question window too) is built once from its parts and its label reads back to it."""
    from headprobe.allocation.registry import ALLOCATORS
    from headprobe.eval.settings import expand_settings
    from headprobe.tune.space import budget_policies

    space = SearchSpace(policies=budget_policies(), allocations=tuple(a for a, x in ALLOCATORS.items() if x.policy is None))
    sels, allocs = selections(space), allocations(space, smollm2_profiles)
    assert len(sels) > 10 and len(allocs) > 10
    generated = [candidate(s, a, 64) for s in sels for a in allocs[:: max(1, len(allocs) // 12)] + [UNIFORM]]
    assert any(c.question_window for c in generated) and any(c.allocation_options for c in generated)
    for c in generated:
        assert EvalSetting.parse(c.label) == c
        assert expand_settings([c.label], [7]) == [c]
    for c in preset_seeds(space, 64):
        assert EvalSetting.parse(c.label) == c
