"""``headprobe profile --contexts FILE [--fields ...]``: the run on the user's own examples from the command
line, what it prints about examples left out, and every refusal in one line before the model loads."""

from __future__ import annotations

import json

import pytest
from headprobe_cli.main import main

import headprobe
from headprobe import Profile
from headprobe.distributed import profile_ranks
from headprobe.models import loading

ROWS = [{"doc": "The river ran past the old mill. The secret code is blue tulip seven.", "q": "Which code?",
         "a": "blue tulip seven"},
        {"doc": "Fishermen waited on the bank while the rain came down.", "q": "Who waited?", "a": "Fishermen"},
        {"doc": "In the valley the farmers counted their sheep.", "q": "What did they sell?", "a": "wool"}]


@pytest.fixture
def own(tmp_path):
    path = tmp_path / "own.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_the_command_profiles_own_examples_and_reports_those_left_out(own, tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["profile", "--model", str(tiny_dir), "--device", "cpu", "--no-chat-template", "--contexts", str(own),
            "--fields", "context=doc,question=q,answer=a", "--probe", "query_focus", "--out-dir", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "2 of 3 examples used; 1 left out, their answer is not in their context (2)" in captured.err
    assert (f"wrote {out / 'tiny.query_focus.json'} (2/2 trials passed; 1 of 3 rows left out, their answer is not "
            "in their context)") in captured.out
    profile = Profile.load(out / "tiny.query_focus.json")
    assert profile.probe["contexts"]["fields"]["context"] == "doc" and profile.trials["answer_not_in_context"] == 1
    settings = json.loads((out / "tiny.query_focus.trials.jsonl").read_text().splitlines()[0])["settings"]
    assert settings["contexts"]["answer_not_in_context"] == 1 and settings["contexts"]["not_in_context_ids"] == ["2"]
    assert main([*argv, "--resume"]) == 0                      # resumes like a needle run
    assert "0 trials run, 2 resumed" in capsys.readouterr().err


def test_all_means_the_probes_of_own_examples_with_contexts(own, tiny_dir, tmp_path, monkeypatch):
    seen = {}

    def check(request, model_name, ranks):
        seen["probes"] = request.probes
        seen["options"] = {k: dict(v) for k, v in request.options.items()}
        raise headprobe.HeadprobeError("stop here")

    monkeypatch.setattr(profile_ranks, "check_profile_run_on_ranks", check)
    assert main(["profile", "--model", str(tiny_dir), "--contexts", str(own), "--out-dir", str(tmp_path)]) == 2
    assert seen["probes"] == ("context_retrieval", "context_enhanced_retrieval", "query_focus")
    assert seen["options"] == {"contexts": {"file": str(own)}, "query_focus": {"file": str(own)}}
    assert main(["profile", "--model", str(tiny_dir), "--out-dir", str(tmp_path)]) == 2
    assert seen["probes"] == ("retrieval", "enhanced_retrieval", "retrieval_reasoning", "layer_retention")


@pytest.mark.parametrize(("extra", "message"), [
    (["--contexts", "{tmp}/none.jsonl"], "--contexts {tmp}/none.jsonl: no such file or folder"),
    (["--contexts", "{own}", "--fields", "context=text"], ("no field for context='text', question='question', "
                                                          "answer='answer' (fields: doc, q, a); name them with "
                                                          "--fields context=NAME")),
    (["--contexts", "{own}"], "no field for context='context', question='question', answer='answer'"),
    (["--contexts", "{empty}"], "--contexts {empty}: no rows"),
    (["--contexts", "{own}", "--fields", "context=doc,question=q,answer=q"], ("no example's answer occurs in its "
                                                                           "context (3 rows)")),
    (["--contexts", "{own}", "--fields", "context=doc,question"], ("--fields context=doc,question: expected "
                                                                  "ROLE=NAME")),
    (["--fields", "context=doc"], "--fields: names the fields of --contexts FILE, which was not given"),
    (["--probe", "query_focus"], "--probe query_focus: profiles your own examples; give --contexts FILE"),
    (["--probe", "retrieval", "--contexts", "{own}"], "--contexts: none of the probes asked for reads it"),
    (["--probe", "context_retrieval", "--contexts", "{own}", "--mode", "reuse"],
     "--mode reuse: the contexts pass runs in fast or reference mode only"),
])
def test_refusals_come_before_the_model_loads(own, tiny_dir, tmp_path, monkeypatch, capsys, extra, message):
    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(loading, "load_model", load_model)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    fill = {"tmp": str(tmp_path), "own": str(own), "empty": str(empty)}
    argv = ["profile", "--model", str(tiny_dir), "--out-dir", str(tmp_path / "out"),
            *[x.format(**fill) for x in extra]]
    assert main(argv) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("headprobe: error:")]
    assert len(err) == 1 and message.format(**fill) in err[0], err
