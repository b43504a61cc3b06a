"""Settings of one prompt decoded as the rows of one stacked cache give, setting by setting, exactly what
each gives decoded alone: tokens, cache bytes, kept and peak tokens."""

from __future__ import annotations

import pytest
import torch

from headprobe import BudgetMap, HeadprobeError
from headprobe.runtime.answer_stop import AnswerStop, line_complete
from headprobe.runtime.cache import CompressedCache
from headprobe.runtime.settings_batch import CacheSetting, decode_batches, generate_settings
from headprobe.runtime.shared_prefill import generate_from_prefill, record_prefill

PROMPTS = ["The river ran past the old mill. Fishermen waited on the bank while the rain came down. " * 5,
           "The secret code is blue tulip seven. Numbers like 42 appear in reports. " * 3]

pytestmark = pytest.mark.usefixtures("one_thread")


def head_map(lm, low: int = 9) -> BudgetMap:
    """Per-head budgets that differ head by head (a HeadKV-shaped map)."""
    ident = lm.identity
    budgets = [[low + 3 * ((5 * layer + head) % 7) for head in range(ident.num_kv_heads)]
               for layer in range(ident.num_layers)]
    total = sum(map(sum, budgets))
    return BudgetMap(model=ident, method={"allocator": "test"}, shares=[[b / total for b in r] for r in budgets],
                     budgets=budgets)


def settings_of(lm) -> list[CacheSetting]:
    return [CacheSetting("full"), CacheSetting("snapkv", capacity=12), CacheSetting("snapkv", capacity=20),
            CacheSetting("snapkv", capacity=16, policy_options={"pooling": "avg"}),
            CacheSetting("snapkv", budget=head_map(lm)), CacheSetting("dynamickv", capacity=14),
            CacheSetting("snapkv", ratio=0.3), CacheSetting("streaming", capacity=10),
            CacheSetting("streaming", capacity=18), CacheSetting("streaming", capacity=12, policy_options={"sink": 2}),
            CacheSetting("morphkv", capacity=24, policy_options={"window": 8}), CacheSetting("keepkv", capacity=16)]


def alone(lm, rec, s: CacheSetting, new: int, stop_at_line: bool = False):
    return generate_from_prefill(lm, rec, policy=s.policy, budget=s.budget, ratio=s.ratio, capacity=s.capacity,
                                 policy_options=s.policy_options, max_new_tokens=new, stop_at_line=stop_at_line)


def assert_same(got, want, what) -> None:
    assert torch.equal(got.sequences, want.sequences), what
    assert torch.equal(got.cache.kept_tokens(), want.cache.kept_tokens()), what
    assert torch.equal(got.cache.peak_tokens(), want.cache.peak_tokens()), what
    assert got.cache.memory_bytes() == want.cache.memory_bytes(), what
    assert got.cache.used_bytes() == want.cache.used_bytes(), what
    assert got.cache.full_cache_bytes() == want.cache.full_cache_bytes(), what
    assert got.texts == want.texts, what


@pytest.mark.parametrize("model_name", ["tiny_llama", "tiny_gemma3"])
@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["one prompt", "two prompts padded"])
def test_batched_settings_equal_each_setting_alone(model_name, prompts, request):
    lm = request.getfixturevalue(model_name)
    enc = lm.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    rec = record_prefill(lm, input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    settings = settings_of(lm)
    batched = generate_settings(lm, rec, settings, max_new_tokens=14)
    for s, got in zip(settings, batched, strict=True):
        assert_same(got.result, alone(lm, rec, s, 14), s)
    sizes = {(s.policy, s.capacity): g.batch_settings for s, g in zip(settings, batched, strict=True)}
    assert sizes[("snapkv", 12)] == 7 and sizes[("full", None)] == 7       # the append-only caches: one batch
    assert sizes[("streaming", 10)] == 2 and sizes[("streaming", 12)] == 1      # sink 4 together, sink 2 alone
    assert sizes[("morphkv", 24)] == 1 and sizes[("keepkv", 16)] == 1


def test_a_row_that_finishes_early_stops_changing(tiny_llama):
    """Rows whose answer ends (here: end-of-sequence forced at a token the model writes) keep what they held
    then, while the other rows decode on, exactly as each decoded alone."""
    lm = tiny_llama
    enc = lm.tokenizer(PROMPTS[:1], return_tensors="pt")
    rec = record_prefill(lm, input_ids=enc["input_ids"])
    settings = [CacheSetting("snapkv", capacity=c) for c in (8, 12, 16, 24, 40)] + [CacheSetting("full")]
    free = generate_settings(lm, rec, settings, max_new_tokens=16)
    # one token the answers write at different steps becomes an end of sequence: the rows end apart
    answers = [g.result.new_tokens[0].tolist() for g in free]
    steps = {t: {a.index(t) for a in answers if t in a[1:]} for a in answers for t in a[1:]}
    stop = max(steps, key=lambda t: len(steps[t]))
    old = lm.model.generation_config.eos_token_id
    lm.model.generation_config.eos_token_id = stop
    try:
        batched = generate_settings(lm, rec, settings, max_new_tokens=16)
        for s, got in zip(settings, batched, strict=True):
            assert_same(got.result, alone(lm, rec, s, 16), s)
    finally:
        lm.model.generation_config.eos_token_id = old
    lengths = {g.result.sequences.shape[1] for g in batched}
    assert len(lengths) > 2 and batched[0].batch_settings == len(settings)   # the rows ended at different steps


def test_stacking_refuses_caches_that_decode_differently(tiny_llama):
    enc = tiny_llama.tokenizer(PROMPTS[:1], return_tensors="pt")
    rec = record_prefill(tiny_llama, input_ids=enc["input_ids"])
    got = generate_settings(tiny_llama, rec, [CacheSetting("snapkv", capacity=12), CacheSetting("keepkv", capacity=12)],
                            max_new_tokens=2)
    with pytest.raises(HeadprobeError, match="decode alike"):
        CompressedCache.stack([g.result.cache for g in got])
    assert decode_batches([g.result.cache for g in got]) == [[0], [1]]


def test_unbatched_reference_is_the_same(tiny_llama):
    enc = tiny_llama.tokenizer(PROMPTS[:1], return_tensors="pt")
    rec = record_prefill(tiny_llama, input_ids=enc["input_ids"])
    settings = [CacheSetting("snapkv", capacity=12), CacheSetting("streaming", capacity=12), CacheSetting("full")]
    one_by_one = generate_settings(tiny_llama, rec, settings, max_new_tokens=8, batched=False)
    together = generate_settings(tiny_llama, rec, settings, max_new_tokens=8)
    assert [g.batch_settings for g in one_by_one] == [1, 1, 1]
    assert [g.batch_settings for g in together] == [2, 1, 2]
    for a, b in zip(one_by_one, together, strict=True):
        assert_same(a.result, b.result, "batched")


def test_first_line_rule():
    assert not line_complete("\n\n  ")
    assert line_complete("\n 42\n")
    assert not line_complete(" 42 is the number")


def test_answer_stop_marks_rows_done_at_eos_and_first_line(tiny_llama):
    tok = tiny_llama.tokenizer
    prompt = tok("The code is", return_tensors="pt")["input_ids"][0]
    line = tok(" blue tulip\nThe", return_tensors="pt")["input_ids"][0]
    assert any("\n" in tok.decode([int(t)]) for t in line)
    stop = AnswerStop(tok, len(prompt), {tok.eos_token_id}, first_line=True, groups=[(0, 1), (1, 1)])
    finished = []
    stop.on_finish = lambda first, rows: finished.append(first)
    done_at = None
    for n in range(1, len(line) + 1):
        rows = torch.stack([torch.cat([prompt, line[:n]]), torch.cat([prompt, line[:n]])])
        rows[1, -1] = tok.eos_token_id if n == 2 else rows[1, -1]
        flags = stop(rows, None).tolist()
        if flags[0] and done_at is None:
            done_at = n
    assert "\n" in tok.decode(line[:done_at]) and "\n" not in tok.decode(line[:done_at - 1])
    assert finished == [1, 0]                         # the EOS row first, then the line
    assert stop.finished[1] == len(prompt) + 2
    plain = AnswerStop(tok, len(prompt), {tok.eos_token_id})
    assert not plain.row_done(torch.cat([prompt, line]))    # without the rule a line break is no end


class NewlineAt:
    """The tiny tokenizer, except that one token id decodes as a line break."""

    def __init__(self, tok, token: int) -> None:
        self.tok, self.token = tok, token

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def decode(self, ids, **kwargs):
        return "".join("\n" if int(i) == self.token else self.tok.decode([int(i)], **kwargs) for i in ids)

    def batch_decode(self, rows, **kwargs):
        return [self.decode(r, **kwargs) for r in rows]


def test_stop_at_line_ends_generation_at_the_first_line(tiny_llama):
    """In generate: a row stops at the token that completes its first line, and the tokens before are the
    ones it writes without the rule (a token of the free answer is read as a line break)."""
    lm = tiny_llama
    enc = lm.tokenizer(PROMPTS[:1], return_tensors="pt")
    rec = record_prefill(lm, input_ids=enc["input_ids"])
    free = alone(lm, rec, CacheSetting("snapkv", capacity=12), 12).new_tokens[0].tolist()
    k = next(i for i in range(2, len(free)) if free[i] not in free[:i])
    tok = NewlineAt(lm.tokenizer, free[k])
    ruled = generate_from_prefill(lm, rec, tokenizer=tok, policy="snapkv", capacity=12, max_new_tokens=12,
                                  stop_at_line=True)
    assert ruled.new_tokens[0].tolist() == free[:k + 1]
    assert ruled.texts[0].endswith("\n") and line_complete(ruled.texts[0])
    settings = [CacheSetting("snapkv", capacity=12), CacheSetting("full"), CacheSetting("streaming", capacity=12)]
    together = generate_settings(lm, rec, settings, tokenizer=tok, max_new_tokens=12, stop_at_line=True)
    for s, got in zip(settings, together, strict=True):
        want = generate_from_prefill(lm, rec, tokenizer=tok, policy=s.policy, capacity=s.capacity,
                                     max_new_tokens=12, stop_at_line=True)
        assert_same(got.result, want, s)


def test_settings_that_keep_the_same_tokens_compress_and_decode_once(tiny_llama):
    """A capacity and a budget map of the same per-head budgets are one cache: the second setting gets the
    first one's answer and cache (and half the time each), and both equal their settings alone."""
    lm = tiny_llama
    ident = lm.identity
    uniform = BudgetMap(model=ident, method={"allocator": "test"},
                        shares=[[1 / (ident.num_layers * ident.num_kv_heads)] * ident.num_kv_heads] * ident.num_layers,
                        budgets=[[12] * ident.num_kv_heads] * ident.num_layers)
    enc = lm.tokenizer(PROMPTS[:1], return_tensors="pt")
    rec = record_prefill(lm, input_ids=enc["input_ids"])
    settings = [CacheSetting("snapkv", capacity=12), CacheSetting("snapkv", capacity=16),
                CacheSetting("snapkv", budget=uniform), CacheSetting("snapkv", capacity=12, policy_options={"window": 4})]
    got = generate_settings(lm, rec, settings, max_new_tokens=10)
    assert [g.twin for g in got] == [None, None, 0, None]          # other options: another cache
    assert got[2].result is got[0].result and got[2].seconds == got[0].seconds
    assert [g.batch_settings for g in got] == [3, 3, 3, 3]             # three distinct caches in the batch
    for s, g in zip(settings, got, strict=True):
        assert_same(g.result, alone(lm, rec, s, 10), s)
