"""The runtime on the real Gemma 3 270M: sliding-window layers keep their window, global layers compress."""

from __future__ import annotations

import pytest
import torch

from headprobe import generate_compressed

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def test_gemma3_sliding_layers_and_compressed_global_layers(gemma3):
    text = ("The farmer walked to the harbour before the rain started. " * 90
            + "The secret passcode for the vault is 4817-TULIP. "
            + "A young teacher painted a small garden. " * 20 + "The secret passcode for the vault is")
    enc = gemma3.tokenizer([text], return_tensors="pt")
    assert enc["input_ids"].shape[1] > 1024                   # longer than the 512-token window
    ref = gemma3.model.generate(**enc, max_new_tokens=6, do_sample=False)
    full = generate_compressed(gemma3, text, policy="full", max_new_tokens=6)
    assert torch.equal(full.sequences, ref)
    res = generate_compressed(gemma3, text, policy="snapkv", capacity=64, max_new_tokens=6)
    assert "4817" in res.texts[0]
    kept = res.cache.kept_tokens()[0, :, 0]
    sliding = [t == "sliding_attention" for t in res.cache.layer_types]
    assert all(int(k) == 512 for k, s in zip(kept, sliding) if s)
    assert all(int(k) == 64 + 5 for k, s in zip(kept, sliding) if not s)
    assert res.cache.memory_bytes() < 0.4 * res.cache.full_cache_bytes()
