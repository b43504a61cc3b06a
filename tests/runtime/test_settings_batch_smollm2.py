"""SmolLM2 and Gemma 3: the settings of one needle prompt decoded as one batch give each setting's answer,
bytes and kept tokens exactly as decoded alone, and the needle still comes out of the compressed caches."""

from __future__ import annotations

import pytest

from headprobe.runtime.settings_batch import CacheSetting, generate_settings
from headprobe.runtime.shared_prefill import generate_from_prefill, record_prefill

from .test_generate_smollm2 import headkv_like_budget, needle_prompt
from .test_settings_batch import assert_same

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def _check(lm, settings, tokens: int, answer: str) -> list:
    text = needle_prompt(lm.tokenizer, tokens)
    if lm.tokenizer.chat_template:
        text = lm.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                add_generation_prompt=True)
    ids = lm.tokenizer(text, return_tensors="pt", add_special_tokens=not lm.tokenizer.chat_template)["input_ids"]
    rec = record_prefill(lm, input_ids=ids)
    together = generate_settings(lm, rec, settings, max_new_tokens=16)
    for s, got in zip(settings, together, strict=True):
        want = generate_from_prefill(lm, rec, policy=s.policy, budget=s.budget, capacity=s.capacity,
                                     policy_options=s.policy_options, max_new_tokens=16)
        assert_same(got.result, want, s)
    assert answer in together[0].result.texts[0]                                 # the full cache answers
    assert sum(answer in g.result.texts[0] for g in together) >= len(settings) // 2
    return together


def test_smollm2_settings_of_one_prompt_decode_as_one_batch(smollm2):
    settings = [CacheSetting("full"), CacheSetting("snapkv", capacity=128), CacheSetting("snapkv", capacity=256),
                CacheSetting("snapkv", budget=headkv_like_budget(smollm2.identity)),
                CacheSetting("dynamickv", capacity=128), CacheSetting("streaming", capacity=128),
                CacheSetting("streaming", capacity=256)]
    together = _check(smollm2, settings, 1500, "4817")
    assert [g.batch_settings for g in together] == [5, 5, 5, 5, 5, 2, 2]
    kept = [int(g.result.cache.kept_tokens().max()) for g in together]
    assert kept[1] < kept[2] < kept[0] and kept[5] <= 128          # each row kept its own budget


def test_gemma3_settings_with_sliding_layers_decode_as_one_batch(gemma3):
    settings = [CacheSetting("full"), CacheSetting("snapkv", capacity=128), CacheSetting("snapkv", capacity=384),
                CacheSetting("streaming", capacity=256)]
    together = _check(gemma3, settings, 1500, "4817")
    assert [g.batch_settings for g in together] == [3, 3, 3, 1]
