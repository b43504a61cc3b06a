"""A user's examples file read by ``profile --contexts`` and ``eval``/``tune --task dataset``: one reader,
one set of roles, one split rule, and every bad file refused in one line before the model loads."""

from __future__ import annotations

import json

import pytest
from headprobe_cli.main import main

import headprobe
from headprobe.models import loading

ROWS = [{"key": "k1", "doc": "Ana keeps her bicycle in the red shed behind the school.", "q": "Where is the bicycle?",
         "a": "the red shed"},
        {"key": "k2", "doc": "The meeting moved from Tuesday to Thursday at noon.", "q": "When is the meeting?",
         "a": "Thursday at noon"}]
FIELDS = "context=doc,question=q,answer=a,id=key"


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _argv(command, data, tiny_dir, tmp_path, extra=()):
    """The command reading ``data``; ``--fields`` and ``--split`` as given in ``extra``."""
    if command == "profile":
        return ["profile", "--model", str(tiny_dir), "--contexts", str(data), "--out-dir", str(tmp_path / "out"),
                *extra]
    return [command, "--model", str(tiny_dir), "--task", "dataset", "--dataset", str(data),
            "--out", str(tmp_path / "out" / "r.json"), *extra]


def _run(argv, monkeypatch, capsys):
    """``(status, the one error line)``; the model never loads (a run that read its data stops there)."""
    def load_model(*args, **kwargs):
        raise headprobe.HeadprobeError("the data was read; the model would load now")

    monkeypatch.setattr(loading, "load_model", load_model)
    status = main(argv)
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("headprobe: error:")]
    assert len(err) == 1, err
    return status, err[0]


COMMANDS = ["profile", "eval", "tune"]
READ = "the data was read; the model would load now"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
def test_a_file_that_is_not_utf8_is_one_line_with_the_byte(command, suffix, tiny_dir, tmp_path, monkeypatch, capsys):
    first = b"doc,q,a\nThe shed is red.,Which shed?,red\n" if suffix == "csv" else \
        b'{"doc": "The shed is red.", "q": "Which shed?", "a": "red"}\n'
    data = tmp_path / f"latin1.{suffix}"
    data.write_bytes(first + (b"Caf\xe9 by the river.,Where?,river\n" if suffix == "csv" else
                              b'{"doc": "Caf\xe9 by the river.", "q": "Where?", "a": "river"}\n'))
    byte = len(first) + (3 if suffix == "csv" else 12)
    status, line = _run(_argv(command, data, tiny_dir, tmp_path, ["--fields", "context=doc,question=q,answer=a"]),
                        monkeypatch, capsys)
    assert status == 2
    assert line == f"headprobe: error: {data}: expected UTF-8 text; byte {byte} (0xe9) is not valid UTF-8"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("name", "text"), [("empty.jsonl", ""), ("blank.jsonl", "\n  \n"), ("list.json", "[]"),
                                            ("header.csv", "context,question,answer\n")])
def test_a_file_without_rows_is_refused_the_same_way(command, name, text, tiny_dir, tmp_path, monkeypatch, capsys):
    data = tmp_path / name
    data.write_text(text)
    status, line = _run(_argv(command, data, tiny_dir, tmp_path), monkeypatch, capsys)
    flag = "--contexts" if command == "profile" else "--dataset"
    assert status == 2 and line == f"headprobe: error: {flag} {data}: no rows"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("fields", [FIELDS, "context=doc,question=q,answers=a,id=key"])
def test_both_commands_take_the_same_roles(command, fields, tiny_dir, tmp_path, monkeypatch, capsys):
    """``answer`` and ``answers`` are one role, ``id`` is a role of both."""
    data = _jsonl(tmp_path / "qa.jsonl", ROWS)
    status, line = _run(_argv(command, data, tiny_dir, tmp_path, ["--fields", fields]), monkeypatch, capsys)
    assert status == 2 and READ in line


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("names", [("context", "question", "answer", "id"), ("context", "input", "answers", "_id")])
def test_both_commands_read_squad_and_longbench_names_by_default(command, names, tiny_dir, tmp_path, monkeypatch,
                                                                 capsys):
    rows = [dict(zip(names, (r["doc"], r["q"], r["a"], r["key"]), strict=True)) for r in ROWS]
    data = _jsonl(tmp_path / "qa.jsonl", rows)
    status, line = _run(_argv(command, data, tiny_dir, tmp_path), monkeypatch, capsys)
    assert status == 2 and READ in line


@pytest.mark.parametrize("command", COMMANDS)
def test_a_role_given_twice_is_refused_naming_both_fields(command, tiny_dir, tmp_path, monkeypatch, capsys):
    data = _jsonl(tmp_path / "qa.jsonl", ROWS)
    for fields, role, names in [("context=doc,question=q,context=q", "context", ("doc", "q")),
                                ("context=doc,question=q,answer=a,answers=key", "answer", ("a", "key"))]:
        status, line = _run(_argv(command, data, tiny_dir, tmp_path, ["--fields", fields]), monkeypatch, capsys)
        assert status == 2
        assert line == (f"headprobe: error: --fields {fields}: role '{role}' given twice, as field '{names[0]}' and "
                        f"as field '{names[1]}'; give each role once")


@pytest.mark.parametrize("command", COMMANDS)
def test_one_split_rule_for_folders(command, tiny_dir, tmp_path, monkeypatch, capsys):
    """A folder's only split is read; of several, the one ``--split`` names; none named, refused listing them."""
    import datasets

    rows = datasets.Dataset.from_list([{"context": r["doc"], "question": r["q"], "answer": r["a"]} for r in ROWS])
    datasets.DatasetDict({"train": rows}).save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": rows, "test": rows}).save_to_disk(str(tmp_path / "two"))
    assert READ in _run(_argv(command, tmp_path / "one", tiny_dir, tmp_path), monkeypatch, capsys)[1]
    assert READ in _run(_argv(command, tmp_path / "two", tiny_dir, tmp_path, ["--split", "test"]),
                        monkeypatch, capsys)[1]
    flag = "--contexts" if command == "profile" else "--dataset"
    status, line = _run(_argv(command, tmp_path / "two", tiny_dir, tmp_path), monkeypatch, capsys)
    assert status == 2
    assert line == (f"headprobe: error: {flag} {tmp_path / 'two'}: holds 2 splits (train, test); pick one with "
                    "--split NAME")
    status, line = _run(_argv(command, tmp_path / "two", tiny_dir, tmp_path, ["--split", "dev"]), monkeypatch, capsys)
    assert line.endswith("no split 'dev' (splits: train, test)")
