"""kvpress settings (``kvpress:PRESS[OPTIONS]@CAPACITY``) as the eval parses, checks and splits them; running
them needs kvpress (its own environment: tests/library_bridges/test_kvpress_settings_run.py)."""

from __future__ import annotations

import importlib.util

import pytest
from ruler_rows import niah_row, write_task

from headprobe import HeadprobeError
from headprobe.eval.datasets import QAExample, run_dataset_eval
from headprobe.eval.ruler_data import load_ruler_dir
from headprobe.eval.ruler_task import RulerTask
from headprobe.eval.settings import EvalSetting, expand_settings
from headprobe.library_bridges.press_settings import KVPRESS, PRESSES, context_ratio

HAS_KVPRESS = importlib.util.find_spec("kvpress") is not None


def test_a_press_with_a_ratio_runs_at_every_capacity_and_its_label_reads_back():
    settings = expand_settings(["full", "kvpress:snapkv[window_size=16,compress_questions=true]", "kvpress:none",
                                "kvpress:streaming@40"], [100, 50])
    assert [s.label for s in settings] == [
        "full", "kvpress:snapkv[window_size=16,compress_questions=true]@100",
        "kvpress:snapkv[window_size=16,compress_questions=true]@50", "kvpress:none", "kvpress:streaming@40"]
    snap = settings[1]
    assert (snap.policy, snap.profiles, snap.capacity) == (KVPRESS, ("snapkv",), 100)
    assert snap.options == {"window_size": 16, "compress_questions": True}
    for s in settings:
        assert EvalSetting.parse(s.label) == s
        assert EvalSetting.from_json(s.to_json()) == s


def test_presses_without_a_ratio_run_once_like_the_full_cache():
    no_ratio = [name for name, spec in PRESSES.items() if not spec.ratio]
    assert "none" in no_ratio
    for name in no_ratio:
        (s,) = expand_settings([f"kvpress:{name}"], [64, 128])
        assert s.capacity is None
        with pytest.raises(HeadprobeError, match="no capacity to pin"):
            expand_settings([f"kvpress:{name}@64"], [])


@pytest.mark.parametrize("spec, match", [
    ("kvpress:snapkvv", "unknown kvpress press 'snapkvv'; expected one of none, snapkv"),
    ("kvpress", "expected kvpress:PRESS, PRESS one of none, snapkv"),
    ("kvpress:snapkv:retrieval", "expected kvpress:PRESS"),
])
def test_bad_press_names_are_refused_in_one_line(spec, match):
    with pytest.raises(HeadprobeError, match=match) as err:
        expand_settings([spec], [64])
    assert "\n" not in str(err.value)


@pytest.mark.skipif(HAS_KVPRESS, reason="kvpress is installed here")
def test_without_kvpress_the_setting_is_refused_before_any_model_loads():
    (s,) = expand_settings(["kvpress:snapkv"], [64])
    with pytest.raises(HeadprobeError, match=r'kvpress settings need kvpress: pip install "headprobe\[kvpress\]"'):
        s.check_policy()


@pytest.mark.parametrize("context", [1, 2, 7, 100, 1869, 4093, 8191, 32_000])
def test_the_ratio_keeps_exactly_the_capacity_less_the_question(context):
    """kvpress keeps ``max(1, int(context * (1 - ratio)))`` context tokens (kvpress.utils.compute_n_kept):
    the ratio passed leaves ``capacity - question`` of them, for every size of context."""
    question = 5
    for keep in sorted({1, 2, context // 3, context // 2, context - 1, context} & set(range(1, context + 1))):
        ratio = context_ratio(keep + question, context, question)
        assert 0 <= ratio < 1
        assert max(1, int(context * (1 - ratio))) == keep
    assert context_ratio(context + question + 10, context, question) == 0.0       # nothing to remove
    with pytest.raises(HeadprobeError, match="leaves no context token"):
        context_ratio(question, context, question)


@pytest.mark.parametrize("chat", [False, True])
def test_ruler_question_span_marks_the_question_in_the_prompt_tokens(tiny_llama, tmp_path, chat):
    tok = tiny_llama.tokenizer
    if chat:
        tok.chat_template = ("{% for m in messages %}<s>user\n{{ m['content'] }}</s>\n{% endfor %}"
                             "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
    write_task(tmp_path, "niah_single_1", [niah_row(0, "quiet-harbour", "4817293", repeats=8)])
    (ex,) = load_ruler_dir(tmp_path)
    task = RulerTask({})
    ids = task.prompt_ids(tok, ex, 10_000, chat)
    start, end = task.question_span(tok, ex, ids, chat)
    assert 0 < start < end < len(ids)
    question = tok.decode(ids[start:end])
    assert "What is the special magic number for quiet-harbour" in question
    assert ex.answer_prefix not in question and "4817293" not in question
    assert "4817293" in tok.decode(ids[:start])
    assert ex.answer_prefix.strip() in tok.decode(ids[end:])


def test_a_task_that_does_not_mark_its_question_refuses_kvpress_settings(tiny_llama, tmp_path):
    settings = expand_settings(["kvpress:snapkv"], [16])
    rows = [QAExample("q0", "The harbour code is 4817. " * 10, "What is the harbour code?", ("4817",))]
    with pytest.raises(HeadprobeError, match="kvpress settings run where the prompt's question is known"):
        run_dataset_eval(tiny_llama, rows, settings, tmp_path / "out.json", max_length=400)
    assert not (tmp_path / "out.json").exists()
