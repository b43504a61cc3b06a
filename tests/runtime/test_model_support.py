"""Models whose attention does not pass Cache.update's result unchanged to the attention function are refused
in one line instead of producing garbage; models the cache cannot run are refused up front."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama import modeling_llama
from transformers.models.llama.modeling_llama import ALL_ATTENTION_FUNCTIONS, apply_rotary_pos_emb, repeat_kv

from headprobe import HeadprobeError
from headprobe.runtime.generate import generate_compressed
from headprobe.runtime.shared_prefill import generate_from_prefill, record_prefill

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["The river ran past the old mill. Fishermen waited on the bank while the rain came down. " * 2,
           "The secret code is blue tulip seven."]


def _attention_that(touch, use_returned: bool = True):
    """LlamaAttention.forward, with ``touch(key, value)`` applied to what ``update`` returned before the
    attention function (or, with ``use_returned=False``, the update's result ignored and the layer's own
    keys sent to a fixed eager attention)."""

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None,
                past_key_values=None, **kwargs):
        cache = cache if cache is not None else past_key_values     # the name before transformers 5.24
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        query = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        query, key = apply_rotary_pos_emb(query, key, *position_embeddings)
        if cache is not None:
            returned = cache.update(key, value, self.layer_idx)
            if use_returned:
                key, value = touch(*returned)
        interface = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        if not use_returned:
            interface = modeling_llama.eager_attention_forward
        out, weights = interface(self, query, key, value, attention_mask, dropout=0.0, scaling=self.scaling,
                                 **kwargs)
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights

    return forward


def _reads_shape(key, value):
    assert key.shape[-1] > 0
    return key, value


def _concatenates(key, value):
    return torch.cat([key[:, :, :0], key], 2), value


def _repeats(key, value):
    return repeat_kv(key, 2), repeat_kv(value, 2)


@pytest.mark.parametrize("touch, what", [(_reads_shape, r"\(\.shape\)"), (_concatenates, r"\(__getitem__\)"),
                                         (_repeats, r"\(\.shape\)")])
def test_attention_that_uses_the_returned_keys_as_tensors_is_refused(tiny_llama, monkeypatch, touch, what):
    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", _attention_that(touch))
    with pytest.raises(HeadprobeError, match="uses the keys/values returned by CompressedCache.update") as err:
        generate_compressed(tiny_llama, PROMPTS, policy="snapkv", capacity=12, max_new_tokens=4)
    assert "\n" not in str(err.value) and str(err.value).startswith("layer 0: ")
    assert err.match(what)
    assert tiny_llama.model.config._attn_implementation == "sdpa"          # switched back


def test_torch_function_on_the_returned_keys_is_refused(tiny_llama, monkeypatch):
    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward",
                        _attention_that(lambda k, v: (torch.cat([k, k], 2), v)))
    with pytest.raises(HeadprobeError, match=r"as tensors \(cat\)"):
        generate_compressed(tiny_llama, PROMPTS, policy="snapkv", capacity=12, max_new_tokens=4)


def test_attention_that_ignores_the_returned_keys_is_refused(tiny_llama, monkeypatch):
    """Its prompt forward attends over its own tensors and the cache never sees the layer's attention:
    refused at the next update, or after a forward that was the only one."""
    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", _attention_that(None, use_returned=False))
    for new in (4, 1):
        with pytest.raises(HeadprobeError, match="never reached the headprobe attention"):
            generate_compressed(tiny_llama, PROMPTS, policy="snapkv", capacity=12, max_new_tokens=new)
    with pytest.raises(HeadprobeError, match="never reached the headprobe attention"):
        record_prefill(tiny_llama, PROMPTS)


def test_the_same_attention_passing_the_keys_unchanged_works(tiny_llama, monkeypatch):
    """The control: the hand-written forward above, touching nothing, gives the stock forward's answer."""
    want = generate_compressed(tiny_llama, PROMPTS, policy="snapkv", capacity=12, max_new_tokens=6)
    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", _attention_that(lambda k, v: (k, v)))
    got = generate_compressed(tiny_llama, PROMPTS, policy="snapkv", capacity=12, max_new_tokens=6)
    assert torch.equal(got.sequences, want.sequences)


def test_model_without_the_attention_interface_is_refused(tiny_llama, monkeypatch):
    monkeypatch.setattr(type(tiny_llama.model), "_supports_attention_backend", False)
    with pytest.raises(HeadprobeError, match="LlamaForCausalLM does not route its attention through"):
        generate_compressed(tiny_llama, PROMPTS, capacity=12, max_new_tokens=1)


def test_support_is_checked_once_per_call_and_before_the_policy(tiny_llama, monkeypatch):
    """Each entry point checks the model once (``headprobe_attention`` does), before the policy and budget
    are looked at: an unsupported model with a bad option is refused for the model."""
    from headprobe.runtime import cache

    calls = []
    check = cache.check_supported
    monkeypatch.setattr(cache, "check_supported", lambda model: (calls.append(1), check(model))[1])
    generate_compressed(tiny_llama, PROMPTS, capacity=12, max_new_tokens=3)
    assert len(calls) == 1
    record = record_prefill(tiny_llama, PROMPTS)
    assert len(calls) == 2
    generate_from_prefill(tiny_llama, record, capacity=12, max_new_tokens=3)
    assert len(calls) == 3
    monkeypatch.setattr(type(tiny_llama.model), "_supports_attention_backend", False)
    for run in (lambda: generate_compressed(tiny_llama, PROMPTS, policy="snapkv", policy_options={"nope": 1}),
                lambda: generate_from_prefill(tiny_llama, record, policy="snapkv", policy_options={"nope": 1})):
        with pytest.raises(HeadprobeError, match="does not route its attention through"):
            run()


def test_sliding_window_the_config_does_not_declare_is_refused(tiny_llama, monkeypatch):
    """An attention passing a window on a layer the config calls full would be compressed with the wrong
    policy and budgets: refused, naming the layer."""
    stock = modeling_llama.LlamaAttention.forward

    def windowed(self, *args, **kwargs):
        return stock(self, *args, sliding_window=4, **kwargs)

    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", windowed)
    with pytest.raises(HeadprobeError, match="layer 0: the attention passes sliding_window=4 but the config "
                                             "declares it 'full_attention'"):
        generate_compressed(tiny_llama, PROMPTS, capacity=12, max_new_tokens=1)
