"""The Triton compaction kernel writes exactly what the PyTorch path writes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headprobe.runtime.kernels.torch_ref import compact_torch

triton = pytest.importorskip("triton")

from headprobe.runtime.kernels import compact as compact_mod


def _prompt(batch=2, heads=3, n=40, d=16, dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(batch, heads, n, d, generator=g).to(dtype)
    values = torch.randn(batch, heads, n, d, generator=g).to(dtype)
    positions = torch.arange(n)[None, :].repeat(batch, 1) + 100 * torch.arange(batch)[:, None]
    count = torch.randint(1, n - 5, (batch * heads,), generator=g)
    index = torch.stack([torch.randperm(n, generator=g)[: int(count.max())] for _ in range(batch * heads)])
    return [t.to(device) for t in (keys, values, positions, index, count)]


def _outputs(count, d, dtype, device, slack=3):
    capacity = count + slack
    offsets = torch.cumsum(capacity, 0) - capacity
    rows = int(capacity.sum())
    return (offsets, torch.zeros(rows, d, dtype=dtype, device=device),
            torch.zeros(rows, d, dtype=dtype, device=device),
            torch.full((rows,), -1, dtype=torch.int32, device=device),
            torch.zeros_like(count))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_compaction_matches_torch(kernel_device, dtype):
    keys, values, positions, index, count = _prompt(dtype=dtype, device=kernel_device)
    offsets, *ref = _outputs(count, 16, dtype, kernel_device)
    _, *fast = _outputs(count, 16, dtype, kernel_device)
    compact_torch(keys, values, positions, index, count, offsets, *ref[:3])
    compact_mod.compact_triton(keys, values, positions, index, count, offsets, *fast)
    for a, b in zip(ref[:3], fast[:3]):
        assert torch.equal(a, b)
    assert torch.equal(fast[3], count)
    assert int((fast[2] >= 0).sum()) == int(count.sum())                 # every kept pair written


def test_compaction_of_strided_keys_matches_torch(kernel_device):
    """Keys sliced out of a larger cache (non-contiguous heads and tokens) are read through their strides."""
    keys, values, positions, index, count = _prompt(n=60, device=kernel_device)
    keys, values = keys[:, :, :50], values.transpose(1, 2).contiguous().transpose(1, 2)[:, :, :50]
    index = index.clamp(max=49)
    offsets, *ref = _outputs(count, 16, keys.dtype, kernel_device)
    _, *fast = _outputs(count, 16, keys.dtype, kernel_device)
    compact_torch(keys, values, positions[:, :50], index, count, offsets, *ref[:3])
    compact_mod.compact_triton(keys, values, positions[:, :50], index, count, offsets, *fast)
    for a, b in zip(ref[:3], fast[:3]):
        assert torch.equal(a, b)


def test_compaction_clamps_out_of_range_indices_like_torch(kernel_device):
    keys, values, positions, index, count = _prompt(device=kernel_device)
    index = index.clone()
    index[:, 0] = -7                 # below the prompt
    index[:, 1] = keys.shape[2] + 9  # past its end
    offsets, *ref = _outputs(count, 16, keys.dtype, kernel_device)
    _, *fast = _outputs(count, 16, keys.dtype, kernel_device)
    compact_torch(keys, values, positions, index, count, offsets, *ref[:3])
    compact_mod.compact_triton(keys, values, positions, index, count, offsets, *fast)
    for a, b in zip(ref[:3], fast[:3]):
        assert torch.equal(a, b)
    first = offsets                                                    # slot 0 of every segment
    assert torch.equal(fast[2][first].long(), positions.repeat_interleave(3, 0)[:, 0])


def test_compaction_with_nothing_kept_writes_lengths(kernel_device):
    keys, values, positions, _, _ = _prompt(device=kernel_device)
    count = torch.zeros(6, dtype=torch.long, device=kernel_device)
    offsets, *fast = _outputs(count, 16, keys.dtype, kernel_device)
    fast[3].fill_(5)
    compact_mod.compact_triton(keys, values, positions, torch.zeros(6, 0, dtype=torch.long, device=kernel_device),
                               count, offsets, *fast)
    assert torch.equal(fast[3], count)


def test_compaction_source_offsets_are_64_bit(interpreter, monkeypatch):
    """A layer of 2^32 key elements (batch 4 × 2 heads × 2^25 tokens × 16): ``b·stride_b + h·stride_h``
    passes 2^31 while each stride fits in int32. The kernel runs in the interpreter with those strides
    over small real buffers; its K/V/position loads are recorded instead of read, and their addresses must
    be exactly the 64-bit ones."""
    from triton.runtime import interpreter as interp

    batch, heads, n, d = 4, 2, 2**25, 16
    stride_k = (heads * n * d, n * d, d)                      # 2^30, 2^29, 16: each < 2^31
    stride_p = n
    keys = torch.zeros(1, d, dtype=torch.float16)             # stand-ins: only their addresses matter
    values = torch.zeros(1, d, dtype=torch.float16)
    positions = torch.zeros(1, dtype=torch.int64)
    index = torch.tensor([[0, n - 1, n + 5], [7, 2**24, -3]] * (batch * heads // 2))
    count = torch.tensor([3, 2] * (batch * heads // 2))
    offsets = torch.arange(batch * heads) * 3
    rows = batch * heads * 3
    out_k, out_v = torch.zeros(rows, d, dtype=torch.float16), torch.zeros(rows, d, dtype=torch.float16)
    out_p, out_len = torch.zeros(rows, dtype=torch.int32), torch.zeros_like(count)
    real = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in (index, count, offsets)]
    seen: dict[int, list[int]] = {}
    original = interp.interpreter_builder.create_masked_load

    def recording_load(ptrs, mask, other, cache_policy, is_volatile):
        addr = ptrs.data[mask.data].astype(np.uint64)
        if addr.size and any(lo <= int(addr.min()) and int(addr.max()) < hi for lo, hi in real):
            return original(ptrs, mask, other, cache_policy, is_volatile)
        dtype = interp._get_np_dtype(ptrs.get_element_ty())
        seen.setdefault(ptrs.get_element_ty().primitive_bitwidth, []).extend(int(a) for a in addr)
        return interp.TensorHandle(np.zeros(ptrs.data.shape, dtype=dtype), ptrs.get_element_ty())

    monkeypatch.setattr(interp.interpreter_builder, "create_masked_load", recording_load)
    compact_mod.COMPACT_KERNEL.launch((batch * heads, 1), keys, values, positions, index, count, offsets,
                                      out_k, out_v, out_p, out_len, heads, n, *stride_k, *stride_k, stride_p,
                                      index.stride(0), D=d, BLOCK_D=d)
    want_kv, want_p = [], []
    for s in range(batch * heads):
        b, h = divmod(s, heads)
        for t in range(int(count[s])):
            src = min(max(int(index[s, t]), 0), n - 1)
            elem = b * stride_k[0] + h * stride_k[1] + src * stride_k[2]
            for base in (keys.data_ptr(), values.data_ptr()):
                want_kv.extend(base + 2 * (elem + j) for j in range(d))
            want_p.append(positions.data_ptr() + 8 * (b * stride_p + src))
    assert max(b * stride_k[0] + h * stride_k[1] for b in range(batch) for h in range(heads)) >= 2**31
    assert sorted(seen[16]) == sorted(want_kv)
    assert sorted(seen[64]) == sorted(want_p)
    assert torch.equal(out_len, count)


def test_compaction_launches_under_the_device_guard_of_its_tensors(interpreter, guard_events):
    events, record = guard_events
    record(compact_mod, {"launch": compact_mod.COMPACT_KERNEL})
    keys, values, positions, index, count = _prompt()
    offsets, *fast = _outputs(count, 16, keys.dtype, "cpu")
    compact_mod.compact_triton(keys, values, positions, index, count, offsets, *fast)
    assert events == [("enter", keys.device), "launch", "exit"]
    assert torch.equal(fast[3], count)
