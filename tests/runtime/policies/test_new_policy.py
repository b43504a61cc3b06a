"""A scoring policy added the way docs/runtime.md ("Adding a policy") says: one small class, nothing else.

It keeps the tokens whose keys have the largest norm. Through ``generate_compressed`` it must keep exactly
its budget (the window plus the top-scored tokens before it), the right ones, and the model must still
answer: with a budget that covers the prompt, exactly what the stock cache gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from transformers import DynamicCache

from headprobe.models.cache_argument import with_cache
from headprobe.runtime.generate import generate_compressed
from headprobe.runtime.policies import LayerContext, ScorerPolicy


@dataclass
class LargestKeys(ScorerPolicy):
    """Keep the window plus the prompt tokens whose keys have the largest L2 norm."""

    name: ClassVar[str] = "largest_keys"
    window: int = 4

    def score(self, ctx: LayerContext) -> torch.Tensor:
        return ctx.keys.float().norm(dim=-1)          # [batch, kv_heads, n]


pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["The river ran past the old mill. Fishermen waited on the bank while the rain came down. " * 2,
           "The secret code is blue tulip seven. Numbers like 42 appear in reports."]


def _prompt_keys(lm, enc):
    """Every layer's post-RoPE prompt keys ``[batch, kv_heads, n, head_dim]`` from the stock cache, with
    the positions generate uses for left-padded rows."""
    mask = enc["attention_mask"]
    position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    cache = DynamicCache(config=lm.model.config)
    lm.model(**enc, position_ids=position_ids, use_cache=True, **with_cache(lm.model, cache))
    return [layer.keys for layer in cache.layers]


def test_scorer_policy_keeps_the_window_and_the_largest_keys(tiny_llama):
    tok = tiny_llama.tokenizer
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    capacity, window = 12, 4
    res = generate_compressed(tiny_llama, input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                              policy=LargestKeys(window=window), capacity=capacity, max_new_tokens=1)
    kept = res.cache.kept_tokens()
    assert kept.unique().tolist() == [capacity]             # window 4 + the top 8, every head of every row
    with torch.no_grad():
        keys = _prompt_keys(tiny_llama, enc)
    real = enc["attention_mask"].sum(1)
    n = enc["input_ids"].shape[1]
    for layer, layer_keys in enumerate(keys):
        view = res.cache.stores[layer].padded()
        for row in range(len(PROMPTS)):
            pad = n - int(real[row])
            for head in range(layer_keys.shape[1]):
                norms = layer_keys[row, head, pad: n - window].float().norm(dim=-1)
                top = norms.topk(capacity - window).indices.tolist()     # index i is prompt position i
                want = sorted(top) + list(range(int(real[row]) - window, int(real[row])))
                seg = row * layer_keys.shape[1] + head
                got = sorted(view["positions"][seg][view["valid"][seg]].tolist())
                assert got == want, (layer, row, head)


def test_scorer_policy_still_answers(tiny_llama):
    tok = tiny_llama.tokenizer
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    ref = tiny_llama.model.generate(**enc, max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id)
    covering = generate_compressed(tiny_llama, PROMPTS, policy=LargestKeys(), capacity=1000, max_new_tokens=16)
    assert torch.equal(covering.sequences, ref)
    squeezed = generate_compressed(tiny_llama, PROMPTS, policy=LargestKeys(), capacity=12, max_new_tokens=16,
                                   min_new_tokens=16)
    assert squeezed.new_tokens.shape == (2, 16)
    assert squeezed.cache.kept_tokens().unique().tolist() == [12 + 15]      # the budget, then decoding appends
    assert squeezed.cache.memory_bytes() < covering.cache.memory_bytes()


@dataclass
class ObservedLargestKeys(LargestKeys):
    """The same, declared as scoring from an observation window."""

    name: ClassVar[str] = "observed_largest_keys"
    observes_window: ClassVar[bool] = True


def test_registering_the_class_is_all_it_takes_to_use_it_by_name(tiny_llama, monkeypatch):
    """One registry entry makes the policy available by name; what eval reports about its window comes from
    the class (``observes_window``), not from a list of names elsewhere."""
    from headprobe.eval.presets import describe_window
    from headprobe.runtime.generate import make_policy
    from headprobe.runtime.policies import POLICIES

    for cls in (LargestKeys, ObservedLargestKeys):
        monkeypatch.setitem(POLICIES, cls.name, cls)
    policy = make_policy("largest_keys", window=6)
    assert isinstance(policy, LargestKeys) and policy.window == 6
    res = generate_compressed(tiny_llama, PROMPTS, policy="largest_keys", policy_options={"window": 6}, capacity=12,
                              max_new_tokens=1)
    assert res.cache.kept_tokens().unique().tolist() == [12]
    setting = {"name": "mine", "options": {"window": 6}}
    assert describe_window({**setting, "policy": "largest_keys"})[1] == "none"
    assert describe_window({**setting, "policy": "observed_largest_keys"})[1] == "6"
    assert describe_window({"name": "mine", "policy": "observed_largest_keys", "options": {}})[1] == "4"
