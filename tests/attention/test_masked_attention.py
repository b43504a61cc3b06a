"""The one masked attention primitive equals attention with the keys repeated per query head."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from headprobe.attention.rows import attention_rows, masked_attention


def _reference(query, key, value, visible, scaling, softcap=None, log_bias=None):
    """Float64, KV heads repeated to the query heads, mask broadcast to every query head."""
    group = query.shape[1] // key.shape[1]
    k = key.double().repeat_interleave(group, 1)
    v = value.double().repeat_interleave(group, 1)
    logits = query.double() @ k.transpose(-1, -2) * scaling
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    if log_bias is not None:
        logits = logits + log_bias.double().repeat_interleave(group, 1)[:, :, None, :]
    mask = visible.expand(query.shape[0], key.shape[1], *visible.shape[2:]).repeat_interleave(group, 1)
    probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
    return probs @ v, probs


@pytest.mark.parametrize("softcap", [None, 5.0])
@pytest.mark.parametrize("per_head_mask", [False, True])
def test_masked_attention_equals_repeated_keys(softcap, per_head_mask):
    torch.manual_seed(0)
    b, hq, hkv, n, keys, d = 2, 6, 2, 5, 11, 8
    query, key = torch.randn(b, hq, n, d), torch.randn(b, hkv, keys, d) * 2
    value, bias = torch.randn(b, hkv, keys, d), torch.randn(b, hkv, keys)
    visible = torch.rand(b, hkv if per_head_mask else 1, n, keys) > 0.3
    visible[0, 0, 1] = False                                     # a row that sees nothing
    out, probs = masked_attention(query, key, value, visible, 0.3, softcap=softcap, log_bias=bias,
                                  return_probs=True)
    want_out, want_probs = _reference(query, key, value, visible, 0.3, softcap, bias)
    assert out.dtype == query.dtype and probs.dtype == torch.float32
    torch.testing.assert_close(out.double(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(probs.double(), want_probs, atol=1e-6, rtol=1e-5)
    assert float(probs[0, 0, 1].abs().sum()) == 0.0 and float(out[0, 0, 1].abs().sum()) == 0.0
    assert torch.equal(masked_attention(query, key, None, visible, 0.3, softcap=softcap, log_bias=bias), probs)


def test_masked_attention_equals_sdpa_under_a_causal_mask():
    torch.manual_seed(1)
    query, key, value = torch.randn(1, 4, 9, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    got = masked_attention(query, key, value, causal[None, None], 0.25)
    want = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=0.25, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_attention_rows_are_the_primitives_probabilities_under_the_position_mask():
    torch.manual_seed(2)
    b, hq, hkv, rows, keys, d = 2, 4, 1, 3, 20, 8
    query, key = torch.randn(b, hq, rows, d), torch.randn(b, hkv, keys, d)
    positions = torch.tensor([[17, 18, 19], [10, 15, 19]])
    key_mask = torch.ones(b, keys, dtype=torch.bool)
    key_mask[1, :4] = False
    got = attention_rows(query, key, positions, 0.5, sliding_window=6, key_mask=key_mask)
    kp = torch.arange(keys)
    visible = (kp[None, None, :] <= positions[:, :, None]) & (positions[:, :, None] - kp[None, None, :] < 6)
    visible &= key_mask[:, None, :]
    _, want = _reference(query, key, torch.zeros(b, hkv, keys, 1), visible[:, None], 0.5)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)
    assert torch.allclose(got.sum(-1), torch.ones(b, hq, rows))
    assert float(got[0, :, 0, :12].abs().sum()) == 0.0 and float(got[0, :, 0, 18:].abs().sum()) == 0.0
