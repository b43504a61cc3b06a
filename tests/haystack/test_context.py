"""Context building: lengths, sentence-boundary insertion, exact answer spans, validation of needle files."""

from __future__ import annotations

import json
import re

import pytest
from conftest import _tiny_tokenizer

from headprobe import HeadprobeError, load_haystack, load_needles
from headprobe.errors import FileFormatError
from headprobe.haystack.context import build_context, chars_to_tokens, common_prefix_length
from headprobe.haystack.corpus import Haystack
from headprobe.haystack.needles import Needle, shipped_needle_file
from headprobe.haystack.tasks import load_tasks

DEPTHS = [i / 10 for i in range(11)]


@pytest.fixture(scope="module")
def tok():
    return _tiny_tokenizer()


def test_shipped_needle_sets_validate():
    retrieval = load_needles(shipped_needle_file("retrieval"))
    reasoning = load_needles(shipped_needle_file("reasoning"))
    assert len(retrieval) >= 6 and len(reasoning) >= 6
    assert all(n.kind == "reasoning" and n.answer == n.candidates[1] for n in reasoning)
    corpus = load_haystack().text.lower()
    for n in retrieval + reasoning:
        assert n.answer.lower() not in corpus, f"{n.id}: answer occurs in the haystack"


def test_shipped_tasks_cover_four_types():
    tasks = load_tasks()
    assert len(tasks) >= 4 and all(len(v) >= 5 for v in tasks.values())
    code = tasks.get("code")
    assert code and all("def " in s.context for s in code)


@pytest.mark.parametrize("depth", DEPTHS)
def test_answer_span_exact_at_every_depth(tok, depth):
    hay = load_haystack()
    needle = load_needles(shipped_needle_file("retrieval"))[0]
    ctx = build_context(tok, hay, needle, 900, depth, chat_template=False)
    assert ctx.text[ctx.answer_chars[0]:ctx.answer_chars[1]] == needle.answer
    span_text = tok.decode(ctx.input_ids[ctx.answer_span[0]:ctx.answer_span[1]])
    assert needle.answer in span_text
    # the span is minimal: dropping its first or last token loses part of the answer
    assert needle.answer not in tok.decode(ctx.input_ids[ctx.answer_span[0] + 1:ctx.answer_span[1]])
    assert needle.answer not in tok.decode(ctx.input_ids[ctx.answer_span[0]:ctx.answer_span[1] - 1])
    assert 900 - 150 <= ctx.length <= 900  # cut on a sentence boundary: within one sentence of the target
    # the needle starts a sentence: start of text or after sentence-ending punctuation and a space
    start = ctx.text.index(needle.needle)
    assert start == 0 or re.search(r"[.!?][\"')\]]*\s$", ctx.text[:start])


def test_depth_orders_needle_position(tok):
    hay = load_haystack()
    needle = load_needles(shipped_needle_file("retrieval"))[1]
    starts = [build_context(tok, hay, needle, 900, d, chat_template=False).answer_span[0] for d in DEPTHS]
    assert starts == sorted(starts)
    assert starts[0] < 40 and starts[-1] > 700


def test_deterministic(tok):
    hay = load_haystack()
    needle = load_needles(shipped_needle_file("reasoning"))[0]
    a = build_context(tok, hay, needle, 700, 0.37)
    b = build_context(tok, hay, needle, 700, 0.37)
    assert a == b


def test_span_when_tokens_merge_across_boundaries(tok):
    # The answer is part of a longer word: the token that carries it also carries neighbouring text.
    needle = Needle("m1", "retrieval", "The code word is bluetulipseven today.", "What?", "tulip")
    hay = Haystack("h", "One sentence here. Another sentence follows. " * 200)
    ctx = build_context(tok, hay, needle, 300, 0.5, chat_template=False)
    assert "tulip" in tok.decode(ctx.input_ids[ctx.answer_span[0]:ctx.answer_span[1]])
    # hand-made offsets: a token straddling the start and one straddling the end are both included
    offsets = [(0, 0), (0, 3), (3, 8), (8, 10), (10, 12)]
    assert chars_to_tokens(offsets, 5, 9) == (2, 4)
    assert chars_to_tokens(offsets, 3, 8) == (2, 3)
    with pytest.raises(ValueError):
        chars_to_tokens(offsets, 12, 13)


def test_prefix_shared_with_plain_haystack(tok):
    hay = load_haystack()
    needle = load_needles(shipped_needle_file("retrieval"))[2]
    base = build_context(tok, hay, None, 900, 0.0, chat_template=False)
    ctx = build_context(tok, hay, needle, 900, 0.5, chat_template=False)
    shared = common_prefix_length(base.input_ids, ctx.input_ids)
    assert ctx.needle_span[0] - 2 <= shared <= ctx.needle_span[0] + 1


def test_length_errors(tok):
    hay = Haystack("short", "Only a few words here. Not enough.")
    needle = load_needles(shipped_needle_file("retrieval"))[0]
    with pytest.raises(HeadprobeError, match="too short"):
        build_context(tok, hay, needle, 2000, 0.5, chat_template=False)
    with pytest.raises(HeadprobeError, match="beyond the model's context"):
        build_context(tok, load_haystack(), needle, 5000, 0.5, max_context=4096)


def _write(tmp_path, rows):
    path = tmp_path / "needles.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_needle_file_errors(tmp_path):
    good = {"id": "a", "kind": "retrieval", "needle": "The key is red.", "question": "Key?", "answer": "red"}
    with pytest.raises(FileFormatError, match=r"needles.jsonl:1: field 'answer'.*does not occur"):
        load_needles(_write(tmp_path, [{**good, "answer": "blue"}]))
    with pytest.raises(FileFormatError, match=r"field 'question': missing"):
        load_needles(_write(tmp_path, [{k: v for k, v in good.items() if k != "question"}]))
    with pytest.raises(FileFormatError, match=r":2: field 'id': duplicate"):
        load_needles(_write(tmp_path, [good, good]))
    bad_r = {**good, "kind": "reasoning", "candidates": ["red", "green"]}
    with pytest.raises(FileFormatError, match="second candidate"):
        load_needles(_write(tmp_path, [bad_r]))
    assert load_needles(_write(tmp_path, [good]))[0].answer_offset == 11
