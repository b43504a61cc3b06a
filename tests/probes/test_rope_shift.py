"""Re-rotating cached keys for a position shift: exact against a fresh forward's keys.

Layer 0's keys depend only on the token and its position, so the keys of a segment that follows a
prefix of ``a`` tokens, moved by ``d``, must equal the keys of the same segment after ``a + d`` tokens.
"""

from __future__ import annotations

import conftest
import pytest
import torch
from transformers import DynamicCache

from headprobe import HeadprobeError
from headprobe.attention.rope_shift import layer_rotation, shift_cos_sin, shift_keys, shifted_keys
from headprobe.models.cache_argument import with_cache


def _layer_keys(model, ids: torch.Tensor, layer: int = 0) -> torch.Tensor:
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=ids, **with_cache(model, cache), use_cache=True)
    return cache.layers[layer].keys


def _segment_keys(lm, prefix: int, shift: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer-0 keys of one 40-token segment after ``prefix`` and after ``prefix + shift`` other tokens."""
    g = torch.Generator().manual_seed(seed)
    vocab = lm.model.config.vocab_size
    segment = torch.randint(5, vocab, (1, 40), generator=g)
    before = torch.randint(5, vocab, (1, prefix), generator=g)
    longer = torch.randint(5, vocab, (1, prefix + shift), generator=g)
    k1 = _layer_keys(lm.model, torch.cat([before, segment], 1))[:, :, prefix:]
    k2 = _layer_keys(lm.model, torch.cat([longer, segment], 1))[:, :, prefix + shift:]
    return k1, k2


def _llama(**rope):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = conftest._tiny_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
                         **rope)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.config._attn_implementation = "sdpa"
    return conftest.LoadedModel(model=model, tokenizer=tok, identity=conftest.identity_from_config(config, "t", "t"))


ROPES = {
    "default": {},
    "llama3": {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 256}},
    "yarn": {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 256}},
    "linear": {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}},
}


@pytest.mark.parametrize("rope", sorted(ROPES))
@pytest.mark.parametrize(("prefix", "shift"), [(10, 17), (60, 3), (25, -12)])
def test_shifted_keys_equal_fresh_keys_llama(rope, prefix, shift):
    lm = _llama(**ROPES[rope])
    k1, k2 = _segment_keys(lm, prefix, shift)
    assert (k1 - k2).abs().max() > 1e-2                      # the shift matters
    torch.testing.assert_close(shifted_keys(lm.model, 0, k1, shift), k2, atol=2e-5, rtol=1e-5)


def test_yarn_scaling_is_not_applied_twice():
    lm = _llama(**ROPES["yarn"])
    rotation = layer_rotation(lm.model, 0)
    assert rotation.attention_scaling != 1.0                 # yarn scales cos and sin
    cos, sin = shift_cos_sin(rotation, 5, torch.zeros(1))
    torch.testing.assert_close(cos ** 2 + sin ** 2, torch.ones_like(cos))   # a pure rotation


@pytest.mark.parametrize("first_layer", ["sliding_attention", "full_attention"])
def test_shifted_keys_equal_fresh_keys_gemma3(first_layer):
    """Gemma 3's local and global layers rotate with different bases; each layer uses its own."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tok = conftest._tiny_tokenizer()
    other = "full_attention" if first_layer == "sliding_attention" else "sliding_attention"
    config = Gemma3TextConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=512,
                              layer_types=[first_layer, other], max_position_embeddings=4096)
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config).eval()
    model.config._attn_implementation = "sdpa"
    lm = conftest.LoadedModel(model=model, tokenizer=tok, identity=conftest.identity_from_config(config, "g", "t"))
    k1, k2 = _segment_keys(lm, 30, 21)
    torch.testing.assert_close(shifted_keys(model, 0, k1, 21), k2, atol=2e-5, rtol=1e-5)
    local, full = (layer_rotation(model, i) for i in (0, 1))
    assert {local.layer_type, full.layer_type} == {"sliding_attention", "full_attention"}
    assert not torch.allclose(shift_cos_sin(local, 21, k1)[0], shift_cos_sin(full, 21, k1)[0])


def test_rotations_compose_and_invert():
    """Up to the float32 angles the rotary module computes."""
    lm = _llama()
    rotation = layer_rotation(lm.model, 0)
    keys = torch.randn(1, 2, 7, 16, dtype=torch.float64)
    back = shift_keys(shift_keys(keys, *shift_cos_sin(rotation, 9, keys)), *shift_cos_sin(rotation, -9, keys))
    torch.testing.assert_close(back, keys, atol=1e-6, rtol=1e-6)
    two_steps = shift_keys(shift_keys(keys, *shift_cos_sin(rotation, 4, keys)), *shift_cos_sin(rotation, 5, keys))
    torch.testing.assert_close(two_steps, shift_keys(keys, *shift_cos_sin(rotation, 9, keys)), atol=1e-6, rtol=1e-6)


def test_length_dependent_rope_is_refused_in_one_line():
    lm = _llama(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(HeadprobeError, match="rope type 'dynamic'") as info:
        layer_rotation(lm.model, 0)
    assert "\n" not in str(info.value)
