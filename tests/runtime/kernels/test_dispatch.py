"""Backend choice: Triton where it can launch, the PyTorch path otherwise, and a failed first launch falls
back with one warning instead of crashing generation."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

from headprobe.runtime.store import LayerStore, Selection

triton = pytest.importorskip("triton")

from headprobe.runtime.kernels import compact as compact_mod
from headprobe.runtime.kernels import ragged_decode as rd

LAUNCHER_ERROR = "Failed to find C compiler. Please specify via CC environment variable."


def _prompt(seed=0, votes=False):
    g = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(2, 3, 40, 16, generator=g), torch.randn(2, 3, 40, 16, generator=g)
    positions = torch.arange(40)[None, :].repeat(2, 1)
    count = torch.randint(1, 35, (6,), generator=g)
    index = torch.stack([torch.randperm(40, generator=g)[: int(count.max())] for _ in range(6)])
    return keys, values, positions, Selection(index=index, count=count)


def _store(keys, values, positions, sel, votes=False):
    store = LayerStore().allocate(2, 3, 16, sel.count + 2, keys.dtype, keys.device, votes=votes)
    store.write_selection(keys, values, positions, sel)
    return store


def _torch_results(dispatch, keys, values, positions, sel, query, qpos):
    previous = dispatch.set_kernel_backend("torch")
    try:
        store = _store(keys, values, positions, sel)
        return store, dispatch.ragged_attention(query, store, qpos, 0.25)
    finally:
        dispatch.set_kernel_backend(previous)


def _failing(calls):
    def launch(*args, **kwargs):
        calls.append(1)
        raise RuntimeError(LAUNCHER_ERROR)
    return launch


def test_triton_availability_is_checked_once(fresh_dispatch, monkeypatch):
    fresh_dispatch.triton_available.cache_clear()
    monkeypatch.setitem(sys.modules, "triton", None)              # importing triton now raises ImportError
    try:
        assert fresh_dispatch.triton_available() is False
        monkeypatch.delitem(sys.modules, "triton")
        assert fresh_dispatch.triton_available() is False          # cached: not imported again per call
    finally:
        fresh_dispatch.triton_available.cache_clear()
    assert fresh_dispatch.triton_available() is True


def test_auto_uses_triton_for_cuda_tensors_only(fresh_dispatch, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fresh_dispatch._use_triton(torch.device("cuda")) is True
    assert fresh_dispatch._use_triton(torch.device("cpu")) is False
    fresh_dispatch.set_kernel_backend("torch")
    assert fresh_dispatch._use_triton(torch.device("cuda")) is False


def test_failed_first_compaction_launch_falls_back_and_warns_once(fresh_dispatch, monkeypatch):
    """A launcher that cannot be built (no C compiler) must not crash: PyTorch result, one warning, and
    Triton is not tried again in this process (the decode kernel included)."""
    keys, values, positions, sel = _prompt()
    query, qpos = torch.randn(2, 6, 1, 16), torch.tensor([[40], [40]])
    ref_store, ref_out = _torch_results(fresh_dispatch, keys, values, positions, sel, query, qpos)
    calls, decode_calls = [], []
    monkeypatch.setattr(compact_mod.COMPACT_KERNEL, "launch", _failing(calls))
    monkeypatch.setattr(rd.DECODE_KERNEL, "launch", _failing(decode_calls))
    monkeypatch.setenv("TRITON_INTERPRET", "1")                  # lets the forced backend pick Triton on CPU
    fresh_dispatch.set_kernel_backend("triton")
    with pytest.warns(RuntimeWarning, match="Triton compaction kernel failed to launch") as caught:
        store = _store(keys, values, positions, sel)
    assert len(caught) == 1 and LAUNCHER_ERROR[:30] in str(caught[0].message)
    assert calls == [1]
    for name in ("keys", "values", "positions", "lengths"):
        assert torch.equal(getattr(store.buffers(), name), getattr(ref_store.buffers(), name)), name
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = _store(keys, values, positions, sel)
        out = fresh_dispatch.ragged_attention(query, again, qpos, 0.25)
    assert calls == [1] and decode_calls == []
    assert torch.equal(out, ref_out)
    assert "compaction" in fresh_dispatch.launch_failure()
    assert fresh_dispatch._use_triton(torch.device("cuda")) is False     # auto on a GPU: PyTorch from now on


def test_failed_first_decode_launch_falls_back(fresh_dispatch, monkeypatch):
    keys, values, positions, sel = _prompt()
    query, qpos = torch.randn(2, 6, 1, 16), torch.tensor([[40], [39]])
    ref_store, ref_out = _torch_results(fresh_dispatch, keys, values, positions, sel, query, qpos)
    calls = []
    monkeypatch.setattr(rd.DECODE_KERNEL, "launch", _failing(calls))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    fresh_dispatch.set_kernel_backend("triton")
    fresh_dispatch._launched.add("compaction")       # compaction launched before; decode is new
    with pytest.warns(RuntimeWarning, match="Triton ragged decode kernel failed to launch"):
        out = fresh_dispatch.ragged_attention(query, ref_store, qpos, 0.25)
    assert torch.equal(out, ref_out) and calls == [1]


def test_errors_of_a_kernel_that_launched_before_are_raised(fresh_dispatch, monkeypatch):
    keys, values, positions, sel = _prompt()
    monkeypatch.setattr(compact_mod.COMPACT_KERNEL, "launch", _failing([]))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    fresh_dispatch.set_kernel_backend("triton")
    fresh_dispatch._launched.add("compaction")
    with pytest.raises(RuntimeError, match="C compiler"):
        _store(keys, values, positions, sel)
    assert fresh_dispatch.launch_failure() is None


def test_interpreter_switched_on_after_triton_import_falls_back_with_the_reason(fresh_dispatch, monkeypatch):
    from headprobe.runtime.kernels.launch import interpreter_loaded

    if interpreter_loaded():
        pytest.skip("this process imported Triton under TRITON_INTERPRET=1")
    keys, values, positions, sel = _prompt()
    ref_store, _ = _torch_results(fresh_dispatch, keys, values, positions, sel, torch.randn(2, 6, 1, 16),
                                  torch.tensor([[40], [40]]))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    fresh_dispatch.set_kernel_backend("triton")
    with pytest.warns(RuntimeWarning, match="set after Triton was imported"):
        store = _store(keys, values, positions, sel)
    assert torch.equal(store.buffers().keys, ref_store.buffers().keys)


def test_forced_triton_without_a_device_warns_once(fresh_dispatch, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    fresh_dispatch.set_kernel_backend("triton")
    with pytest.warns(RuntimeWarning, match="using the PyTorch path"):
        assert fresh_dispatch._use_triton(torch.device("cpu")) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fresh_dispatch._use_triton(torch.device("cpu")) is False   # said once only


def test_dispatch_runs_the_kernels_and_matches_torch(kernel_device, fresh_dispatch):
    keys, values, positions, sel = _prompt()
    keys, values, positions = keys.to(kernel_device), values.to(kernel_device), positions.to(kernel_device)
    sel = Selection(sel.index.to(kernel_device), sel.count.to(kernel_device))
    query, qpos = torch.randn(2, 6, 1, 16, device=kernel_device), torch.tensor([[40], [33]], device=kernel_device)
    ref_store, ref_out = _torch_results(fresh_dispatch, keys, values, positions, sel, query, qpos)
    fresh_dispatch.set_kernel_backend("triton")
    with warnings.catch_warnings():
        warnings.simplefilter("error")                          # no fallback: the kernels really ran
        store = _store(keys, values, positions, sel)
        out = fresh_dispatch.ragged_attention(query, store, qpos, 0.25)
    assert fresh_dispatch._launched == {"compaction", "ragged decode"}
    for name in ("keys", "values", "positions", "lengths"):
        assert torch.equal(getattr(store.buffers(), name), getattr(ref_store.buffers(), name)), name
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-4)


def test_generate_with_triton_kernels_matches_torch_path(kernel_device, fresh_dispatch, tiny_llama, one_thread):
    from headprobe.runtime.generate import generate_compressed

    model = tiny_llama.model.to(kernel_device)
    tiny_llama.model = model
    prompts = ["The river ran past the old mill. Fishermen waited on the bank. " * 2, "The secret code is blue"]
    outs = {}
    for backend in ("torch", "triton"):
        fresh_dispatch.set_kernel_backend(backend)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            res = generate_compressed(tiny_llama, prompts, policy="keepkv", capacity=12, max_new_tokens=6)
        outs[backend] = res.sequences
    assert fresh_dispatch._launched == {"compaction", "ragged decode"}
    assert torch.equal(outs["torch"], outs["triton"])
