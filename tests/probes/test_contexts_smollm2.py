"""SmolLM2-135M-Instruct on its own kind of data: a fact stated inside a real corpus document (no haystack built
around it), asked for. The model answers, and both modes record that answer and count the same examples
(fast mode decodes the response too), the answer's span is scored, and the question tokens of some heads
attend to the evidence more than a content-free query's do, the same in every mode."""

from __future__ import annotations

import json

import pytest

from headprobe import Profile, ProfileRequest, run_profile
from headprobe.paths import haystacks_dir

pytestmark = pytest.mark.slow

FACT = "The magic phrase that opens the old observatory door is periwinkle thunder."


@pytest.fixture
def own(tmp_path):
    text = (haystacks_dir() / "corpus" / "13_the_last_ferry.txt").read_text()
    paragraphs = [p for p in text.split("\n\n") if len(p) > 200][:4]
    rows = [{"id": f"p{i}", "context": "\n\n".join(paragraphs[:i] + [FACT] + paragraphs[i:]),
             "question": "What is the magic phrase that opens the old observatory door?",
             "answer": "periwinkle thunder"} for i in (0, 2, 4)]
    path = tmp_path / "own.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_smollm2_answers_and_its_heads_are_scored(smollm2, own, tmp_path):
    profiles = {}
    for mode in ("fast", "reference"):
        request = ProfileRequest(probes=["context_retrieval", "query_focus"], out_dir=tmp_path / mode, mode=mode,
                                 options={"contexts": {"file": own}, "query_focus": {"file": own}})
        result = run_profile(smollm2, request)
        profiles[mode] = {p.name.split(".")[1]: Profile.load(p) for p in result.profiles}
        records = [json.loads(x) for x in (tmp_path / mode / "smollm2-135m.contexts.trials.jsonl").read_text()
                   .splitlines()[1:]]
        profiles[mode]["passed"] = {r["trial"] for r in records if r["passed"]}
    reference = profiles["reference"]["context_retrieval"]
    assert reference.trials["passed"] == 3 and reference.top_heads(1)[0][2] > 0.5      # it answers every time
    assert profiles["fast"]["passed"] == profiles["reference"]["passed"]
    focus = profiles["fast"]["query_focus"]
    assert focus.query_heads == profiles["reference"]["query_focus"].query_heads     # one forward, any mode
    assert focus.top_heads(1)[0][2] > 0 and focus.trials["clipped_heads"] < 30 * 9
