"""The prompt attention takes paths a fused SDPA kernel accepts and computes what masked GQA attention does."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from headprobe.attention.rows import masked_attention
from headprobe.runtime.prefill_attention import prefill_attention, prompt_mask


def _prompt(pad: list[int], n: int = 24, q_heads: int = 6, kv_heads: int = 2, dim: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b = len(pad)
    query = torch.randn(b, q_heads, n, dim, generator=g)
    keys, values = torch.randn(b, kv_heads, n, dim, generator=g), torch.randn(b, kv_heads, n, dim, generator=g)
    positions = torch.arange(n)[None, :] - torch.tensor(pad)[:, None]
    return query, keys, values, positions, positions >= 0


def _sdpa_calls():
    calls = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    return calls, mock.patch.object(F, "scaled_dot_product_attention", spy)


@pytest.mark.parametrize("pad, window", [([0, 5], None), ([0, 0], 7), ([3, 0], 7), ([0, 0], None)])
def test_prompt_attention_equals_masked_gqa_sdpa_and_never_sends_mask_with_gqa(pad, window):
    query, keys, values, positions, valid = _prompt(pad)
    calls, spy = _sdpa_calls()
    with spy:
        got = prefill_attention(query, keys, values, positions, valid, 0.25, sliding_window=window)
    # What the prompt attention computed before: one SDPA call with the mask and enable_gqa.
    visible = prompt_mask(positions, valid, window)
    before = F.scaled_dot_product_attention(query, keys, values, attn_mask=visible[:, None], scale=0.25,
                                            enable_gqa=True)
    torch.testing.assert_close(got, before, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, masked_attention(query, keys, values, visible[:, None], 0.25), atol=1e-5,
                               rtol=1e-5)
    assert len(calls) == 1
    masked = calls[0].get("attn_mask") is not None
    assert masked == (max(pad) > 0 or window is not None)
    assert not (masked and calls[0].get("enable_gqa")), "a mask with enable_gqa falls back to the math kernel"


def test_soft_capped_prompt_attention_is_the_float32_primitive():
    query, keys, values, positions, valid = _prompt([2, 0], seed=1)
    got = prefill_attention(query, keys, values, positions, valid, 0.25, sliding_window=9, softcap=3.0)
    group = query.shape[1] // keys.shape[1]
    logits = query @ keys.repeat_interleave(group, 1).transpose(-1, -2) * 0.25      # the explicit reference
    logits = 3.0 * torch.tanh(logits / 3.0)
    logits = logits.masked_fill(~prompt_mask(positions, valid, 9)[:, None], float("-inf"))
    want = torch.softmax(logits, -1) @ values.repeat_interleave(group, 1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_padding_rows_see_themselves_and_real_rows_never_see_padding():
    _, _, _, positions, valid = _prompt([4, 0], n=8)
    visible = prompt_mask(positions, valid, None)
    assert torch.equal(visible[0, :4], torch.eye(8, dtype=torch.bool)[:4])   # padding rows: themselves only
    assert not bool(visible[0, 4:, :4].any())                   # real tokens of row 0 ignore its padding
    assert torch.equal(visible[1], torch.ones(8, 8, dtype=torch.bool).tril())
