"""``headprobe inspect`` tells a profile's trial log, an eval's cell log and an ablation's run log apart (all
three are ``headprobe.trials`` JSONL), and refuses a log that is none of them."""

from __future__ import annotations

import json

import pytest
from headprobe_cli.main import main

import headprobe
from headprobe.eval.cell_log import CellLog, cell_record
from headprobe.files.trial_log import TrialLog

TRIAL = {"score": 1.0, "cache_bytes": 1, "used_bytes": 1, "full_cache_bytes": 2, "seconds": 0.1, "new_tokens": 1}


def test_an_eval_cell_log_is_summarised_as_one(tiny_llama, tmp_path, capsys):
    out = tmp_path / "e.json"
    settings = headprobe.expand_settings(["full", "streaming"], [16], {}, tuple(headprobe.POLICIES))
    log_settings = {"lengths": [300], "depths": [0.0, 1.0]}
    with CellLog(tiny_llama, out, {"kind": "needle"}, {"lengths": [300], "depths": [0.0, 1.0]}, settings,
                 log_settings) as log:
        log.add([cell_record(settings[0], 300, 0.0, [TRIAL]), cell_record(settings[1], 300, 0.0, [{**TRIAL,
                                                                                                  "score": 0.0}])])
    assert main(["inspect", str(headprobe.frontend.cell_log_path(out))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("e.cells.jsonl: headprobe eval cell log v1, task needle, 2 settings, 2 of 4 cells finished")
    assert lines[1].startswith(f"model      fingerprint {tiny_llama.identity.fingerprint}")
    assert lines[2:] == ["  setting full: 1 cells; mean accuracy 1.000",
                         "  setting streaming@16: 1 cells; mean accuracy 0.000"]
    assert not any("trial log" in line or "pass None" in line for line in lines)


def test_an_ablation_run_log_is_summarised_as_one(tmp_path, capsys):
    path = tmp_path / "a.runs.jsonl"
    with TrialLog(path, {"model": "f" * 16, "profile": "p" * 16, "ks": [4, 8], "seed": 0}) as log:
        log.append({"trial": "baseline", "heads": [], "accuracy": 1.0})
        log.append({"trial": "top-4", "heads": ["0-1"], "accuracy": 0.5})
    assert main(["inspect", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("a.runs.jsonl: headprobe ablation run log v1, heads masked [4, 8], 2 of 5 runs "
                             "finished (baseline, top-k and random-k)")
    assert lines[2] == "runs       baseline, top-4"


def test_a_log_of_unknown_kind_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"format": "headprobe.trials", "version": 1, "settings": {"a": 1}}) + "\n")
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [(f"headprobe: error: {path}: field 'settings': expected the header of a profile's trial log (with "
                    "'pass'), an eval's cell log (with 'task' and 'settings') or an ablation's run log (with "
                    "'profile' and 'ks')")]


@pytest.mark.parametrize("pass_name", ["retrieval", "layer_retention"])
def test_a_profile_trial_log_is_still_a_trial_log(tmp_path, capsys, pass_name):
    import conftest

    path = tmp_path / "t.trials.jsonl"
    with TrialLog(path, {"pass": pass_name, "mode": "fast", "model": conftest.make_tiny_llama().identity.to_json()}):
        pass
    assert main(["inspect", str(path)]) == 0
    assert f"headprobe trial log v1, pass {pass_name}, mode fast, 0 trials" in capsys.readouterr().out


def test_inspect_checks_every_record_of_a_trial_log_as_a_merge_does(tmp_path, capsys):
    import conftest
    from test_output_files import needle_settings, record

    from headprobe.probes.trial_grid import make_grid

    identity = conftest.make_tiny_llama().identity
    path = tmp_path / "t.trials.jsonl"
    with TrialLog(path, needle_settings(identity)) as log:
        for spec in make_grid(["r01"], [300], [0.0, 1.0], [0]):
            log.append(record(spec))
    assert main(["inspect", str(path)]) == 0
    capsys.readouterr()
    lines = path.read_text().splitlines()
    bad = json.loads(lines[2])
    bad["scores"]["retrieval"][1][2] = -0.5
    path.write_text("\n".join([*lines[:2], json.dumps(bad)]) + "\n")
    assert main(["inspect", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"headprobe: error: {path}:3: field 'scores.retrieval[1][2]': expected a finite number >= 0, found -0.5"]
