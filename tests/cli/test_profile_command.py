"""The profile and inspect commands: one-line errors, Ctrl-C keeps the log, --resume finishes the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
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

    lm = conftest.make_tiny_llama()
    lm.model.save_pretrained(tmp_path / "tiny")
    lm.tokenizer.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def _log_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_lengths_beyond_context(tiny_model_dir, capsys, tmp_path):
    assert main(["profile", "--model", str(tiny_model_dir), "--lengths", "9000", "--out-dir", str(tmp_path / "o"),
                 "--probe", "retrieval", "--device", "cpu"]) == 2
    assert "beyond the model's context of 4096 tokens" in capsys.readouterr().err


def test_ctrl_c_keeps_the_log_and_resume_finishes(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    depths = [str(d) for d in range(0, 101, 5)]
    cmd = [sys.executable, "-m", "headprobe_cli.main", "profile", "--model", str(tiny_model_dir), "--device", "cpu",
           "--probe", "retrieval", "--lengths", "300", "--depths", *depths, "--batch-size", "1",
           "--no-chat-template", "--out-dir", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}
    # A run started in the background inherits an ignored SIGINT; a user's terminal delivers it.
    restore = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=restore)
    log = out / "tiny.retrieval.trials.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= 4:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "--resume" in err and "Traceback" not in err
    before = _log_lines(log)
    finished = [r["trial"] for r in before[1:]]
    total = 14 * len(depths)
    assert 3 <= len(finished) < total
    # resuming runs only what is missing; the random model passes no gate, which is reported, not hidden
    proc = subprocess.run(cmd + ["--resume"], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 2 and "none of the" in proc.stderr
    after = _log_lines(log)
    ids = [r["trial"] for r in after[1:]]
    assert len(ids) == total == len(set(ids))
    assert ids[:len(finished)] == finished
    assert f"{total - len(finished)} trials run, {len(finished)} resumed" in proc.stderr
    assert not (out / "tiny.retrieval.json").exists()
