"""The split attention of a block after a cached prefix equals masked SDPA, and a model forward that
uses it (fast-mode prompt forward) gives the same logits and attention rows as one that does not."""

from __future__ import annotations

from unittest import mock

import conftest
import pytest
import torch
import torch.nn.functional as F

from headprobe.attention.prefix_split import prefix_split_attention
from headprobe.attention.recorder import RowRecorder, RowRequest
from headprobe.models.cache_argument import with_cache


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
    model(prefix_ids, **with_cache(model, cache), use_cache=True)
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
        logits = model(suffix_ids, attention_mask=attention, **with_cache(model, cache), use_cache=True,
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


def _math_attend(query, key, value, causal, scaling):
    """A float64 stand-in for a fused kernel: the output and the log-sum-exp of each query row."""
    logits = torch.matmul(query.double(), key.double().transpose(-1, -2)) * scaling
    if causal:
        n = query.shape[2]
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(logits, -1)
    out = torch.matmul(torch.softmax(logits, -1), value.double())
    return out.to(query.dtype), lse.float()


def test_cpu_kernel_returns_the_log_sum_exp_of_the_scaled_logits():
    from headprobe.attention.prefix_split import attention_with_lse

    torch.manual_seed(3)
    query, key, value = torch.randn(2, 4, 19, 32), torch.randn(2, 4, 19, 32) * 3, torch.randn(2, 4, 19, 32)
    for causal in (False, True):
        out, lse = attention_with_lse(query, key, value, causal, 0.2)
        want_out, want_lse = _math_attend(query, key, value, causal, 0.2)
        torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)


def test_merge_of_two_partial_attentions_is_attention_over_both_key_sets():
    from headprobe.attention.prefix_split import merge_partial_attention

    torch.manual_seed(4)
    query, key, value = torch.randn(1, 3, 7, 16), torch.randn(1, 3, 50, 16) * 4, torch.randn(1, 3, 50, 16)
    # any split of the keys into two disjoint sets, here every third key against the rest
    pick = torch.arange(50) % 3 == 0
    out_a, lse_a = _math_attend(query, key[:, :, pick], value[:, :, pick], False, 0.3)
    out_b, lse_b = _math_attend(query, key[:, :, ~pick], value[:, :, ~pick], False, 0.3)
    want, _ = _math_attend(query, key, value, False, 0.3)
    torch.testing.assert_close(merge_partial_attention(out_a, lse_a, out_b, lse_b), want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("prefix", [0, 29])
def test_split_with_another_kernel_equals_masked_sdpa(prefix):
    """The split and merge are device-independent: with any kernel that returns the log-sum-exp (the CUDA
    path passes flash or memory-efficient attention, here a float64 stand-in) they give masked SDPA."""
    torch.manual_seed(5)
    query = torch.randn(2, 8, 21, 32)
    key, value = torch.randn(2, 2, prefix + 21, 32) * 2, torch.randn(2, 2, prefix + 21, 32)
    got = prefix_split_attention(query, key, value, prefix, 0.17, attend=_math_attend)
    torch.testing.assert_close(got, _masked_sdpa(query, key, value, prefix, 0.17), atol=2e-6, rtol=1e-5)


def test_layers_that_cannot_split_build_the_mask_the_split_left_out():
    """With the split promised, no model-wide mask is built; a layer that cannot split (soft-capping,
    sinks, an unsupported device) builds it itself and gives what masked SDPA gives."""
    from transformers import masking_utils

    lm = conftest.make_tiny_llama()
    torch.manual_seed(1)
    prefix_ids = torch.randint(3, 300, (1, 40))
    suffix_ids = torch.randint(3, 300, (2, 25))
    pads = [0, 6]
    plain_logits, plain_rows = _prompt_forward(lm, prefix_ids, suffix_ids, pads, prefix_visible=False)
    with mock.patch("headprobe.attention.recorder.prefix_split_supported", return_value=False), \
            mock.patch.object(masking_utils, "sdpa_mask", wraps=masking_utils.sdpa_mask) as model_wide, \
            mock.patch.object(RowRecorder, "_block_mask", autospec=True,
                              side_effect=RowRecorder._block_mask) as per_layer:
        logits, rows = _prompt_forward(lm, prefix_ids, suffix_ids, pads, prefix_visible=True)
    assert model_wide.call_count == 0
    assert per_layer.call_count == lm.identity.num_layers
    for a, b in zip(plain_logits, logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for layer in plain_rows:
        torch.testing.assert_close(plain_rows[layer], rows[layer], atol=1e-6, rtol=1e-5)
