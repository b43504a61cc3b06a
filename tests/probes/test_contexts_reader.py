"""A user's own examples: read in every format ``datasets`` knows with the same result, field names mapped,
answers located in their context (or counted when they are not), every bad input refused in one line; and
the prompt: the answer's span and the query tokens located exactly, in the needle probes' prompt form."""

from __future__ import annotations

import json

import pytest

from headprobe import HeadprobeError
from headprobe.haystack.context import build_context, question_prompt
from headprobe.haystack.contexts import ContextFields, document_prompt, read_contexts
from headprobe.haystack.corpus import Haystack

ROWS = [
    {"key": "k1", "doc": "Ana keeps her bicycle in the red shed behind the school. The shed is old.",
     "q": "Where is the bicycle?", "a": "the red shed", "start": 25},
    {"key": "k2", "doc": "The meeting moved from Tuesday to Thursday at noon.", "q": "When is the meeting?",
     "a": "Thursday at noon", "start": 34},
    {"key": "k3", "doc": "Bo planted tomatoes and beans this spring.", "q": "What did Bo plant?",
     "a": "pumpkins", "start": 0},
]
FIELDS = "context=doc,question=q,answer=a,id=key"


def write(tmp_path, rows, kind: str):
    import datasets

    ds = datasets.Dataset.from_list(rows)
    path = tmp_path / f"data.{kind}"
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        path.write_text(json.dumps(rows))
    elif kind == "csv":
        ds.to_csv(str(path))
    elif kind == "parquet":
        ds.to_parquet(str(path))
    else:
        path = tmp_path / "folder"
        ds.save_to_disk(str(path))
    return path


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "parquet", "folder"])
def test_every_format_reads_the_same_examples(tmp_path, kind):
    data = read_contexts(write(tmp_path, ROWS, kind), FIELDS)
    reference = read_contexts(write(tmp_path, ROWS, "jsonl"), FIELDS)
    assert data.examples == reference.examples and data.fingerprint == reference.fingerprint
    assert [e.id for e in data.examples] == ["k1", "k2"] and data.not_in_context == ("k3",)
    k1 = data.examples[0]
    assert k1.context[k1.answer_start:k1.answer_end] == "the red shed" == k1.answer
    assert data.rows == 3 and data.to_json()["answer_not_in_context"] == 1
    assert data.to_json()["fields"] == {"context": "doc", "question": "q", "answer": "a", "answer_offset": None,
                                        "id": "key"}


def test_the_fingerprint_follows_the_data_not_the_file(tmp_path):
    a = read_contexts(write(tmp_path, ROWS, "jsonl"), FIELDS)
    changed = [dict(ROWS[0], q="Where is the bike?"), *ROWS[1:]]
    (tmp_path / "b").mkdir()
    b = read_contexts(write(tmp_path / "b", changed, "jsonl"), FIELDS)
    assert a.fingerprint != b.fingerprint and a.fingerprint.startswith("sha256:")


def test_offsets_lists_and_squad_answers(tmp_path):
    twice = "the cat sat on the mat; later the cat slept"
    rows = [{"context": twice, "question": "Which cat?", "answer": "the cat", "at": 30},
            {"context": twice, "question": "What sat?", "answer": ["a dog", "cat sat"], "at": None},
            {"context": twice, "question": "Where?", "answer": {"text": ["the mat"], "answer_start": [15]}, "at": None}]
    path = tmp_path / "x.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = read_contexts(path, "answer_offset=at")
    assert [e.answer_start for e in data.examples] == [30, 4, 15]
    assert [e.answer for e in data.examples] == ["the cat", "cat sat", "the mat"]
    without = read_contexts(path)          # the first occurrence when no offset is named
    assert without.examples[0].answer_start == 0


@pytest.mark.parametrize(("rows", "fields", "message"), [
    ([], None, "no rows"),
    ([{"doc": "x", "q": "y", "a": "z"}], None, ("no field for context='context', question='question', answer='answer' "
     "(fields: doc, q, a); name them with fields")),
    ([{"context": "abc", "question": "q?", "answer": "zz"}], None, "no example's answer occurs in its context"),
    ([{"context": "abc", "question": " ", "answer": "b"}], None, "row 0: field 'question': expected non-empty text"),
    ([{"context": "abc", "question": "q", "answer": ""}], None, "row 0: field 'answer': expected an answer"),
    ([{"context": "abc", "question": "q", "answer": "b", "at": 0}], "answer_offset=at",
     "row 0: field 'at': offset 0 does not point at the answer 'b' (the context there reads 'a')"),
    ([{"context": "abc", "question": "q", "answer": "b", "at": -1}], "answer_offset=at",
     "row 0: field 'at': expected a character offset"),
    ([{"id": 1, "context": "abc", "question": "q", "answer": "b"}] * 2, None, "row 1: id '1' repeats"),
    ([{"context": "abc", "question": "q", "answer": "b"}], "context=doc,question", ("fields='context=doc,question': "
     "expected ROLE=NAME")),
    ([{"context": "abc", "question": "q", "answer": "b"}], "evidence=e", "unknown role 'evidence'"),
])
def test_bad_examples_are_refused_in_one_line(tmp_path, rows, fields, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(HeadprobeError) as exc:
        read_contexts(path, fields)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(HeadprobeError, match=r"contexts='.*nothing.jsonl': no such file or folder"):
        read_contexts(tmp_path / "nothing.jsonl")
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(HeadprobeError, match="expected a .json, .jsonl, .csv or .parquet file"):
        read_contexts(tmp_path / "x.txt")


def test_fields_parse_like_evals_flag():
    assert ContextFields.parse("context=doc, question=q") == ContextFields(context="doc", question="q")
    assert ContextFields.parse({"answer": "gold"}).answer == "gold"
    assert ContextFields.parse(None) == ContextFields()


# ---- the prompt ---------------------------------------------------------------------------------

@pytest.mark.parametrize("chat", [True, False])
def test_the_prompt_locates_the_answer_and_the_query(tiny_llama, tmp_path, chat):
    from tests.conftest import _TINY_TEXT  # noqa: F401  (the tiny tokenizer's text)

    tok = tiny_llama.tokenizer
    if chat:
        tok.chat_template = ("{% for m in messages %}<s>user\n{{ m['content'] }}</s>\n{% endfor %}"
                             "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
    try:
        data = read_contexts(write(tmp_path, ROWS, "jsonl"), FIELDS)
        example = data.examples[0]
        prompt = document_prompt(tok, example, chat)
        ctx = prompt.context
        start, end = ctx.answer_span
        assert tok.decode(ctx.input_ids[start:end]).strip().endswith("red shed")
        assert example.answer in ctx.text[ctx.answer_chars[0]:ctx.answer_chars[1]]
        q0, q1 = ctx.question_span
        assert tok.decode(ctx.input_ids[q0:q1]).strip() == example.question
        assert end <= prompt.query_start <= q0
        # the query is the question part of the prompt form (chat: the question first; plain: the instruction)
        asked = question_prompt(None, example.question, "chat" if chat else "plain")
        assert tok.decode(ctx.input_ids[prompt.query_start:]).lstrip().startswith(asked[:12])
        # the same text as the needle probes' prompt around a haystack that is the whole context
        tail = " More text follows here."
        haystack = Haystack("h", example.context + tail)
        for length in range(len(prompt.input_ids) - 3, len(prompt.input_ids) + 12):
            try:
                built = build_context(tok, haystack, None, length, 0.0, chat, question=example.question)
            except HeadprobeError:
                continue
            if tail.strip() not in built.text and example.context in built.text:
                assert built.text == ctx.text and built.input_ids == ctx.input_ids
                break
        else:
            pytest.fail("no length gave the whole context as the haystack")
    finally:
        tok.chat_template = None
