"""The row recorder on tiny models (a sliding-window one included) equals eager attention."""

from __future__ import annotations

import pytest
import torch

from headprobe.attention.recorder import RowRecorder, RowRequest
from headprobe.models.cache_argument import with_cache


@pytest.mark.parametrize("maker", ["make_tiny_llama", "make_tiny_gemma3"])
def test_recorder_rows_equal_eager_attention(maker):
    import conftest
    from transformers import DynamicCache

    lm = getattr(conftest, maker)()
    model = lm.model
    ids = torch.randint(3, 300, (1, 40))
    reference = model(ids).logits
    model.set_attn_implementation("eager")
    eager = model(ids, output_attentions=True).attentions
    model.set_attn_implementation("sdpa")
    got = {}
    with RowRecorder(model) as rec:
        rec.request = RowRequest(torch.tensor([[35, 39]]), 0, lambda l, r, kp: got.__setitem__(l, r))
        out = model(ids).logits
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(out, reference)          # recording does not change the forward
    for layer, rows in got.items():
        torch.testing.assert_close(rows, eager[layer][:, :, [35, 39]], atol=1e-6, rtol=1e-5)
    # the second block of a cached forward: rows over all 40 keys
    cache = DynamicCache()
    model(ids[:, :30], **with_cache(model, cache))
    got.clear()
    with RowRecorder(model) as rec:
        rec.request = RowRequest(torch.tensor([[35, 39]]), 30, lambda l, r, kp: got.__setitem__(l, r))
        model(ids[:, 30:], **with_cache(model, cache))
    for layer, rows in got.items():
        torch.testing.assert_close(rows, eager[layer][:, :, [35, 39]], atol=1e-6, rtol=1e-5)
