"""No flag silently ignored and no figure silently wrong: a flag typed where it does not apply is refused in
one line naming it, before the model loads (the grid flags of the needle probes for a run on the user's own
examples, the flags of another eval or tune task, ``--split`` for a single file, ``tune --resume --force``);
a memory target at a context beyond the model's is refused, and ``explain`` warns about one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from headprobe_cli.main import main

import headprobe
from headprobe.distributed import profile_ranks
from headprobe.models import loading

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"doc": "The river ran past the old mill. The secret code is blue tulip seven.", "q": "Which code?",
         "a": "blue tulip seven"},
        {"doc": "Fishermen waited on the bank while the rain came down.", "q": "Who waited?", "a": "Fishermen"}]


@pytest.fixture
def own(tmp_path):
    path = tmp_path / "own.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


@pytest.fixture
def qa(tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [{"context": r["doc"], "input": r["q"], "answers": [r["a"]]} for r in ROWS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def stop_at_load(monkeypatch):
    """Loading the model (or planning the profile run) ends the command with a known line: whatever is refused
    is refused before it."""
    def stop(*args, **kwargs):
        raise headprobe.HeadprobeError("reached the model")

    monkeypatch.setattr(loading, "load_model", stop)
    monkeypatch.setattr(profile_ranks, "check_profile_run_on_ranks", stop)


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("headprobe: error:")]
    assert len(err) == 1, err
    return err[0]


NEEDLE_GRID = "applies to the retrieval, enhanced_retrieval or retrieval_reasoning probes only"


@pytest.mark.parametrize("probe", ["query_focus", "context_retrieval"])
@pytest.mark.parametrize("extra, message", [
    (["--lengths", "1000"], f"--lengths: {NEEDLE_GRID}"),
    (["--depths", "50"], f"--depths: {NEEDLE_GRID}"),
    (["--needles", "r01"], f"--needles: {NEEDLE_GRID}"),
    (["--seeds", "1"], f"--seeds: {NEEDLE_GRID}"),
    (["--gate", "likelihood"], "--gate: applies to the retrieval_reasoning probe only"),
    (["--haystack", "{own}"], f"--haystack: {NEEDLE_GRID}"),
    (["--grid", "full"], ("--grid: applies to the retrieval, enhanced_retrieval, retrieval_reasoning or "
                          "layer_retention probes only")),
])
def test_needle_grid_flags_are_refused_for_the_probes_of_own_examples(own, tiny_dir, tmp_path, capsys, stop_at_load,
                                                                        probe, extra, message):
    argv = ["profile", "--model", str(tiny_dir), "--contexts", str(own), "--fields", "context=doc,question=q,answer=a",
            "--probe", probe, "--out-dir", str(tmp_path / "out"), *[x.format(own=own) for x in extra]]
    assert message in _error(capsys, argv)


@pytest.mark.parametrize("extra", [[], ["--group-reduction", "max"], ["--until-stable"]])
def test_flags_the_probes_of_own_examples_read_are_accepted(own, tiny_dir, tmp_path, capsys, stop_at_load, extra):
    argv = ["profile", "--model", str(tiny_dir), "--contexts", str(own), "--fields", "context=doc,question=q,answer=a",
            "--probe", "query_focus", "--out-dir", str(tmp_path / "out"), *extra]
    assert "reached the model" in _error(capsys, argv)


def test_batch_size_is_refused_for_query_focus_alone(own, tiny_dir, tmp_path, capsys, stop_at_load):
    argv = ["profile", "--model", str(tiny_dir), "--contexts", str(own), "--fields", "context=doc,question=q,answer=a",
            "--out-dir", str(tmp_path / "out"), "--batch-size", "2", "--probe"]
    assert ("--batch-size: applies to the retrieval, enhanced_retrieval, retrieval_reasoning, context_retrieval or "
            "context_enhanced_retrieval probes only, and none is requested (--probe query_focus)"
            ) in _error(capsys, [*argv, "query_focus"])
    assert "reached the model" in _error(capsys, [*argv, "context_retrieval"])     # it batches its examples


#: The tasks the grid flags apply to, as each command names them (tune has no longgen task).
GRID_TASKS = {"eval": "--task needle, babi or longgen", "tune": "--task needle or babi"}
LENGTHS_TASKS = {"eval": "--task needle, babi, longgen or ruler", "tune": "--task needle, babi or ruler"}


@pytest.mark.parametrize("command", ["eval", "tune"])
@pytest.mark.parametrize("extra, message", [
    (["--task", "dataset", "--dataset", "{qa}", "--lengths", "1000"],
     "--lengths: applies to {lengths} only, not --task dataset"),
    (["--task", "dataset", "--dataset", "{qa}", "--lengths", "1000", "2000"], "--lengths: applies to"),  # the default
    (["--task", "dataset", "--dataset", "{qa}", "--depths", "50"], "--depths: applies to {grid} only, not --task dataset"),
    (["--task", "dataset", "--dataset", "{qa}", "--needle-ids", "r01"],
     "--needle-ids: applies to {needle} only, not --task dataset"),
    (["--task", "dataset", "--dataset", "{qa}", "--haystack", "{qa}"], "--haystack: applies to"),
    (["--task", "babi", "--needle-ids", "r01", "r02"], "--needle-ids: applies to {needle} only, not --task babi"),
    (["--task", "babi", "--needles", "{qa}"], "--needles: applies to {needle} only, not --task babi"),
    (["--task", "needle", "--babi-count", "3"], "--babi-count: applies to --task babi only, not --task needle"),
    (["--lengths", "300", "--max-length", "500"], "--max-length: applies to --task dataset only, not --task needle"),
    (["--lengths", "300", "--split", "train"], "--split: applies to --task dataset only"),
    (["--task", "dataset", "--dataset", "{qa}", "--split", "train"],
     "--split train: chooses a split of a dataset folder or hub dataset; --dataset {qa} is one file"),
])
def test_flags_of_another_task_are_refused(qa, tiny_dir, tmp_path, capsys, stop_at_load, command, extra, message):
    argv = [command, "--model", str(tiny_dir), "--out", str(tmp_path / "out" / "r.json"),
            *[x.format(qa=qa) for x in extra]]
    fill = {"qa": qa, "grid": GRID_TASKS[command], "lengths": LENGTHS_TASKS[command],
            "needle": "--task needle or longgen" if command == "eval" else "--task needle"}
    assert message.format(**fill) in _error(capsys, argv)


@pytest.mark.parametrize("extra", [
    ["--task", "dataset", "--dataset", "{qa}", "--max-length", "300", "--limit", "2",
     "--fields", "context=context,question=input,answers=answers"],
    ["--task", "babi", "--babi-count", "2", "--lengths", "300", "--depths", "50"],
])
def test_flags_of_the_task_are_accepted(qa, tiny_dir, tmp_path, capsys, stop_at_load, extra):
    argv = ["eval", "--model", str(tiny_dir), "--out", str(tmp_path / "out" / "r.json"),
            *[x.format(qa=qa) for x in extra]]
    assert "reached the model" in _error(capsys, argv)


def test_tune_refuses_resume_with_force(tiny_dir, tmp_path, capsys, stop_at_load):
    argv = ["tune", "--model", str(tiny_dir), "--out", str(tmp_path / "t.json"), "--resume", "--force"]
    assert "--resume with --force: choose one" in _error(capsys, argv)


def test_tune_refuses_a_memory_target_beyond_the_model_s_context(tiny_dir, tmp_path, capsys, stop_at_load):
    argv = ["tune", "--model", str(tiny_dir), "--out", str(tmp_path / "t.json"), "--cache-share", "5%",
            "--context", "10000000"]
    assert ("--context 10000000: 10,000,000 prompt tokens + 32 new tokens (--max-new-tokens) exceed tiny's context "
            "of 4,096 tokens; give a context the model can hold") in _error(capsys, argv)
    assert not (tmp_path / "t.json").exists()


def test_explain_warns_about_a_context_beyond_the_model_s(capsys):
    profile = str(ROOT / "profiles" / "smollm2-135m.retrieval.json")
    assert main(["explain", profile, "--context", "100000"]) == 0
    err = capsys.readouterr().err
    assert ("headprobe: warning: --context 100000: 100,000 prompt tokens + 64 new tokens are beyond "
            "HuggingFaceTB/SmolLM2-135M-Instruct's context of 8,192 tokens") in err
    assert main(["explain", profile, "--context", "4000"]) == 0
    assert "warning" not in capsys.readouterr().err
