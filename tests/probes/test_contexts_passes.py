"""The passes over a user's own examples: QRHead's score exactly as its arithmetic says (against eager attention
on the full prompt and on the null query's), the retrieval scores at the answer's real span equal to a direct
computation and the same in any batch, and the run as needles run: profiles with the data's fingerprint and
counts, resume, shards and merge, early stopping, refusals, allocation."""

from __future__ import annotations

import json
import math

import pytest
import torch

from headprobe import (
    HeadprobeError,
    Profile,
    ProfileRequest,
    StopRule,
    allocate,
    merge_profile_logs,
    run_profile,
)
from headprobe.haystack.contexts import document_prompt, read_contexts
from headprobe.probes.context_pass import ContextInput
from headprobe.probes.head_scores import copy_scores, reasoning_scores
from headprobe.probes.query_focus_pass import evidence_scores, query_focus_record
from headprobe.probes.reference_mode import eos_ids
from tests.conftest import _TINY_TEXT

torch.set_num_threads(1)

SENTENCES = [s.strip() + "." for s in _TINY_TEXT.split(".") if s.strip()][:8]


def examples_file(tmp_path, n: int = 5, extra: list[dict] | None = None):
    rows = []
    for i in range(n):
        context = " ".join(SENTENCES[i:] + SENTENCES[:i])          # different lengths of prompt after the span
        context = " ".join([context] * (1 + i % 3))
        answer = "blue tulip seven" if i % 2 == 0 else "every Tuesday"
        rows.append({"id": f"e{i}", "context": context, "question": f"What is example {i} about?", "answer": answer})
    rows += extra or []
    path = tmp_path / "own.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- QRHead's arithmetic -----------------------------------------------------------------------------

def test_evidence_scores_follow_qrheads_rule():
    real = torch.tensor([[0.10, 0.20, 0.30, 0.05], [0.5, 0.0, 0.0, 0.0]], dtype=torch.float64)
    null = torch.tensor([[0.05, 0.05, 0.05, 0.05], [0.1, 0.1, 0.1, 0.1]], dtype=torch.float64)
    got = evidence_scores(real, null)
    for h in range(2):
        cal = real[h] - null[h]
        threshold = cal.mean() - 2 * cal.std()              # unbiased, as torch.std in QRHead
        assert got[h] == pytest.approx(float(sum(x for x in cal if x > threshold)), abs=1e-12)
    spike = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.9]], dtype=torch.float64)
    assert evidence_scores(spike, None)[0] == 0.0           # the outlier below mean - 2 std is dropped
    one = torch.tensor([[0.4], [0.1]], dtype=torch.float64)
    assert evidence_scores(one, torch.tensor([[0.1], [0.3]])).tolist() == pytest.approx([0.3, -0.2])


def _eager_attention(model, ids: list[int]) -> list[torch.Tensor]:
    """Every layer's full attention ``[heads, tokens, tokens]`` of one forward, by eager attention."""
    before = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    finally:
        model.config._attn_implementation = before
    return [a[0].double() for a in out.attentions]


@pytest.mark.parametrize("model_fixture", ["tiny_llama", "tiny_gemma3"])
def test_query_focus_equals_eager_attention(model_fixture, request, tmp_path):
    loaded = request.getfixturevalue(model_fixture)
    data = read_contexts(examples_file(tmp_path, 3))
    for example in data.examples:
        record = query_focus_record(loaded, ContextInput(data, "own.jsonl"), example, False, "N/A")
        prompt = document_prompt(loaded.tokenizer, example, False)
        null = document_prompt(loaded.tokenizer, example, False, question="N/A")
        start, end = prompt.context.answer_span
        real_attn = _eager_attention(loaded.model, prompt.input_ids)
        null_attn = _eager_attention(loaded.model, null.input_ids)
        assert record["answer_span"] == [start, end] and record["query_tokens"] == len(prompt.input_ids) - prompt.query_start
        for layer in range(loaded.identity.num_layers):
            a = real_attn[layer][:, prompt.query_start:, start:end].mean(dim=1)
            a0 = null_attn[layer][:, null.query_start:, start:end].mean(dim=1)
            expected = evidence_scores(a, a0)
            assert record["scores"]["query_focus"][layer] == pytest.approx(expected.tolist(), abs=2e-6), layer


# ---- the retrieval scores at the real span -------------------------------------------------------------

def _records(path):
    return {r["trial"]: r for r in (json.loads(x) for x in path.read_text().splitlines()[1:])}


def _greedy(loaded, ids: list[int], steps: int) -> list[int]:
    """Greedy decoding by one forward over the whole sequence per token, up to ``steps`` tokens or end of sequence."""
    eos, out = eos_ids(loaded), []
    for _ in range(steps):
        token = int(loaded.model(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax())
        if token in eos:
            break
        out.append(token)
    return out


def test_retrieval_scores_equal_a_direct_computation_in_any_batch(tiny_llama, tmp_path):
    path = examples_file(tmp_path, 5)
    logs = {}
    for batch in (1, 3):
        out = tmp_path / f"b{batch}"
        run_profile(tiny_llama, ProfileRequest(probes=["context_retrieval", "context_enhanced_retrieval"], out_dir=out,
                                               chat_template=False, batch_size=batch,
                                               options={"contexts": {"file": path}}))
        logs[batch] = _records(out / "tiny-llama.contexts.trials.jsonl")
    assert logs[1].keys() == logs[3].keys() == {f"e{i}" for i in range(5)}
    for trial, one in logs[1].items():
        for kind in ("context_retrieval", "context_enhanced_retrieval"):
            assert torch.allclose(torch.tensor(one["scores"][kind]), torch.tensor(logs[3][trial]["scores"][kind]),
                                  atol=1e-5), (trial, kind)
    # the direct computation: the model's greedy response, decoded one full forward per token, then eager
    # attention rows of the positions that predict its tokens
    data = read_contexts(path)
    tok = tiny_llama.tokenizer
    for example in data.examples:
        prompt = document_prompt(tok, example, False)
        ids = prompt.input_ids
        response = _greedy(tiny_llama, ids, 24)
        assert logs[1][example.id]["response"] == tok.decode(response, skip_special_tokens=True)
        attn = _eager_attention(tiny_llama.model, ids + response[:-1])
        start, end = prompt.context.answer_span
        steps = torch.arange(len(ids) - 1, len(ids) - 1 + len(response))
        keys = torch.arange(len(ids) + len(response) - 1)
        for layer in range(tiny_llama.identity.num_layers):
            rows = attn[layer][:, steps][None]                                # [1, heads, steps, keys]
            span = (torch.tensor([start]), torch.tensor([end]))
            mask = torch.ones(1, len(response), dtype=torch.bool)
            er = reasoning_scores(rows, keys, *span, mask)[0]
            cp = copy_scores(rows, keys, *span, torch.tensor([response]), mask, torch.tensor([ids]))[0]
            record = logs[1][example.id]["scores"]
            assert record["context_enhanced_retrieval"][layer] == pytest.approx(er.tolist(), abs=2e-6)
            assert record["context_retrieval"][layer] == pytest.approx(cp.tolist(), abs=1e-9)


# ---- runs --------------------------------------------------------------------------------------------

def _request(tmp_path, path, probes=("context_retrieval", "query_focus"), **kw):
    options = {"contexts": {"file": path}, "query_focus": {"file": path}}
    return ProfileRequest(probes=probes, out_dir=tmp_path / "out", chat_template=False, batch_size=1,
                          options={k: v for k, v in options.items() if k in ("query_focus",) + (
                              ("contexts",) if "context_retrieval" in probes else ())}, **kw)


def test_a_run_writes_profiles_that_describe_the_data(tiny_llama, tmp_path, monkeypatch):
    missing = {"id": "gone", "context": "The river ran past the old mill.", "question": "Who?", "answer": "a miller"}
    path = examples_file(tmp_path, 4, [missing])
    monkeypatch.chdir(tmp_path)
    result = run_profile(tiny_llama, _request(tmp_path, path))
    assert result.trials_run == 8 and result.logs == [tmp_path / "out" / "tiny-llama.contexts.trials.jsonl",
                                                      tmp_path / "out" / "tiny-llama.query_focus.trials.jsonl"]
    focus = Profile.load(tmp_path / "out" / "tiny-llama.query_focus.json")
    contexts = focus.probe["contexts"]
    assert contexts["name"] == "own.jsonl" and contexts["fingerprint"] == read_contexts(path).fingerprint
    assert contexts["fields"]["answer"] == "answer" and contexts["not_in_context_ids"] == ["gone"]
    assert focus.trials["total"] == focus.trials["passed"] == 4 and focus.trials["answer_not_in_context"] == 1
    assert focus.trials["rows"] == 5 and "gate" not in focus.trials
    records = list(_records(result.logs[1]).values())
    signed = [[math.fsum(r["scores"]["query_focus"][layer][h] for r in records) / 4 for h in range(4)]
              for layer in range(4)]
    flat = [x for row in signed for x in row]
    assert [x for row in focus.query_heads for x in row] == pytest.approx([max(0.0, x) for x in flat], abs=1e-12)
    assert any(x < 0 for x in flat)          # a random model's question attends no more than N/A does
    assert focus.trials["clipped_heads"] == sum(x < 0 for row in signed for x in row)
    assert all(x >= 0 for row in focus.intervals["low"] for x in row)
    # resumed: nothing runs, the profiles are rewritten from the logs
    again = run_profile(tiny_llama, _request(tmp_path, path, resume=True))
    assert (again.trials_run, again.trials_skipped) == (0, 8)
    assert Profile.load(tmp_path / "out" / "tiny-llama.query_focus.json").query_heads == focus.query_heads


def test_uncalibrated_scores_are_allocatable(tiny_llama, tmp_path):
    path = examples_file(tmp_path, 3)
    request = ProfileRequest(probes=["query_focus"], out_dir=tmp_path, chat_template=False,
                             options={"query_focus": {"file": path, "null_query": ""}})
    profile = Profile.load(run_profile(tiny_llama, request).profiles[0])
    assert profile.probe["null_query"] == "" and all(x > 0 for row in profile.query_heads for x in row)
    budget = allocate("headkv", [profile], capacity=16)                # like any head-score profile
    assert sum(sum(row) for row in budget.budgets) == 16 * 4 * 2


def test_shards_merge_into_the_whole_run(tiny_llama, tmp_path):
    path = examples_file(tmp_path, 5)
    whole = run_profile(tiny_llama, _request(tmp_path, path, probes=["query_focus"]))
    shard_logs = []
    for i in range(2):
        shard = run_profile(tiny_llama, _request(tmp_path, path, shard=(i, 2), name="s", probes=["query_focus"]))
        assert shard.profiles == []
        shard_logs += shard.logs
    with pytest.raises(HeadprobeError, match="examples are missing"):
        merge_profile_logs(shard_logs[:1], tmp_path / "merged")
    written = merge_profile_logs(shard_logs, tmp_path / "merged")
    for path_ in whole.profiles:
        merged = Profile.load(tmp_path / "merged" / path_.name)
        assert merged.query_heads == Profile.load(path_).query_heads
    assert len(written) == 1


def test_early_stopping_over_examples(tiny_llama, tmp_path):
    path = examples_file(tmp_path, 6)
    rule = StopRule(k=2, jaccard=0.01, check_every=2, min_passed=2)
    request = ProfileRequest(probes=["query_focus"], out_dir=tmp_path / "out", chat_template=False,
                             options={"query_focus": {"file": path}}, until_stable=rule)
    result = run_profile(tiny_llama, request)
    assert result.stopping["query_focus"].stable and result.stopping["query_focus"].trials == 2
    profile = Profile.load(result.profiles[0])
    assert profile.trials["stopping"]["grid_trials"] == 6 and profile.trials["total"] == 2


def test_a_context_beyond_the_models_is_refused_before_any_log(tiny_llama, tmp_path):
    long = {"id": "long", "context": _TINY_TEXT * 60, "question": "Which code?", "answer": "blue tulip seven"}
    path = examples_file(tmp_path, 2, [long])
    with pytest.raises(HeadprobeError, match=r"example long: its prompt is \d+ tokens, beyond the model's context "
                                             r"of 4096 tokens"):
        run_profile(tiny_llama, _request(tmp_path, path))
    assert not (tmp_path / "out" / "tiny-llama.contexts.trials.jsonl").exists()


def test_a_log_of_other_data_is_not_resumed(tiny_llama, tmp_path):
    path = examples_file(tmp_path, 3)
    run_profile(tiny_llama, _request(tmp_path, path))
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[0]["question"] = "Another question?"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(HeadprobeError, match="other settings"):
        run_profile(tiny_llama, _request(tmp_path, path, resume=True))
