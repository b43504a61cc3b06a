"""The Triton ragged decode kernel agrees with the PyTorch attention over the same ragged cache."""

from __future__ import annotations

import pytest
import torch

from headprobe.runtime.kernels.torch_ref import ragged_attention_torch

triton = pytest.importorskip("triton")

from headprobe.runtime.kernels import launch as launch_mod
from headprobe.runtime.kernels import ragged_decode as rd


def _ragged_cache(batch=2, kv_heads=3, d=16, max_len=40, dtype=torch.float32, votes=False, seed=0,
                  device="cpu", lengths=None):
    """Flat buffers of ragged segments (with free slots between them) and their padded view."""
    g = torch.Generator().manual_seed(seed)
    segments = batch * kv_heads
    if lengths is None:
        lengths = torch.randint(1, max_len + 1, (segments,), generator=g)
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    capacity = lengths + 5
    offsets = torch.cumsum(capacity, 0) - capacity
    rows = int(capacity.sum())
    keys = torch.randn(rows, d, generator=g).to(dtype)
    values = torch.randn(rows, d, generator=g).to(dtype)
    positions = torch.randint(0, 60, (rows,), generator=g, dtype=torch.int32)
    log_votes = torch.rand(rows, generator=g).log1p() if votes else None
    width = max(int(lengths.max()), 1)
    ar = torch.arange(width)
    valid = ar[None, :] < lengths[:, None]
    index = torch.where(valid, offsets[:, None] + ar[None, :], torch.zeros_like(valid, dtype=torch.long))
    view = {"keys": keys[index], "values": values[index], "positions": positions[index].long(), "valid": valid,
            "log_votes": log_votes[index] if votes else None}
    flat = {"keys": keys, "values": values, "positions": positions, "offsets": offsets, "lengths": lengths,
            "log_votes": log_votes}
    move = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in flat.items()}
    return move, view


def _compare(device, batch=2, kv_heads=3, group=2, d=16, dtype=torch.float32, votes=False, window=None,
             split=None, max_len=40, lengths=None, qpos=(50, 35), atol=1e-5, rtol=1e-4):
    flat, view = _ragged_cache(batch, kv_heads, d, max_len, dtype, votes, device=device, lengths=lengths)
    query = torch.randn(batch, kv_heads * group, 1, d, generator=torch.Generator().manual_seed(3)).to(dtype)
    query_positions = torch.tensor(qpos[:batch])[:, None]
    ref = ragged_attention_torch(query, view["keys"], view["values"], view["positions"], view["valid"],
                                 query_positions, 0.25, window, None, view["log_votes"])
    fast = rd.ragged_decode_triton(query.to(device), flat["keys"], flat["values"], flat["positions"],
                                   flat["offsets"], flat["lengths"], kv_heads, query_positions.to(device), 0.25,
                                   window, flat["log_votes"], split=split)
    assert fast.shape == ref.shape and fast.dtype == query.dtype
    torch.testing.assert_close(fast.cpu().float(), ref.float(), atol=atol, rtol=rtol)
    return fast.cpu()


@pytest.mark.parametrize("votes,window,split", [(False, None, None), (True, None, 64), (False, 12, None),
                                                (True, 20, 64)])
def test_decode_matches_torch(kernel_device, votes, window, split):
    # split=64 over segments of up to 150 rows: several split-K programs per head and the merge kernel.
    _compare(kernel_device, votes=votes, window=window, split=split, max_len=150, qpos=(70, 45))


@pytest.mark.parametrize("group", [1, 4, 5, 8])
def test_decode_query_groups_pad_to_the_dot_tile(kernel_device, group):
    """1 (MHA), 4 (Mistral), 5 (not a power of two), 8: all padded to a 16-row ``tl.dot`` tile."""
    _compare(kernel_device, kv_heads=2, group=group)


@pytest.mark.parametrize("dtype,atol", [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
def test_decode_half_precision_matches_torch(kernel_device, dtype, atol):
    _compare(kernel_device, dtype=dtype, split=64, max_len=150, atol=atol, rtol=1e-2)


def test_decode_head_dim_not_a_power_of_two(kernel_device):
    _compare(kernel_device, d=24, group=2)


def test_decode_empty_and_future_only_segments_give_zeros(kernel_device):
    """A segment with nothing stored, and one whose pairs all lie after the query, attend to nothing."""
    flat, _ = _ragged_cache(batch=1, kv_heads=2, lengths=[0, 6], device=kernel_device)
    flat["positions"].fill_(100)
    query = torch.randn(1, 4, 1, 16, device=kernel_device)
    out = rd.ragged_decode_triton(query, flat["keys"], flat["values"], flat["positions"], flat["offsets"],
                                  flat["lengths"], 2, torch.tensor([[10]], device=kernel_device), 0.25)
    assert torch.equal(out.cpu(), torch.zeros(1, 4, 1, 16))


def test_default_split_fills_the_device():
    """Enough programs for every SM when heads are long; no split shorter than one aligned block."""
    for segments, max_len, sms in [(8, 32768, 132), (8, 1024, 132), (96, 4096, 132), (1, 100, 8), (64, 64, 132)]:
        split = rd.choose_split(max_len, segments, sms)
        splits = -(-max_len // split)
        assert split % rd.SPLIT_ALIGN == 0 and split >= rd.SPLIT_ALIGN
        rows_per_program = -(-max_len // (rd.PROGRAMS_PER_SM * sms // segments or 1))
        if rows_per_program >= rd.SPLIT_ALIGN:             # long enough to share: the launch fills the GPU
            assert segments * splits >= rd.PROGRAMS_PER_SM * sms // 2
        assert splits <= -(-max_len // rd.SPLIT_ALIGN)


def test_default_split_uses_the_tensor_device_sm_count(kernel_device, monkeypatch):
    seen = []
    monkeypatch.setattr(rd, "sm_count", lambda device: seen.append(device) or 2)
    _compare(kernel_device, max_len=300, lengths=[300, 10, 200, 0, 64, 129])
    assert [device.type for device in seen] == [kernel_device.type]
    assert launch_mod.sm_count(torch.device("cpu")) == launch_mod.DEFAULT_SM_COUNT


def test_decode_launches_under_the_device_guard_of_its_tensors(interpreter, guard_events):
    events, record = guard_events
    record(rd, {"decode": rd.DECODE_KERNEL, "combine": rd.COMBINE_KERNEL})
    _compare(torch.device("cpu"), split=64, max_len=150, lengths=[150, 3, 90, 64, 65, 1])
    assert events == [("enter", torch.device("cpu")), "decode", "combine", "exit"]


def test_device_guard_selects_the_tensor_cuda_device(monkeypatch):
    entered = []

    class FakeCudaDevice:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            entered.append(self.device)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "device", FakeCudaDevice)
    with launch_mod.device_guard(torch.device("cuda", 1)):
        pass
    with launch_mod.device_guard(torch.device("cpu")):
        pass
    assert entered == [torch.device("cuda", 1)]


def test_interpreter_uses_one_configuration_and_the_compiler_autotunes(monkeypatch):
    """Under the interpreter the kernel is not wrapped in the autotuner (one config: fast CPU runs);
    compiled, it autotunes over every configuration."""
    from triton.runtime.autotuner import Autotuner

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not isinstance(rd.DECODE_KERNEL.kernel(), Autotuner)
    monkeypatch.delenv("TRITON_INTERPRET")
    tuned = rd.DECODE_KERNEL.kernel()
    assert isinstance(tuned, Autotuner) and len(tuned.configs) == len(rd.DECODE_KERNEL.configs) > 1
    assert {c.kwargs["BLOCK_N"] for c in tuned.configs} == {32, 64}
