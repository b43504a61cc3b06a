"""The decode room: a compressed cache never reserves more up front than a full cache would hold for the same
tokens, grows in steps when decoding fills it, and answers as before."""

from __future__ import annotations

import numpy as np
import torch

from headprobe.runtime.decode_room import FIRST_STEP, first_room, grown_capacity
from headprobe.runtime.generate import generate_compressed

torch.set_num_threads(1)


def _ids(lm, n: int) -> torch.Tensor:
    return torch.randint(5, lm.model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(3))


def _stopping_early(lm, ids, new: int, stop_at: int, **setting) -> dict:
    """``generate`` arguments that end the answer of ``setting`` after ``stop_at`` of ``new`` tokens (its token
    then is EOS)."""
    first = generate_compressed(lm, input_ids=ids, max_new_tokens=stop_at, **setting)
    return {"eos_token_id": int(first.new_tokens[0, -1]), "pad_token_id": int(first.new_tokens[0, -1]),
            "max_new_tokens": new}


def test_a_short_answer_on_a_short_prompt_never_costs_more_than_the_full_cache(tiny_llama):
    ids = _ids(tiny_llama, 24)
    setting = {"policy": "snapkv", "capacity": 8, "policy_options": {"window": 4}}
    res = generate_compressed(tiny_llama, input_ids=ids, **setting, **_stopping_early(tiny_llama, ids, 64, 3, **setting))
    assert res.new_tokens.shape[1] <= 3                              # the answer stopped after 3 of 64
    assert res.cache.memory_bytes() <= res.cache.full_cache_bytes()
    assert all(int(s.host_capacity.max()) <= 24 for s in res.cache.stores)


def test_a_budget_holding_the_prompt_answers_as_the_stock_cache_and_grows_in_steps(tiny_llama):
    ids = _ids(tiny_llama, 20)
    stock = tiny_llama.model.generate(ids, max_new_tokens=40, do_sample=False, min_new_tokens=40,
                                      pad_token_id=tiny_llama.tokenizer.pad_token_id)[:, 20:]
    res = generate_compressed(tiny_llama, input_ids=ids, policy="snapkv", capacity=64, max_new_tokens=40,
                              min_new_tokens=40)
    assert torch.equal(res.new_tokens, stock)
    caps = {int(c) for s in res.cache.stores for c in s.host_capacity}
    assert caps == {int(grown_capacity(np.array([20 + FIRST_STEP]), np.array([20 + 39]))[0])}
    assert max(caps) - (20 + 39) < max(caps) // 8 + FIRST_STEP     # at most one step of unused room


def test_the_first_room_is_what_the_head_dropped_at_most_and_what_can_still_come():
    kept, asked = np.array([24, 10, 2]), np.array([64, 64, 64])
    assert first_room(asked, kept, 24, 64).tolist() == [FIRST_STEP, 14, 22]
    assert first_room(asked, kept, 24, 5).tolist() == [4, 4, 4]    # the 5th new token is never fed back
    assert first_room(np.array([1, 1, 1]), kept, 24, 64).tolist() == [1, 1, 1]


def test_sliding_layers_do_not_reserve_their_whole_window_for_a_short_prompt(tiny_gemma3):
    ids = _ids(tiny_gemma3, 4)
    setting = {"policy": "snapkv", "capacity": 8, "policy_options": {"window": 4}}
    res = generate_compressed(tiny_gemma3, input_ids=ids, **setting,
                              **_stopping_early(tiny_gemma3, ids, 64, 2, **setting))
    assert res.new_tokens.shape[1] <= 2
    window = tiny_gemma3.model.config.sliding_window
    assert all(int(s.host_capacity.max()) <= 4 + FIRST_STEP < window for s in res.cache.stores)


def test_a_long_prompt_kept_whole_gets_room_for_a_short_answer_without_regrowing():
    kept = np.array([4000, 800])
    assert first_room(np.array([64, 64]), kept, 4000, 32).tolist() == [31, 31]
    assert first_room(np.array([5000, 5000]), kept, 4000, 4000).tolist() == [500, 3200]
