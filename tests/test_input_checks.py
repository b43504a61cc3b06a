"""Library entry points refuse bad inputs with one-line errors that name the file, field or parameter (in
the library's spelling, ``max_new_tokens=0``), before doing any work with them."""

from __future__ import annotations

import json

import pytest

import headprobe
from headprobe import HeadprobeError
from headprobe.budget_map import BudgetMap
from headprobe.files.jsonio import read_json
from headprobe.files.trial_log import read_log
from headprobe.haystack.corpus import load_haystack
from headprobe.haystack.needles import load_needles
from headprobe.limits import MAX_TOKENS
from headprobe.models import registry
from headprobe.models.loading import load_model, resolve_model
from headprobe.profile import Profile
from headprobe.runtime.generate import generate_compressed, make_policy

R2 = headprobe.paths.shipped_profiles_dir() / "smollm2-135m.retrieval_reasoning.json"
PROMPT = "The river ran past the old mill."


def _one_line(call, *names: str, error: type[Exception] = HeadprobeError) -> str:
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    for name in names:
        assert name in message, message
    return message


@pytest.mark.parametrize("reader", [read_json, Profile.load, BudgetMap.load, load_needles, read_log, load_haystack])
def test_non_utf8_files_are_named(tmp_path, reader):
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"name": "caf\xe9"}\n')
    _one_line(lambda: reader(path), "latin1.json", "UTF-8", "byte 13")


@pytest.mark.parametrize("reader", [read_json, Profile.load, BudgetMap.load, load_needles, read_log])
def test_json_nested_too_deeply_is_refused(tmp_path, reader):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    _one_line(lambda: reader(path), "deep.json", "nested too deeply")


@pytest.mark.parametrize("reader", [read_json, load_needles, read_log])
def test_a_folder_is_not_a_file(tmp_path, reader):
    _one_line(lambda: reader(tmp_path), str(tmp_path), "is a folder")


@pytest.mark.parametrize("per_needle, field", [
    (["q01"], "trials.per_needle"),
    ({"q01": 3}, "trials.per_needle.q01"),
    ({"q01": {"total": "3", "passed": 1}}, "trials.per_needle.q01"),
])
def test_profile_trial_counts_of_the_wrong_type(tmp_path, per_needle, field):
    obj = json.loads(R2.read_text())
    obj["trials"]["per_needle"] = per_needle
    path = tmp_path / "p.json"
    path.write_text(json.dumps(obj))
    _one_line(lambda: Profile.load(path), "p.json", f"field '{field}'")
    obj["trials"]["per_needle"] = {"q01": {"total": 3, "passed": 1}}
    path.write_text(json.dumps(obj))
    assert Profile.load(path).trials["per_needle"] == {"q01": {"total": 3, "passed": 1}}


@pytest.mark.parametrize("header, field", [
    ({"format": "headprobe.trials", "version": "1", "settings": {}}, "version"),
    ({"format": "headprobe.trials", "version": True, "settings": {}}, "version"),
    ({"format": "headprobe.trials", "version": 1, "settings": "x"}, "settings"),
    (["headprobe.trials"], "format"),
])
def test_trial_log_headers_of_the_wrong_type(tmp_path, header, field):
    path = tmp_path / "t.trials.jsonl"
    path.write_text(json.dumps(header) + "\n")
    _one_line(lambda: read_log(path), "t.trials.jsonl", f"field '{field}'")


def test_trial_log_lines_of_the_wrong_type(tmp_path):
    path = tmp_path / "t.trials.jsonl"
    path.write_text(json.dumps({"format": "headprobe.trials", "version": 1, "settings": {}}) + "\n[1, 2]\n{}\n")
    _one_line(lambda: read_log(path), "t.trials.jsonl:2", "expected a trial object")


def test_profile_log_settings_are_checked_before_merging(tmp_path):
    from headprobe.probes.aggregate import merge_logs

    path = tmp_path / "t.trials.jsonl"
    path.write_text(json.dumps({"format": "headprobe.trials", "version": 1,
                                "settings": {"pass": "retrieval", "model": "smollm2"}}) + "\n")
    _one_line(lambda: merge_logs([path]), "t.trials.jsonl", "field 'settings.model'")


def test_budgets_beyond_int32_tokens_are_refused(tmp_path):
    obj = headprobe.allocate("headkv", [Profile.load(R2)]).to_json()
    obj["budgets"][3][1] = 10**30
    obj["totals"]["total"] = sum(map(sum, obj["budgets"]))
    path = tmp_path / "b.json"
    path.write_text(json.dumps(obj))
    _one_line(lambda: BudgetMap.load(path), "b.json", "budgets[3][1]", f"at most {MAX_TOKENS}")


@pytest.mark.parametrize("model, names", [
    ("~nonexist/x", ["model='~nonexist/x'", "nonexist"]),
    ("", ["model=''"]),
])
def test_model_names_that_point_nowhere(model, names):
    _one_line(lambda: resolve_model(model), *names)


def test_model_folders_missing_their_parts(tmp_path):
    _one_line(lambda: load_model(str(tmp_path)), "no config.json")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    _one_line(lambda: load_model(str(tmp_path)), "no weights")
    (tmp_path / "model.safetensors").write_bytes(b"")
    _one_line(lambda: load_model(str(tmp_path)), "no tokenizer")


def test_uninstalled_package_and_unknown_alias_are_named_not_blamed_on_the_network(monkeypatch):
    monkeypatch.setitem(registry.MODELS, "ghost-1b", registry.ModelSpec(
        "ghost-1b", "ghost/ghost-1b", gguf_package="headprobe_test_ghost_weights", pip_install="pip install ghost"))
    _one_line(lambda: headprobe.identity_for_model("ghost-1b"), "model='ghost-1b'", "not installed",
              "pip install ghost")
    _one_line(lambda: headprobe.identity_for_model("ghost-1c"), "model='ghost-1c'", "unknown model alias",
              "ghost-1b")


@pytest.mark.parametrize("policy, options, names", [
    ("keepkv", {"kernel_size": 4}, ["policy keepkv: kernel_size 4", "odd"]),
    ("dynamickv", {"kernel_size": 4}, ["policy dynamickv: kernel_size 4", "odd"]),
    ("dynamickv", {"kernel_size": 0}, ["policy dynamickv: kernel_size 0"]),
    ("full", {"window": -5}, ["policy full: window -5"]),
    ("keydiff", {"window": -5}, ["policy keydiff: window -5"]),
    ("streaming", {"window": -1}, ["policy streaming: window -1"]),
])
def test_policy_options_out_of_range(policy, options, names):
    _one_line(lambda: make_policy(policy, **options), *names)
    _one_line(lambda: headprobe.POLICIES[policy](**options), *names)


@pytest.mark.parametrize("kwargs, names", [
    ({"max_new_tokens": 0}, ["max_new_tokens=0"]),
    ({"capacity": 0}, ["capacity=0"]),
    ({"capacity": 10**20}, [f"capacity={10**20}", str(MAX_TOKENS)]),
])
def test_generate_refuses_counts_out_of_range(tiny_llama, kwargs, names):
    _one_line(lambda: generate_compressed(tiny_llama, PROMPT, **kwargs), *names)


def test_generate_with_an_even_kernel_runs_nothing(tiny_llama):
    # an even kernel once failed deep inside the pooling ("shape [1, 9, 31] is invalid")
    _one_line(lambda: generate_compressed(tiny_llama, PROMPT, policy="keepkv", policy_options={"kernel_size": 4},
                                          max_new_tokens=2), "kernel_size 4")


def test_needle_file_names_itself_when_missing(tmp_path):
    _one_line(lambda: load_needles(tmp_path / "none.jsonl"), "none.jsonl", "no such needle file")


def test_counts_are_spelled_as_flags_on_the_command_line():
    with headprobe.frontend.flag_spelling({}):
        _one_line(lambda: headprobe.frontend.check_count("max_new_tokens", -1), "--max-new-tokens -1")
    assert headprobe.frontend.check_count("max_new_tokens", 5) == 5
    _one_line(lambda: headprobe.frontend.check_count("max_new_tokens", True), "max_new_tokens=True")
    _one_line(lambda: headprobe.frontend.check_count("max_new_tokens", 2.0), "max_new_tokens=2.0")


def test_missing_files_keep_their_message(tmp_path):
    assert "no such file" in _one_line(lambda: read_json(tmp_path / "missing.json"))
