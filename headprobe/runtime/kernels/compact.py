"""Triton kernel: gather the kept K/V of every segment of a layer into the flat buffer, one launch.

Grid: ``(segments, ceil(k_max / BLOCK_T))``; program ``(s, t)`` copies kept tokens ``t·BLOCK_T ..`` of
segment ``s = b · kv_heads + h`` to rows ``offsets[s] + t·BLOCK_T ..`` and writes ``lengths[s]``.
Source offsets are computed in int64 (a layer's prompt K/V can hold more than 2^31 elements) and the
token index is clamped to the prompt, as the PyTorch path does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import LazyKernel, device_guard


def _compact_kernel(K, V, P, IDX, CNT, OFF, OK, OV, OP, LEN,
                    heads, n_tokens, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                    stride_pb, stride_idx,
                    D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    s = tl.program_id(0)
    tb = tl.program_id(1)
    b = (s // heads).to(tl.int64)
    h = (s % heads).to(tl.int64)
    cnt = tl.load(CNT + s)
    off = tl.load(OFF + s).to(tl.int64)
    t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < cnt
    src = tl.load(IDX + s.to(tl.int64) * stride_idx + t, mask=tmask, other=0).to(tl.int64)
    src = tl.minimum(tl.maximum(src, 0), n_tokens - 1)
    d = tl.arange(0, BLOCK_D)
    m2 = tmask[:, None] & (d[None, :] < D)
    k = tl.load(K + b * stride_kb + h * stride_kh + src[:, None] * stride_kn + d[None, :], mask=m2, other=0.0)
    v = tl.load(V + b * stride_vb + h * stride_vh + src[:, None] * stride_vn + d[None, :], mask=m2, other=0.0)
    rows = off + t
    tl.store(OK + rows[:, None] * D + d[None, :], k.to(OK.dtype.element_ty), mask=m2)
    tl.store(OV + rows[:, None] * D + d[None, :], v.to(OV.dtype.element_ty), mask=m2)
    p = tl.load(P + b * stride_pb + src, mask=tmask, other=0)
    tl.store(OP + rows, p.to(OP.dtype.element_ty), mask=tmask)
    if tb == 0:
        tl.store(LEN + s, cnt)


#: One configuration: a pure copy whose tile size barely matters; autotuning it would cost more than the
#: one launch per layer and prompt it could speed up.
COMPACT_KERNEL = LazyKernel(_compact_kernel, [({"BLOCK_T": 32}, 4, 1)])


def compact_triton(keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, index: torch.Tensor,
                   count: torch.Tensor, offsets: torch.Tensor, out_keys: torch.Tensor, out_values: torch.Tensor,
                   out_positions: torch.Tensor, out_lengths: torch.Tensor) -> None:
    """Same contract as :func:`~headprobe.runtime.kernels.torch_ref.compact_torch`, plus ``out_lengths``.

    Parameters
    ----------
    keys, values
        ``[batch, kv_heads, tokens, head_dim]`` (any strides with a unit last stride).
    positions
        ``[batch, tokens]``.
    index, count, offsets
        ``[segments, k_max]`` token indices (clamped to ``0 .. tokens - 1``), ``[segments]`` counts and
        first flat rows.
    out_keys, out_values, out_positions, out_lengths
        ``[rows, head_dim]``, ``[rows]`` and ``[segments]`` outputs, written in place.
    """
    _, h, n, d = keys.shape
    s, k_max = index.shape
    if k_max == 0 or n == 0:
        out_lengths.copy_(count)
        return
    keys = keys if keys.stride(-1) == 1 else keys.contiguous()
    values = values if values.stride(-1) == 1 else values.contiguous()
    positions = positions if positions.stride(-1) == 1 else positions.contiguous()
    index = index if index.stride(-1) == 1 else index.contiguous()
    grid = (s, triton.cdiv(k_max, COMPACT_KERNEL.configs[0][0]["BLOCK_T"]))
    with device_guard(keys.device):
        COMPACT_KERNEL.launch(grid, keys, values, positions, index, count.contiguous(), offsets.contiguous(),
                              out_keys, out_values, out_positions, out_lengths,
                              h, n, keys.stride(0), keys.stride(1), keys.stride(2),
                              values.stride(0), values.stride(1), values.stride(2),
                              positions.stride(0), index.stride(0),
                              D=d, BLOCK_D=triton.next_power_of_2(d))
