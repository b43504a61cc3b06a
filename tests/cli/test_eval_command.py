"""Outside QA datasets through ``datasets`` and the ``eval`` / ``ablate`` commands on a tiny local model."""

import json

import pytest
import torch
from conftest import QA_ROWS
from headprobe_cli.main import main

from headprobe import HeadprobeError
from headprobe.eval.datasets import load_qa_dataset, run_dataset_eval
from headprobe.eval.result import EvalResult
from headprobe.eval.settings import expand_settings

torch.set_num_threads(1)

ROWS = QA_ROWS


def _dataset():
    import datasets

    return datasets.Dataset.from_dict(ROWS)


def test_load_from_dataset_file_and_folder(tmp_path):
    ds = _dataset()
    path = tmp_path / "qa.jsonl"
    ds.to_json(str(path))
    from_file = load_qa_dataset(path)
    ds.save_to_disk(str(tmp_path / "qa_dir"))
    from_dir = load_qa_dataset(tmp_path / "qa_dir")
    assert [e.answers for e in from_file] == [("red",), ("at four", "four")] == [e.answers for e in from_dir]
    assert load_qa_dataset(ds, limit=1)[0].id == "q1"


def test_missing_fields_name_what_exists(tmp_path):
    with pytest.raises(HeadprobeError, match="no field for question='question'.*fields: context, input, answers"):
        load_qa_dataset(_dataset(), question_field="question")
    (tmp_path / "bad.txt").write_text("x")
    with pytest.raises(HeadprobeError, match="expected a .json"):
        load_qa_dataset(tmp_path / "bad.txt")


def test_dataset_eval_on_tiny_model(tiny_llama, tmp_path):
    settings = expand_settings(["full", "snapkv[window=8]"], [16])
    out = tmp_path / "ds.json"
    result = run_dataset_eval(tiny_llama, load_qa_dataset(_dataset()), settings, out, max_length=200,
                              max_new_tokens=3, chat_template=False)
    loaded = EvalResult.load(out)
    assert loaded.task["kind"] == "dataset" and loaded.task["scorer"] == "f1"
    assert len(result.cells) == 2 and all(c["n"] == 2 for c in result.cells)
    assert all(t["prompt_len"] <= 200 for c in result.cells for t in c["trials"])   # cut in the middle


def test_eval_command_writes_result_and_plot_and_resumes(tiny_dir, tmp_path, capsys):
    out = tmp_path / "e.json"
    argv = ["eval", "--model", str(tiny_dir), "--settings", "full", "streaming", "--capacities", "16",
            "--lengths", "300", "--depths", "0", "100", "--needle-ids", "r01", "--max-new-tokens", "2",
            "--no-chat-template", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "streaming@16" in text and "wrote" in text
    assert json.loads(out.read_text())["complete"] and out.with_suffix(".png").exists()
    assert main(argv) == 2                                     # existing cell log: one-line error
    assert "--resume" in capsys.readouterr().err
    assert main(argv + ["--resume"]) == 0                      # nothing left to do


def test_eval_command_one_line_errors(tiny_dir, tmp_path, capsys):
    bad = tmp_path / "needles.jsonl"
    bad.write_text('{"id": "x", "kind": "retrieval", "needle": "The code is 7.", "question": "Code?", '
                   '"answer": "eight"}\n')
    base = ["eval", "--model", str(tiny_dir), "--out", str(tmp_path / "e.json"), "--no-chat-template"]
    for extra, expect in [(["--needles", str(bad)], "field 'answer'"),
                          (["--settings", "nosuch"], "unknown policy 'nosuch'"),
                          (["--settings", "snapkv", "--option", "nosuch=1"], "nosuch"),
                          (["--settings", "full", "--lengths", "9000"], "beyond the model's context"),
                          (["--settings", "headkv-r2"], "no retrieval_reasoning profile of"),
                          (["--task", "dataset", "--dataset", str(tmp_path / "none.jsonl")], "none.jsonl: no such file or folder")]:
        assert main(base + extra) == 2, extra
        lines = [x for x in capsys.readouterr().err.splitlines() if "headprobe: error:" in x]
        assert len(lines) == 1 and lines[0].startswith("headprobe: error:") and expect in lines[0], lines


def test_babi_and_ablate_commands(tiny_dir, tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["eval", "--model", str(tiny_dir), "--task", "babi", "--babi-count", "2", "--settings", "full",
                 "--lengths", "300", "--depths", "50", "--max-new-tokens", "2", "--no-chat-template",
                 "--out", str(out), "--plot", "none"]) == 0
    res = EvalResult.load(out)
    assert res.task["kind"] == "babi" and res.cells[0]["trials"][0]["gold"] in ("kitchen", "garden", "office",
                                                                                 "hallway", "bedroom", "bathroom",
                                                                                 "cellar", "balcony", "yes", "no",
                                                                                 "none", "one", "two", "three")
    capsys.readouterr()
    # ablate needs a head profile of the model: refused in one line when there is none
    assert main(["ablate", "--model", str(tiny_dir), "--lengths", "300", "--out", str(tmp_path / "a.json"),
                 "--no-chat-template"]) == 2
    assert "no retrieval profile" in capsys.readouterr().err


def test_longgen_command_with_per_setting_options(tiny_dir, tmp_path, capsys):
    out = tmp_path / "long.json"
    assert main(["eval", "--model", str(tiny_dir), "--task", "longgen", "--settings", "full", "keepkv[key_merge=zip]",
                 "keepkv[key_merge=convex]", "--capacities", "24", "--lengths", "300", "--depths", "50",
                 "--needle-ids", "r01", "--max-new-tokens", "20", "--no-chat-template", "--out", str(out),
                 "--plot", "none"]) == 0
    res = EvalResult.load(out)
    assert res.task["kind"] == "longgen"
    by = {c["setting"]: c for c in res.cells}
    assert set(by) == {"full", "keepkv[key_merge=zip]@24", "keepkv[key_merge=convex]@24"}
    assert by["full"]["accuracy"] == 1.0
    assert by["keepkv[key_merge=zip]@24"]["trials"][0]["reference"] == by["full"]["trials"][0]["response"]
    assert "keepkv[key_merge=zip]@24" in capsys.readouterr().out
