"""The split attention of a block after a cached prefix equals masked SDPA, and a model forward that
uses it (fast-mode prompt forward) gives the same logits and attention rows as one that does not."""

from __future__ import annotations

from unittest import mock

import conftest
import pytest
import torch
import torch.nn.functional as F

from headprobe.attention import RowRecorder, RowRequest
from headprobe.attention.prefix_split import prefix_split_attention


def _masked_sdpa(query, key, value, prefix, scale):
    """The reference: one SDPA call with the explicit mask, KV heads repeated. ``[b, block, h, d]``."""
    group = query.shape[1] // key.shape[1]
    block = query.shape[2]
    visible = torch.arange(key.shape[2])[None, :] <= prefix + torch.arange(block)[:, None]
    out = F.scaled_dot_product_attention(query, key.repeat_interleave(group, 1), value.repeat_interleave(group, 1),
                                         attn_mask=visible, scale=scale)
    return out.transpose(1, 2)


@pytest.mark.parametrize("prefix", [0, 1, 37, 200])
def test_split_equals_masked_sdpa_with_gqa(prefix):
    torch.manual_seed(prefix)
    batch, q_heads, kv_heads, block, dim = 2, 9, 3, 53, 64
    query = torch.randn(batch, q_heads, block, dim)
    key = torch.randn(batch, kv_heads, prefix + block, dim) * 2
    value = torch.randn(batch, kv_heads, prefix + block, dim)
    got = prefix_split_attention(query, key, value, prefix, 0.125)
    assert got.shape == (batch, block, q_heads, dim)
    torch.testing.assert_close(got, _masked_sdpa(query, key, value, prefix, 0.125), atol=2e-6, rtol=1e-5)


def test_split_rejects_keys_that_are_not_prefix_plus_block():
    query = torch.randn(1, 2, 5, 8)
    key = torch.randn(1, 2, 12, 8)
    with pytest.raises(ValueError, match="prefix \\+ block = 11"):
        prefix_split_attention(query, key, key, 6, 1.0)


def _prompt_forward(lm, prefix_ids, suffix_ids, pad_lengths, prefix_visible):
    """Fast mode's prompt forward: a shared cached prefix, right-padded suffixes, rows at each last token."""
    from transformers import DynamicCache

    model = lm.model
    batch, width = suffix_ids.shape
    prefix = prefix_ids.shape[1]
    cache = DynamicCache()
    model(prefix_ids, past_key_values=cache, use_cache=True)
    for layer in cache.layers:
        layer.keys = layer.keys.expand(batch, -1, -1, -1).contiguous()
        layer.values = layer.values.expand(batch, -1, -1, -1).contiguous()
    attention = torch.ones(batch, prefix + width, dtype=torch.long)
    for b, n in enumerate(pad_lengths):
        if n:
            attention[b, -n:] = 0
    last = torch.tensor([[prefix + width - 1 - n] for n in pad_lengths])
    rows = {}
    with RowRecorder(model) as rec:
        rec.request = RowRequest(last, prefix, lambda layer, r, kp: rows.__setitem__(layer, r),
                                 key_mask=attention.bool(), prefix_visible=prefix_visible)
        logits = model(suffix_ids, attention_mask=attention, past_key_values=cache, use_cache=True,
                       position_ids=torch.arange(prefix, prefix + width)[None].expand(batch, -1)).logits
    valid = [logits[b, :width - n] for b, n in enumerate(pad_lengths)]
    return valid, rows


@pytest.mark.parametrize("maker, split_layers", [("make_tiny_llama", 4), ("make_tiny_gemma3", 1)])
def test_prompt_forward_with_split_attention_matches_masked(maker, split_layers):
    lm = getattr(conftest, maker)()
    torch.manual_seed(1)
    prefix_ids = torch.randint(3, 300, (1, 40))
    suffix_ids = torch.randint(3, 300, (2, 25))
    pads = [0, 6]
    plain_logits, plain_rows = _prompt_forward(lm, prefix_ids, suffix_ids, pads, prefix_visible=False)
    with mock.patch("headprobe.attention.recorder.prefix_split_attention", wraps=prefix_split_attention) as spy:
        split_logits, split_rows = _prompt_forward(lm, prefix_ids, suffix_ids, pads, prefix_visible=True)
    # the split ran on the global-attention layers only (Gemma 3's sliding layers keep masked SDPA)
    assert spy.call_count == split_layers
    for a, b in zip(plain_logits, split_logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert plain_rows.keys() == split_rows.keys()
    for layer in plain_rows:
        torch.testing.assert_close(plain_rows[layer], split_rows[layer], atol=1e-6, rtol=1e-5)
