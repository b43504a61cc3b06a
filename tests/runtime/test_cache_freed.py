"""A compressed cache is freed as soon as its last reference goes, by reference counting alone.

Its buffers are the largest tensors of a run; in a reference cycle they would wait for Python's cycle
collector, which runs late and in bulk, and a long eval would hold one dead cache per answer until the
machine ran out of memory. Each test runs with the cycle collector off and checks, through weak
references, that nothing of the run outlives its last reference.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from headprobe.runtime.generate import generate_compressed
from headprobe.runtime.policies import POLICIES
from headprobe.runtime.settings_batch import CacheSetting, generate_settings
from headprobe.runtime.shared_prefill import record_prefill

PROMPT = "The river ran past the old mill. Fishermen waited on the bank while the rain came down. " * 6

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def no_cycle_collector():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_gemma3"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_generation_s_cache_is_freed_with_its_result(request, no_cycle_collector, model, policy):
    lm = request.getfixturevalue(model)
    options = {"window": 8} if policy == "morphkv" else None          # its default window is 32 tokens
    res = generate_compressed(lm, PROMPT, policy=policy, capacity=24, max_new_tokens=6, policy_options=options)
    if policy != "full":                                                        # tokens were evicted
        assert int(res.cache.kept_tokens().min()) < res.sequences.shape[1] - 1
    cache, layers = weakref.ref(res.cache), [weakref.ref(s) for s in res.cache.stores if s is not None]
    del res
    assert cache() is None
    assert all(layer() is None for layer in layers)


def test_batched_settings_and_their_recorded_prefill_are_freed(tiny_llama, no_cycle_collector):
    ids = tiny_llama.tokenizer(PROMPT, return_tensors="pt").input_ids
    prefill = record_prefill(tiny_llama, input_ids=ids)
    settings = [CacheSetting("full"), CacheSetting("snapkv", capacity=16), CacheSetting("snapkv", capacity=24),
                CacheSetting("streaming", capacity=16), CacheSetting("keepkv", capacity=20)]
    made = generate_settings(tiny_llama, prefill, settings, max_new_tokens=6)
    assert max(g.batch_settings for g in made) > 1                              # decoded together
    refs = [weakref.ref(prefill)] + [weakref.ref(g.result.cache) for g in made]
    del prefill, made
    assert [r() is None for r in refs] == [True] * len(refs)
