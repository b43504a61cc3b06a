"""Triton kernels (interpreted on CPU with TRITON_INTERPRET=1) agree with the PyTorch path."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

triton = pytest.importorskip("triton")

from headprobe.runtime.kernels import dispatch
from headprobe.runtime.kernels.torch_ref import ragged_attention_torch
from headprobe.runtime.store import LayerStore, Selection

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs CUDA or TRITON_INTERPRET=1")


def _ragged_store(batch=2, heads=3, n=40, d=16, votes=False, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(batch, heads, n, d, generator=g, dtype=dtype)
    values = torch.randn(batch, heads, n, d, generator=g, dtype=dtype)
    positions = torch.arange(n)[None, :].repeat(batch, 1) - torch.tensor([[0], [5]])[:batch]
    count = torch.randint(1, n - 5, (batch * heads,), generator=g)
    index = torch.stack([torch.randperm(n - 5, generator=g)[: int(count.max())] + 5 for _ in range(batch * heads)])
    sel = Selection(index=index, count=count)
    return keys, values, positions, sel


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_compaction_kernel_matches_torch(dtype):
    keys, values, positions, sel = _ragged_store(dtype=dtype)
    stores = {}
    for backend in ("torch", "triton"):
        previous = dispatch.set_backend(backend)
        try:
            store = LayerStore(2, 3, 16, sel.count + 7, dtype, torch.device("cpu"))
            store.write_selection(keys, values, positions, sel)
        finally:
            dispatch.set_backend(previous)
        stores[backend] = store
    a, b = stores["torch"], stores["triton"]
    assert torch.equal(a.lengths, b.lengths) and torch.equal(a.lengths, sel.count)
    va, vb = a.padded(), b.padded()
    for key in ("keys", "values", "positions"):
        assert torch.equal(va[key][va["valid"]], vb[key][vb["valid"]]), key


@pytest.mark.parametrize("votes,window,split", [(False, None, 256), (True, None, 8), (False, 12, 8)])
def test_ragged_decode_kernel_matches_torch(votes, window, split):
    from headprobe.runtime.kernels.ragged_decode import ragged_decode_triton

    keys, values, positions, sel = _ragged_store(votes=votes, seed=1)
    store = LayerStore(2, 3, 16, sel.count + 1, torch.float32, torch.device("cpu"), votes=votes)
    store.write_selection(keys, values, positions, sel)
    if votes:
        store.log_votes.copy_(torch.rand(store.log_votes.shape).log1p())
    query = torch.randn(2, 6, 1, 16)                      # GQA: 2 query heads per KV head
    qpos = torch.tensor([[40], [35]])
    fast = ragged_decode_triton(query, store, qpos, 0.25, window, split=split, block_n=4)
    view = store.padded()
    ref = ragged_attention_torch(query, view["keys"], view["values"], view["positions"], view["valid"], qpos,
                                 0.25, window, None, view.get("log_votes"))
    assert torch.allclose(fast, ref, atol=1e-5, rtol=1e-4)


def test_dispatch_falls_back_once_without_triton_device(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    dispatch._warned.clear()
    previous = dispatch.set_backend("triton")
    try:
        with pytest.warns(RuntimeWarning, match="using the PyTorch path"):
            assert dispatch._use_triton(torch.device("cpu")) is False
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert dispatch._use_triton(torch.device("cpu")) is False   # said once only
    finally:
        dispatch.set_backend(previous)


def test_generate_with_triton_kernels_matches_torch_path(tiny_llama):
    from headprobe.runtime import generate_compressed

    prompts = ["The river ran past the old mill. Fishermen waited on the bank. " * 2, "The secret code is blue"]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        outs = {}
        for backend in ("torch", "triton"):
            previous = dispatch.set_backend(backend)
            try:
                res = generate_compressed(tiny_llama, prompts, policy="keepkv", capacity=12, max_new_tokens=6)
            finally:
                dispatch.set_backend(previous)
            outs[backend] = res.sequences
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs["torch"], outs["triton"])
