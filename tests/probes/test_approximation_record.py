"""A reuse-mode profile names its approximation, and the measured distance from exact only where measured."""

from __future__ import annotations

import json
from pathlib import Path

from headprobe.probes.approximation import MEASURED, approximation_record
from headprobe.probes.outputs import profiles_to_write
from headprobe.profile import Profile

SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _settings(**changes):
    base = {"pass": "reasoning", "mode": "reuse", "recompute_share": 0.0, "model": {"name": SMOL}, "lengths": [1000, 2000],
            "depths": [0.0, 0.5, 1.0], "seeds": [0], "needle_set": {"shipped": True},
            "haystack": {"name": "headprobe-corpus"}}
    return {**base, **changes}


def test_the_measured_default_carries_its_agreement():
    record = approximation_record(_settings(), "retrieval_reasoning")
    assert record["method"] == "reuse mode, recompute share 0%"
    measured = MEASURED[(SMOL, 0.0, (1000, 2000), (0.0, 0.5, 1.0))]["retrieval_reasoning"]
    assert record["measured"] == measured.to_json() and record["measured"]["spearman"] >= 0.95


def test_nothing_is_claimed_for_what_was_not_measured():
    for changes in ({"recompute_share": 0.1}, {"lengths": [1000, 4000]}, {"model": {"name": "other/model"}},
                    {"needle_set": {"shipped": False}}, {"haystack": {"name": "mine"}}):
        record = approximation_record(_settings(**changes), "retrieval")
        assert record["measured"] is None and "not measured" in record["note"]
        assert record["method"].startswith("reuse mode")
    assert approximation_record(_settings(mode="fast"), "retrieval") is None
    # layer retention runs the same exact runner under every mode's name: no approximation to state
    assert approximation_record(_settings(**{"pass": "layer_retention"}), "layer_retention") is None


def test_a_reuse_profile_written_from_a_log_records_it(tmp_path):
    log = Path(__file__).resolve().parents[2] / "profiles" / "smollm2-135m.retrieval.json"
    shipped = json.loads(log.read_text())
    settings = {**{k: v for k, v in shipped["probe"].items() if k != "kind"}, "mode": "reuse", "recompute_share": 0.0}
    records = [{"trial": f"t{i}", "passed": True, "gates": {"published": True}, "seconds": 1.0, "needle": "r01",
                "scores": {"retrieval": shipped["scores"]["query_heads"],
                           "enhanced_retrieval": shipped["scores"]["query_heads"]}} for i in range(2)]
    try:
        planned = profiles_to_write(settings, records, tmp_path, "m")
    except Exception as exc:                         # the record fields the pass needs are its own business
        raise AssertionError(f"the pass refused the records: {exc}") from exc
    for profile, path in planned:
        assert profile.probe["approximation"]["method"] == "reuse mode, recompute share 0%"
        assert Profile.load(profile.save(path)).probe["approximation"] == profile.probe["approximation"]
