"""Every file a run writes records its prompt form (``prompt_format``), and a run is neither resumed nor merged
across forms; logs made before the form was recorded are not resumed."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import QA_ROWS, make_tiny_llama, write_random_profile

import headprobe
from headprobe import HeadprobeError
from headprobe.eval.cell_log import cell_log_path
from headprobe.eval.datasets import run_dataset_eval
from headprobe.eval.result import EvalResult
from headprobe.eval.runner import EvalRequest, run_eval
from headprobe.eval.settings import expand_settings
from headprobe.files.trial_log import read_log
from headprobe.probes.aggregate import profiles_from_log
from headprobe.probes.run import ProfileRequest, merge_profile_logs, run_profile

torch.set_num_threads(1)

CHAT_TEMPLATE = ("{% for m in messages %}<s>user: {{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant:{% endif %}")


def _chat_llama():
    lm = make_tiny_llama()
    lm.tokenizer.chat_template = CHAT_TEMPLATE
    return lm


def _profile_request(out, **kw):
    return ProfileRequest(probes=["retrieval"], lengths=[300], depths=[0.0, 1.0], needle_ids=["r01"], out_dir=out,
                          max_new_tokens=2, batch_size=2, name="tiny", **kw)


def _rewrite_header(path, change):
    lines = path.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    change(header["settings"])
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))


def test_profile_logs_and_profiles_record_the_form_and_refuse_another(tmp_path):
    run_profile(make_tiny_llama(), _profile_request(tmp_path))        # a random model: no trial passes
    log = tmp_path / "tiny.retrieval.trials.jsonl"
    settings, records = read_log(log)
    assert settings["prompt_format"] == "plain" and settings["chat_template"] is True
    assert all(r["response"] is not None for r in records)
    passed = [{**r, "gates": {**r["gates"], "published": True}} for r in records]
    assert {p.probe["prompt_format"] for p in profiles_from_log(settings, passed)} == {"plain"}
    with pytest.raises(HeadprobeError, match=r"cannot resume, the log was made with other settings \(prompt_format\)"):
        run_profile(_chat_llama(), _profile_request(tmp_path, resume=True))
    chat = tmp_path / "chat"
    run_profile(_chat_llama(), _profile_request(chat))
    assert read_log(chat / "tiny.retrieval.trials.jsonl")[0]["prompt_format"] == "chat"
    # a log written before the form was recorded was made with the plain prompt without its cue
    _rewrite_header(log, lambda s: s.pop("prompt_format"))
    with pytest.raises(HeadprobeError, match=r"other settings \(prompt_format\)"):
        run_profile(make_tiny_llama(), _profile_request(tmp_path, resume=True))


def test_shards_of_two_forms_do_not_merge(tmp_path):
    run_profile(make_tiny_llama(), _profile_request(tmp_path, shard=(0, 2)))
    run_profile(_chat_llama(), _profile_request(tmp_path, shard=(1, 2)))
    logs = sorted(tmp_path.glob("tiny.retrieval.shard*.trials.jsonl"))
    assert len(logs) == 2
    with pytest.raises(HeadprobeError, match=r"made with other settings than .* \(prompt_format\)"):
        merge_profile_logs(logs, tmp_path / "merged", allow_partial=True)


def _eval_request(lm_haystack, **kw):
    items = headprobe.items_from_needles(headprobe.load_needles(headprobe.shipped_needle_file("retrieval"), ["r01"]))
    return EvalRequest(expand_settings(["full"], [16]), items, [300], [0.5], lm_haystack, {"kind": "needle"}, 2, **kw)


def test_eval_results_record_the_form_and_refuse_to_resume_another(tmp_path):
    hay = headprobe.load_haystack()
    out = tmp_path / "e.json"
    result = run_eval(make_tiny_llama(), _eval_request(hay), out)
    assert result.extra["prompt_format"] == "plain"
    assert EvalResult.load(out).extra["prompt_format"] == "plain"
    assert json.loads(out.read_text())["prompt_format"] == "plain"
    assert read_log(cell_log_path(out))[0]["prompt_format"] == "plain"
    with pytest.raises(HeadprobeError, match=r"other settings \(prompt_format\)"):
        run_eval(_chat_llama(), _eval_request(hay), out, resume=True)
    chat = run_eval(_chat_llama(), _eval_request(hay), tmp_path / "c.json")
    assert chat.extra["prompt_format"] == "chat"
    assert run_eval(_chat_llama(), _eval_request(hay, chat_template=False), tmp_path / "p.json").extra[
        "prompt_format"] == "plain"


def test_dataset_eval_records_the_form_and_refuses_to_resume_another(tmp_path):
    import datasets

    examples = headprobe.load_qa_dataset(datasets.Dataset.from_dict(QA_ROWS))
    settings = expand_settings(["full"], [16])
    out = tmp_path / "d.json"
    plain = run_dataset_eval(make_tiny_llama(), examples, settings, out, max_length=200, max_new_tokens=2)
    assert plain.extra["prompt_format"] == "plain" and json.loads(out.read_text())["prompt_format"] == "plain"
    # the forms differ, and so does what is scored (the plain form's first line)
    with pytest.raises(HeadprobeError, match=r"other settings \(prompt_format, task\)"):
        run_dataset_eval(_chat_llama(), examples, settings, out, max_length=200, max_new_tokens=2, resume=True)


def test_ablation_results_record_the_form(tmp_path):
    from headprobe.profile import Profile

    lm = make_tiny_llama()
    write_random_profile(lm, "retrieval", tmp_path / "p.json")
    items = headprobe.items_from_needles(headprobe.load_needles(headprobe.shipped_needle_file("retrieval"))[:1])
    args = (Profile.load(tmp_path / "p.json"), [1], items, [300], [0.5], headprobe.load_haystack())
    log = tmp_path / "a.runs.jsonl"
    result = headprobe.run_ablation(lm, *args, max_new_tokens=2, log_path=log)
    assert result["prompt_format"] == "plain" and read_log(log)[0]["prompt_format"] == "plain"
    with pytest.raises(HeadprobeError, match=r"other settings \(prompt_format\)"):
        headprobe.run_ablation(_chat_llama(), *args, max_new_tokens=2, log_path=log, resume=True)


def test_a_plain_dataset_answer_is_scored_on_its_first_line(tmp_path):
    import datasets

    from headprobe.answer_text import qa_f1
    from headprobe.eval.answer_scores import answer_text

    # a base model answers on the cue's line and then writes on (another question, another answer)
    rambling = " The Harlow reservoir\nQuestion: Which of the following is not a health concern?\nAnswer: Lead"
    assert answer_text(rambling, "plain") == "The Harlow reservoir"
    assert answer_text(rambling, "chat") == rambling
    assert qa_f1(answer_text(rambling, "plain"), "the Harlow reservoir") == 1.0
    assert qa_f1(rambling, "the Harlow reservoir") < 0.5

    examples = headprobe.load_qa_dataset(datasets.Dataset.from_dict(QA_ROWS))
    settings = expand_settings(["full"], [16])
    plain = run_dataset_eval(make_tiny_llama(), examples, settings, tmp_path / "d.json", max_length=200,
                             max_new_tokens=6)
    assert plain.task["scored"] == "first line"
    trials = plain.cells[0]["trials"]
    assert [t["score"] for t in trials] == [max(qa_f1(answer_text(t["response"], "plain"), g) for g in t["gold"])
                                            for t in trials]
    chat = run_dataset_eval(_chat_llama(), examples, settings, tmp_path / "c.json", max_length=200,
                            max_new_tokens=6)
    assert "scored" not in chat.task
    assert [t["score"] for t in chat.cells[0]["trials"]] == [
        max(qa_f1(t["response"], g) for g in t["gold"]) for t in chat.cells[0]["trials"]]
