"""Fast and reference mode of the ``contexts`` pass on the same examples: the same response (the one the model
produced, never a teacher-forced string), the same gate and the same scores. On a tiny random Llama for the
plumbing, and on SmolLM2 over examples written here, unlike the shipped corpus: a fact placed inside a
paragraph of software documentation, a recipe or a manual."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from headprobe import HeadprobeError, ProfileRequest, run_profile
from headprobe.probes.context_pass import example_batches

#: Own examples: a fact in a paragraph of unrelated prose, a question about it, its answer.
HELD_OUT = [
    {"id": "vault",
     "context": "To install the command-line client, download the archive for your platform and unpack it into a "
                "folder on your PATH. The client reads its settings from a file in your home directory; a "
                "missing file is created with defaults on the first run. The code of the harbour vault is 4817. "
                "Logs are written to the cache folder and rotated once they reach ten megabytes, keeping the "
                "last five files. Proxy settings are taken from the environment unless the settings file "
                "names a proxy of its own.",
     "question": "What is the code of the harbour vault?", "answer": "4817"},
    {"id": "oven",
     "context": "Whisk the eggs with the sugar until the mixture is pale and thick, then fold in the flour in "
                "three parts so that the batter keeps its air. Butter a round tin and dust it with flour. "
                "The oven in the old bakery on Mill Street is always set to 190 degrees. Pour the batter into "
                "the tin, smooth the top and bake until a skewer pushed into the middle comes out clean. Let "
                "the cake cool in the tin for ten minutes before turning it out onto a rack.",
     "question": "What temperature is the oven in the old bakery on Mill Street set to?",
     "answer": "190 degrees"},
    {"id": "mascot",
     "context": "The scheduler assigns each job to the worker with the fewest queued tasks, breaking ties by the "
                "worker's id. A job that fails is retried up to three times with a growing delay between "
                "attempts. The mascot of the scheduler project is a green heron named Pilot. Jobs can be "
                "given a priority from one to nine; higher priorities are taken first, and jobs of equal "
                "priority run in the order they were submitted.",
     "question": "What is the mascot of the scheduler project?", "answer": "a green heron named Pilot"},
    {"id": "password",
     "context": "Before the first use, charge the battery for at least four hours; the indicator turns from "
                "red to green when it is full. Hold the power button for two seconds to switch the device "
                "on. The wireless password of the workshop router is copper lantern. To pair a phone, open "
                "the companion app, choose Add device and follow the steps on the screen. The device "
                "switches itself off after twenty minutes without use.",
     "question": "What is the wireless password of the workshop router?", "answer": "copper lantern"},
    {"id": "meeting",
     "context": "The release branch is cut every second Monday. Each change needs one approving review and a "
                "green build before it can be merged. The quarterly planning meeting takes place in the "
                "Larch Room. Changes that touch the public interface also need an entry in the changelog "
                "and, where behaviour changes, a note in the upgrade guide.",
     "question": "Where does the quarterly planning meeting take place?", "answer": "the Larch Room"},
    {"id": "sauce",
     "context": "Soften the onion in olive oil over a low heat for ten minutes without letting it brown. Add "
                "the garlic and cook for one minute more. The secret ingredient of grandmother's sauce is "
                "smoked paprika. Stir in the tomatoes, season with salt and simmer uncovered for half an "
                "hour, stirring now and then, until the sauce has thickened.",
     "question": "What is the secret ingredient of grandmother's sauce?", "answer": "smoked paprika"},
    {"id": "port",
     "context": "The server listens on all interfaces by default; set the bind address to restrict it to one. "
                "Requests larger than the configured limit are refused with a clear error. The metrics "
                "endpoint of the staging cluster listens on port 9321. Health checks answer on a separate "
                "path and never require authentication, so that load balancers can reach them.",
     "question": "Which port does the metrics endpoint of the staging cluster listen on?", "answer": "9321"},
    {"id": "ferry",
     "context": "Fill the tank with clean water and add the descaling tablet, then run the machine empty twice. "
                "Rinse the tank and run one more cycle with fresh water only. The last ferry to Larkspur "
                "Island leaves at half past nine. Wipe the steam wand after each use and empty the drip tray "
                "every day; a full tray may leak onto the counter.",
     "question": "When does the last ferry to Larkspur Island leave?", "answer": "half past nine"},
]


def write_examples(path, rows=HELD_OUT):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_modes(loaded, path, tmp_path, **kw) -> dict[str, dict[str, dict]]:
    """Mode → example id → trial record, from one ``contexts`` run per mode."""
    out = {}
    for mode in ("fast", "reference"):
        request = ProfileRequest(probes=["context_retrieval", "context_enhanced_retrieval"], out_dir=tmp_path / mode,
                                 mode=mode, options={"contexts": {"file": path}}, **kw)
        try:
            run_profile(loaded, request)
        except Exception as e:           # no example passed: the log is still there to compare
            if "passed" not in str(e):
                raise
        log = next((tmp_path / mode).glob("*.contexts.trials.jsonl"))
        lines = log.read_text().splitlines()[1:]
        out[mode] = {r["trial"]: r for r in map(json.loads, lines)}
    return out


def assert_modes_agree(records: dict[str, dict[str, dict]], atol: float) -> None:
    assert records["fast"].keys() == records["reference"].keys()
    for trial, ref in records["reference"].items():
        fast = records["fast"][trial]
        assert fast["response"] == ref["response"], trial
        assert fast["gates"] == ref["gates"] and fast["passed"] == ref["passed"], trial
        for kind, scores in ref["scores"].items():
            assert torch.allclose(torch.tensor(fast["scores"][kind]), torch.tensor(scores), atol=atol), (trial, kind)


def test_sliding_window_models_batch_different_lengths_only_inside_the_window():
    assert example_batches([10, 30, 12, 30], 4, None, 5) == [[0, 2, 1, 3]]
    assert example_batches([10, 30, 12, 30], 4, 20, 5) == [[0, 2], [1, 3]]      # 30 + 5 > 20: one length
    assert example_batches([10, 30, 12, 30], 4, 20, 9) == [[0], [2], [1, 3]]
    assert example_batches([10, 11, 12], 2, None, 5) == [[0, 1], [2]]


@pytest.mark.parametrize("model_fixture", ["tiny_llama", "tiny_gemma3"])   # Gemma 3: window 16, prompts ~100
def test_fast_mode_scores_the_response_reference_mode_decodes(model_fixture, request, tmp_path):
    loaded = request.getfixturevalue(model_fixture)
    path = write_examples(tmp_path / "own.jsonl", HELD_OUT[:4])
    records = run_modes(loaded, path, tmp_path, chat_template=False, batch_size=3, max_new_tokens=6)
    assert {len(r["response"]) > 0 for r in records["reference"].values()} == {True}
    assert_modes_agree(records, atol=1e-5)


@pytest.mark.slow
def test_smollm2_fast_and_reference_gate_alike_on_unseen_text(smollm2, tmp_path):
    rows = [r for r in HELD_OUT if r["id"] in ("vault", "oven", "meeting")]
    records = run_modes(smollm2, write_examples(tmp_path / "own.jsonl", rows), tmp_path, batch_size=3)
    for mode in ("reference", "fast"):                 # it answers every one, in a sentence that names the answer
        assert all(r["passed"] and row["answer"] in r["response"]
                   for row, r in zip(rows, map(records[mode].get, (r["id"] for r in rows)), strict=True)), mode
    assert_modes_agree(records, atol=2e-4)


def test_a_fast_log_that_scored_a_forced_answer_is_not_resumed(tiny_llama, tmp_path):
    path = write_examples(tmp_path / "own.jsonl", HELD_OUT[:2])
    request = ProfileRequest(probes=["context_retrieval"], out_dir=tmp_path / "out", mode="fast", chat_template=False,
                             max_new_tokens=4, options={"contexts": {"file": path}})
    try:
        run_profile(tiny_llama, request)
    except Exception as e:               # the tiny random model answers nothing: no profile, the log stays
        if "passed" not in str(e):
            raise
    log = tmp_path / "out" / "tiny-llama.contexts.trials.jsonl"
    header, *records = log.read_text().splitlines()
    header = json.loads(header)
    assert header["settings"].pop("scored") == "decoded_response"               # as fast mode wrote it before
    log.write_text("\n".join([json.dumps(header), *records]) + "\n")
    with pytest.raises(HeadprobeError, match=r"cannot resume, the log was made with other settings \(scored\)"):
        run_profile(tiny_llama, dataclasses.replace(request, resume=True))
