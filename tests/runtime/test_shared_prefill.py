"""One recorded prefill replayed for many settings gives exactly what a full generate call gives."""

from __future__ import annotations

import pytest
import torch

from headprobe import HeadprobeError
from headprobe.runtime.generate import generate_compressed
from headprobe.runtime.shared_prefill import generate_from_prefill, record_prefill

PROMPTS = ["The river ran past the old mill. Fishermen waited on the bank while the rain came down. " * 5,
           "The secret code is blue tulip seven. Numbers like 42 appear in reports. " * 3]

SETTINGS = [("snapkv", 20, {}), ("snapkv", 20, {"pooling": "avg"}), ("streaming", 16, {}),
            ("dynamickv", 20, {"interval": 3}), ("morphkv", 24, {"window": 8}),
            ("keepkv", 20, {"key_merge": "zip"}), ("keepkv", 20, {"key_merge": "convex"}), ("full", None, {})]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("model_name", ["tiny_llama", "tiny_gemma3"])
def test_replayed_prefill_equals_generate_for_every_policy(model_name, request):
    lm = request.getfixturevalue(model_name)
    enc = lm.tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    rec = record_prefill(lm, input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    assert len(rec.layers) == lm.model.config.num_hidden_layers
    for policy, capacity, options in SETTINGS:
        want = generate_compressed(lm, input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                                   policy=policy, capacity=capacity, policy_options=options, max_new_tokens=12)
        got = generate_from_prefill(lm, rec, policy=policy, capacity=capacity, policy_options=options,
                                    max_new_tokens=12)
        assert torch.equal(got.sequences, want.sequences), (policy, options)
        assert torch.equal(got.cache.kept_tokens(), want.cache.kept_tokens()), (policy, options)
        assert got.cache.memory_bytes() == want.cache.memory_bytes()
        if capacity is not None and policy != "full":
            assert int(got.cache.kept_tokens().max()) < enc["input_ids"].shape[1]   # it really compressed


def test_the_record_serves_many_calls_unchanged(tiny_llama):
    enc = tiny_llama.tokenizer(PROMPTS[:1], return_tensors="pt")
    rec = record_prefill(tiny_llama, input_ids=enc["input_ids"])
    keys = [r.keys.clone() for r in rec.layers]
    first = generate_from_prefill(tiny_llama, rec, policy="keepkv", capacity=16, max_new_tokens=6)
    second = generate_from_prefill(tiny_llama, rec, policy="keepkv", capacity=16, max_new_tokens=6)
    assert torch.equal(first.sequences, second.sequences)
    assert all(torch.equal(a, r.keys) for a, r in zip(keys, rec.layers))


def test_keydiff_and_sampling_are_refused(tiny_llama):
    enc = tiny_llama.tokenizer(PROMPTS[:1], return_tensors="pt")
    rec = record_prefill(tiny_llama, input_ids=enc["input_ids"])
    with pytest.raises(HeadprobeError, match="keydiff"):
        generate_from_prefill(tiny_llama, rec, policy="keydiff", capacity=16, max_new_tokens=4)
    with pytest.raises(HeadprobeError, match="do_sample"):
        generate_from_prefill(tiny_llama, rec, policy="snapkv", capacity=16, max_new_tokens=4, do_sample=True)
