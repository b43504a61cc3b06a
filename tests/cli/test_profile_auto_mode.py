"""``--mode auto`` (the default): reuse mode at a 0% share on a CPU, fast mode where a fast-mode flag is typed
or a pass does not run in reuse mode; the log records the mode run, and auto matches an explicit run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from headprobe_cli.main import main

import headprobe
from headprobe.probes.modes import auto_mode


def _argv(model: Path, out: Path, *extra: str) -> list[str]:
    return ["profile", "--model", str(model), "--device", "cpu", "--probe", "retrieval", "--lengths", "300",
            "--depths", "0", "100", "--needles", "r01", "--no-chat-template", "--out-dir", str(out), *extra]


def _settings(out: Path) -> dict:
    return json.loads((out / "tiny.retrieval.trials.jsonl").read_text().splitlines()[0])["settings"]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "tiny.retrieval.trials.jsonl").read_text().splitlines()[1:]]


def test_auto_runs_reuse_mode_at_zero_on_a_cpu_exactly_as_asked_for(tiny_dir, tmp_path, capsys):
    main(_argv(tiny_dir, tmp_path / "auto"))                   # the random model passes no gate: rc 2, logs kept
    assert "reuse mode, recompute share 0%, chosen by --mode auto" in capsys.readouterr().err
    settings = _settings(tmp_path / "auto")
    assert settings["mode"] == "reuse" and settings["recompute_share"] == 0.0
    main(_argv(tiny_dir, tmp_path / "asked", "--mode", "reuse", "--recompute-share", "0"))
    asked = _records(tmp_path / "asked")
    assert [r["scores"] for r in _records(tmp_path / "auto")] == [r["scores"] for r in asked]
    # the default run's log resumes under the default (nothing run again); a log made in fast mode does not
    main(_argv(tiny_dir, tmp_path / "auto", "--resume"))
    assert "0 trials run, 2 resumed from logs" in capsys.readouterr().err
    main(_argv(tiny_dir, tmp_path / "fast", "--mode", "fast"))
    assert main(_argv(tiny_dir, tmp_path / "fast", "--resume")) == 2
    assert "made with other settings" in capsys.readouterr().err


def test_a_fast_mode_flag_or_a_share_chooses_its_mode(tiny_dir, tmp_path, capsys):
    main(_argv(tiny_dir, tmp_path / "b", "--batch-size", "2"))
    assert _settings(tmp_path / "b")["mode"] == "fast"
    main(_argv(tiny_dir, tmp_path / "s", "--recompute-share", "25"))
    settings = _settings(tmp_path / "s")
    assert settings["mode"] == "reuse" and settings["recompute_share"] == 0.25
    capsys.readouterr()


@pytest.mark.parametrize("on_cpu, runs_reuse, asked_fast, asked_share, mode", [
    (True, True, False, False, "reuse"), (False, True, False, False, "fast"), (True, False, False, False, "fast"),
    (True, True, True, False, "fast"), (False, True, False, True, "reuse"), (True, False, False, True, "fast"),
])
def test_the_rule(on_cpu, runs_reuse, asked_fast, asked_share, mode):
    assert auto_mode(on_cpu, runs_reuse, asked_fast, asked_share) == mode


def test_the_library_default_stays_exact():
    assert headprobe.ProfileRequest(probes=["retrieval"]).mode == "fast"
