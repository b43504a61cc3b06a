"""The one reader of a user's examples (:mod:`headprobe.haystack.qa_data`): both commands' readers give the
same rows, the roles parse one way, and a file that is not UTF-8 is refused at the byte where it stops
being UTF-8, however the file is read in chunks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from headprobe import HeadprobeError
from headprobe.errors import FileFormatError
from headprobe.eval.datasets import load_qa_dataset
from headprobe.haystack import qa_data
from headprobe.haystack.contexts import ContextFields, read_contexts

ROWS = [{"_id": "x1", "context": "The code of the vault is 4817.", "input": "What is the code?", "answers": ["4817"]},
        {"_id": "x2", "context": "Mia moved to Lyon in May.", "input": "Where did Mia move?",
         "answers": {"text": ["Lyon"], "answer_start": [13]}}]


def test_both_commands_read_the_same_rows(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    examples = load_qa_dataset(path)
    data = read_contexts(path)
    assert [e.id for e in examples] == [e.id for e in data.examples] == ["x1", "x2"]
    assert [e.answers for e in examples] == [("4817",), ("Lyon",)]       # SQuAD's answers read as texts
    assert [e.answer_start for e in data.examples] == [25, 13]
    assert data.fields.to_json() == {"context": "context", "question": "input", "answer": "answers",
                                     "answer_offset": None, "id": None}   # the fields read, recorded


def test_the_older_eval_field_arguments_still_read(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    old = load_qa_dataset(path, None, "context", "input", "answers")
    assert [e.question for e in old] == [r["input"] for r in ROWS]
    with pytest.raises(HeadprobeError, match="either as fields or as context_field"):
        load_qa_dataset(path, context_field="context", fields="question=input")


@pytest.mark.parametrize(("given", "message"), [
    ("answers=a,answer=b", "role 'answer' given twice, as field 'a' and as field 'b'"),
    ({"answer": "a", "answers": "b"}, "role 'answer' given twice, as field 'a' and as field 'b'"),
    ("id=k,question=q,id=j", "role 'id' given twice, as field 'k' and as field 'j'"),
])
def test_a_role_given_twice_is_refused(given, message):
    with pytest.raises(HeadprobeError, match=message):
        ContextFields.parse(given)
    assert ContextFields.parse("answers=gold,id=key") == ContextFields(answer="gold", id="key")


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 1 << 20])
def test_the_byte_offset_is_the_files_whatever_the_chunks(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(qa_data, "_CHUNK", chunk)
    good = '{"context": "naïve café — ok", "question": "q", "answer": "ok"}\n'.encode()
    path = tmp_path / "x.jsonl"
    path.write_bytes(good + b'{"context": "caf\xe9"}\n')
    with pytest.raises(FileFormatError) as exc:
        qa_data.utf8_text_has_content(path)
    assert str(exc.value) == f"{path}: expected UTF-8 text; byte {len(good) + 16} (0xe9) is not valid UTF-8"
    path.write_bytes(good + "é".encode()[:1])                   # cut inside a character at the end
    with pytest.raises(FileFormatError, match=f"byte {len(good)} \\(0xc3\\)"):
        qa_data.utf8_text_has_content(path)
    path.write_bytes(good)
    assert qa_data.utf8_text_has_content(path)


def test_the_haystack_reader_does_not_import_eval(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    code = ("import sys; from headprobe.haystack.contexts import read_contexts; read_contexts(sys.argv[1]); "
            "print(sorted(m for m in sys.modules if m.startswith('headprobe.eval')))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_split_messages_spell_the_library_parameter():
    datasets = pytest.importorskip("datasets")
    one = datasets.Dataset.from_list(ROWS[:1])
    with pytest.raises(HeadprobeError, match=r"holds 2 splits \(a, b\); pick one with split='NAME'"):
        qa_data.read_rows(datasets.DatasetDict({"a": one, "b": one}))
    assert qa_data.read_rows(datasets.DatasetDict({"a": one})).rows[0].id == "x1"
