"""Reading RULER's files as prepare.py writes them, kvpress's split, prompts, ratios and per-task scores."""

from __future__ import annotations

import json

import pytest
from ruler_rows import niah_row, qa_row, write_ruler_dir, write_task

from headprobe import HeadprobeError
from headprobe.eval.result import EvalResult
from headprobe.eval.ruler_data import load_ruler_dir, split_input
from headprobe.eval.ruler_task import RulerTask, ratio_capacities, ruler_prompt_text, ruler_scores


def test_reads_prepare_py_layout_and_splits_back_to_the_input(tmp_path):
    write_ruler_dir(tmp_path)
    examples = load_ruler_dir(tmp_path)
    assert [e.task for e in examples] == ["niah_single_1", "niah_single_1", "vt", "cwe", "qa_1"]   # RULER's order
    rows = {(t, r["index"]): r for t in ("niah_single_1", "vt", "cwe", "qa_1")
            for r in map(json.loads, (tmp_path / t / "validation.jsonl").read_text().splitlines())}
    for ex in examples:
        task, _, index = ex.id.split("/")
        assert ex.context + ex.question + ex.answer_prefix == rows[(task, int(index))]["input"]
        assert list(ex.outputs) == rows[(task, int(index))]["outputs"]
    niah = examples[0]
    assert niah.question == "What is the special magic number for flippant-twine mentioned in the provided text? "
    assert niah.answer_prefix == "The special magic number for flippant-twine mentioned in the provided text is"
    assert "2694522" in niah.context and niah.tokens_to_generate == 128


def test_qa_and_cwe_split_at_the_last_instruction():
    qa = qa_row(0)["input"]
    context, question, prefix = split_input(qa, "qa_1")
    assert "Document 2" in context and context.startswith("Answer the question")   # the first instruction stays
    assert question.startswith("Answer the question based on the given documents.") and "Who won" in question
    assert prefix == "Answer:"


def test_length_folders_limit_and_task_filter(tmp_path):
    write_task(tmp_path / "2048", "niah_single_1", [niah_row(i, f"key-{i}", str(1000000 + i)) for i in range(3)])
    write_task(tmp_path / "1024", "niah_single_1", [niah_row(0, "key-a", "1111111")])
    write_task(tmp_path / "1024", "qa_1", [qa_row(0)])
    examples = load_ruler_dir(tmp_path, ["niah_single_1"], limit=2)
    assert [e.id for e in examples] == ["niah_single_1/1024/0", "niah_single_1/2048/0", "niah_single_1/2048/1"]
    assert {e.length for e in examples} == {1024, 2048}


def test_task_folders_that_are_links_are_read(tmp_path):
    """A dataset assembled from links to task folders written elsewhere (one length, chosen tasks)."""
    write_task(tmp_path / "made" / "2048", "niah_single_1", [niah_row(0, "key-a", "1111111")])
    write_task(tmp_path / "made" / "2048", "qa_1", [qa_row(0)])
    (tmp_path / "chosen" / "2048").mkdir(parents=True)
    (tmp_path / "chosen" / "2048" / "qa_1").symlink_to(tmp_path / "made" / "2048" / "qa_1")
    (tmp_path / "linked").symlink_to(tmp_path / "made" / "2048" / "niah_single_1")
    assert [e.id for e in load_ruler_dir(tmp_path / "chosen")] == ["qa_1/2048/0"]
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "niah_single_1").symlink_to(tmp_path / "linked")
    assert [e.id for e in load_ruler_dir(tmp_path / "one")] == ["niah_single_1/-/0"]


@pytest.mark.parametrize("line, match", [
    ("{not json", "not JSON"),
    (json.dumps({"index": 0, "outputs": ["1"]}), "field 'input'"),
    (json.dumps({"index": 0, "input": "x", "outputs": []}), "field 'outputs'"),
    (json.dumps({"index": 0, "input": "no anchors here", "outputs": ["1"]}), "no niah_single_1 question"),
])
def test_bad_lines_name_file_line_and_field(tmp_path, line, match):
    path = tmp_path / "niah_single_1" / "validation.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps(niah_row(0, "k", "1")) + "\n" + line + "\n")
    with pytest.raises(HeadprobeError, match=f"validation.jsonl:2: .*{match}"):
        load_ruler_dir(tmp_path)


def test_folder_refusals(tmp_path):
    with pytest.raises(HeadprobeError, match="expected a folder"):
        load_ruler_dir(tmp_path / "missing")
    with pytest.raises(HeadprobeError, match="no validation.jsonl for any task"):
        load_ruler_dir(tmp_path)
    write_ruler_dir(tmp_path)
    with pytest.raises(HeadprobeError, match="no validation.jsonl for niah_single_2"):
        load_ruler_dir(tmp_path, ["niah_single_1", "niah_single_2"])
    with pytest.raises(HeadprobeError, match="unknown RULER task"):
        load_ruler_dir(tmp_path, ["niah"])


def test_prompt_puts_the_question_after_the_context(tiny_llama, tmp_path):
    ex = load_ruler_dir(write_ruler_dir(tmp_path))[0]
    tok = tiny_llama.tokenizer
    text, special = ruler_prompt_text(tok, ex, chat_template=True)      # no chat template: the plain form
    assert text == ex.context + ex.question + "\n" + ex.answer_prefix and special
    tok.chat_template = ("{% for m in messages %}<s>user\n{{ m['content'] }}</s>\n{% endfor %}"
                         "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
    text, special = ruler_prompt_text(tok, ex, chat_template=True)
    assert text == f"<s>user\n{ex.context}{ex.question}</s>\n<s>assistant\n{ex.answer_prefix}" and not special
    task = RulerTask({})
    assert task.new_tokens(ex, 32) == 128 and RulerTask({}, max_new_tokens=16).new_tokens(ex, 32) == 16
    with pytest.raises(HeadprobeError, match="beyond the model's context of 100 tokens"):
        task.prompt_ids(tok, ex, 100, True)


def test_ratios_become_one_capacity_per_ratio():
    assert ratio_capacities([1000, 1002, 998], [0.25, 0.5, 0.9]) == {0.25: 750, 0.5: 500, 0.9: 100}
    with pytest.raises(HeadprobeError, match="--ratios 1.0"):
        ratio_capacities([1000], [1.0])


def test_scores_per_task_with_the_full_cache_beside():
    def trial(task, score):
        return {"task": task, "length": 2048, "score": score}

    settings = [{"label": "full", "policy": "full", "capacity": None}, {"label": "snapkv@64", "policy": "snapkv",
                                                                         "capacity": 64}]
    cells = [{"setting": "full", "trials": [trial("niah_single_1", 1.0), trial("niah_single_1", 1.0),
                                            trial("qa_1", 1.0), trial("qa_1", 0.0)]},
             {"setting": "snapkv@64", "trials": [trial("niah_single_1", 1.0), trial("niah_single_1", 0.0),
                                                 trial("qa_1", 0.0), trial("qa_1", 0.0)]}]
    rows = ruler_scores(EvalResult({}, {}, {}, settings, cells))
    snap = {r["task"]: (r["score"], r["full"]) for r in rows if r["setting"] == "snapkv@64"}
    assert snap == {"niah_single_1": (50.0, 100.0), "qa_1": (0.0, 50.0), "average": (25.0, 75.0)}


def test_figure_points_are_rulers_score_per_task_against_the_bytes_held():
    from ruler_result import ruler_result

    from headprobe.eval.ruler_task import ruler_points

    points = {(p["setting"], p["panel"]): p for p in ruler_points(ruler_result())}
    assert len(points) == 5 * 3                       # five settings x (two tasks + the average)
    snap = points[("snapkv@500", "niah_single_1@2048")]
    assert (snap["score"], snap["full_score"], snap["ratio"], snap["kvpress"]) == (100.0, 100.0, 0.5, False)
    assert snap["share"] == pytest.approx(0.51, abs=1e-12)           # (520 + 500) / 2 of 1000 bytes
    assert points[("snapkv@100", "niah_single_1@2048")]["share"] == pytest.approx(0.11, abs=1e-12)
    assert points[("snapkv@100", "qa_1@2048")]["share"] == pytest.approx(0.1, abs=1e-12)
    assert (points[("snapkv@100", "average")]["score"], points[("snapkv@100", "average")]["full_score"]) == (25.0, 75.0)
    assert points[("snapkv@100", "average")]["share"] == pytest.approx(0.105, abs=1e-12)
    press = points[("kvpress:snapkv@500", "qa_1@2048")]
    assert (press["score"], press["share"], press["full_score"], press["kvpress"]) == (50.0, 1.0, 50.0, True)
    assert points[("full", "average")]["ratio"] is None
