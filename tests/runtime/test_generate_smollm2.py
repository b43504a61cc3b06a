"""The runtime on the real SmolLM2-135M-Instruct: compression is real and the needle survives it."""

from __future__ import annotations

import random

import pytest
import torch

from headprobe.budget_map import BudgetMap
from headprobe.runtime.generate import generate_compressed
from headprobe.runtime.policies import POLICIES

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


_SUBJECTS = ["The farmer", "A young teacher", "The old captain", "My neighbour", "The baker", "A quiet student",
             "The mayor", "An engineer"]
_VERBS = ["walked to", "wrote about", "painted", "visited", "talked about", "repaired", "photographed", "described"]
_OBJECTS = ["the harbour", "a small garden", "the northern bridge", "the village market", "an empty library",
            "the river bank", "a wooden boat", "the morning train"]
_TAILS = ["before the rain started.", "on a cold afternoon.", "with great care.", "while the sun was setting.",
          "for the local newspaper.", "after a long week.", "during the spring festival.", "without telling anyone."]
NEEDLE = "The secret passcode for the vault is 4817-TULIP."
QUESTION = "Question: What is the secret passcode for the vault? Answer:"


def needle_prompt(tokenizer, tokens: int, seed: int = 0) -> str:
    """A haystack of simple varied sentences of about ``tokens`` tokens, the needle in the middle."""
    rng = random.Random(seed)
    sentences: list[str] = []
    while True:
        sentences.append(f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}")
        if len(sentences) % 20 == 0 and len(tokenizer(" ".join(sentences))["input_ids"]) > tokens:
            break
    sentences.insert(len(sentences) // 2, NEEDLE)
    return " ".join(sentences) + "\n\n" + QUESTION


def headkv_like_budget(identity, capacity: int = 128, window: int = 8, beta: float = 1.5) -> BudgetMap:
    """A HeadKV-shaped budget map (floor + score-weighted pool) from simple non-uniform head scores."""
    L, H = identity.num_layers, identity.num_kv_heads
    gen = torch.Generator().manual_seed(1)
    scores = torch.rand(L, H, generator=gen) ** 3
    scores = scores / scores.sum()
    b = capacity - window
    floor = b - b // beta
    pool = (b // beta) * L * H
    raw = scores * pool + floor
    budgets = raw.round().long() + window
    shares = (budgets.double() / budgets.sum()).tolist()
    shares[-1][-1] += 1 - sum(map(sum, shares))
    return BudgetMap(model=identity, method={"allocator": "headkv", "capacity": capacity, "beta": beta,
                                             "window": window}, shares=shares, budgets=budgets.tolist())


def test_needle_at_4k_survives_capacity_128_with_snapkv_and_headkv_budget(smollm2):
    prompt = needle_prompt(smollm2.tokenizer, 3900)
    bm = headkv_like_budget(smollm2.identity)
    res = generate_compressed(smollm2, prompt, policy="snapkv", budget=bm, max_new_tokens=16, chat=True)
    assert "4817" in res.texts[0]
    n = int(res.cache.prompt_lengths[0])
    assert n > 3900
    kept = res.cache.kept_tokens()[0] - 15                      # minus the appended answer tokens
    expected = torch.tensor(MapBudgetRows(bm, smollm2, n))
    assert torch.equal(kept, expected)
    assert int(kept.sum()) == bm.total and len(kept.unique()) > 5
    # Real bytes: the kept pairs plus the decode room (max_new_tokens - 1 rows a head: the last token is
    # never stored), against a full cache of the prompt.
    store = res.cache.stores[0]
    per_token = store.bytes_per_token()
    budget_bytes = (bm.total + 15 * 30 * 3) * per_token
    assert budget_bytes <= res.cache.memory_bytes() <= 1.05 * budget_bytes
    assert res.cache.memory_bytes() < res.cache.full_cache_bytes() / 20


def MapBudgetRows(bm, lm, n):
    from headprobe.runtime.budget_sources import MapBudget
    from headprobe.runtime.policies import SnapKV
    from headprobe.runtime.shape import CacheShape

    shape = CacheShape.from_config(lm.model.config)
    return MapBudget(bm, identity=lm.identity).resolve(shape, torch.tensor([n]), SnapKV())[0].tolist()


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_generates_200_tokens_batch_2(smollm2, policy):
    prompts = [needle_prompt(smollm2.tokenizer, 200, seed=1), needle_prompt(smollm2.tokenizer, 90, seed=2)]
    res = generate_compressed(smollm2, prompts, policy=policy, capacity=48, max_new_tokens=200,
                              min_new_tokens=200, chat=True)
    assert res.new_tokens.shape == (2, 200)
    kept = res.cache.kept_tokens()
    if policy in ("morphkv", "keydiff", "keepkv", "streaming", "layer_window"):
        assert int(kept.max()) <= 48                            # constant-size policies
    elif policy == "full":
        assert kept[0].unique().tolist() == [int(res.cache.prompt_lengths[0]) + 199]
    else:
        assert int(kept[0].float().mean().round()) == 48 + 199


def test_covering_budget_equals_full_cache_on_smollm2(smollm2):
    prompts = [needle_prompt(smollm2.tokenizer, 120, seed=3), needle_prompt(smollm2.tokenizer, 60, seed=4)]
    tok = smollm2.tokenizer
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True)
    ref = smollm2.model.generate(**enc, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
    res = generate_compressed(smollm2, prompts, policy="snapkv", capacity=4096, max_new_tokens=24)
    assert torch.equal(res.sequences, ref)
