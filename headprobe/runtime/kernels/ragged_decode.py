"""Triton kernel: decode attention over ragged per-KV-head segments, GQA, split-K, KeepKV vote bias.

Grid: ``(segments, splits)``. Program ``(s, j)`` serves KV head ``s`` and all ``group`` query heads that
read it: it streams rows ``j·split .. (j+1)·split`` of the segment in blocks of ``BLOCK_N`` with an online
softmax and writes partial ``(max, sum, acc)``; a small reduction combines the splits. Long heads get
more splits, short heads finish early.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _ragged_decode_kernel(Q, OK, OV, OP, VOTES, OFF, LEN, QPOS, M_OUT, L_OUT, ACC_OUT,
                          heads, group, split, scaling, window,
                          D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                          HAS_VOTES: tl.constexpr, HAS_WINDOW: tl.constexpr):
    s = tl.program_id(0)
    j = tl.program_id(1)
    n_splits = tl.num_programs(1)
    b = s // heads
    off = tl.load(OFF + s)
    length = tl.load(LEN + s)
    qpos = tl.load(QPOS + b)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    gmask = g < group
    dmask = d < D
    # Q is [batch * q_heads, D]; this segment's query heads are s*group .. s*group+group-1.
    q = tl.load(Q + (s * group + g)[:, None] * D + d[None, :], mask=gmask[:, None] & dmask[None, :], other=0.0)
    q = q.to(tl.float32)
    m_i = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    start = j * split
    end = tl.minimum(start + split, length)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < end
        rows = off + n
        k = tl.load(OK + rows[:, None] * D + d[None, :], mask=nmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        v = tl.load(OV + rows[:, None] * D + d[None, :], mask=nmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        logits = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scaling       # [G, N]
        if HAS_VOTES:
            lv = tl.load(VOTES + rows, mask=nmask, other=0.0)
            logits = logits + lv[None, :]
        pos = tl.load(OP + rows, mask=nmask, other=0)
        ok = nmask & (pos <= qpos)
        if HAS_WINDOW:
            ok = ok & (qpos - pos < window)
        logits = tl.where(ok[None, :], logits, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logits, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(logits - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    base = (s * n_splits + j) * BLOCK_G + g
    tl.store(M_OUT + base, m_i, mask=gmask)
    tl.store(L_OUT + base, l_i, mask=gmask)
    tl.store(ACC_OUT + base[:, None] * D + d[None, :], acc, mask=gmask[:, None] & dmask[None, :])


def ragged_decode_triton(query: torch.Tensor, store, query_positions: torch.Tensor, scaling: float,
                         sliding_window: int | None = None, split: int = 256, block_n: int = 32) -> torch.Tensor:
    """One decode step of ``query`` ``[batch, q_heads, 1, head_dim]`` over ``store``; ``[batch, q_heads, 1, D]``."""
    b, hq, n, d = query.shape
    assert n == 1, "the ragged decode kernel serves one new token per row"
    s = store.segments
    group = hq // store.kv_heads
    max_len = int(store.lengths.max()) if s else 0
    splits = max(1, triton.cdiv(max(max_len, 1), split))
    block_g = max(triton.next_power_of_2(group), 1)
    dev = query.device
    m_out = torch.empty(s, splits, block_g, dtype=torch.float32, device=dev)
    l_out = torch.empty_like(m_out)
    acc_out = torch.empty(s, splits, block_g, d, dtype=torch.float32, device=dev)
    q = query.reshape(b * hq, d).contiguous()
    qpos = query_positions[:, -1].to(torch.int64).contiguous()
    votes = store.log_votes if store.log_votes is not None else store.positions
    _ragged_decode_kernel[(s, splits)](
        q, store.keys, store.values, store.positions, votes, store.offsets, store.lengths, qpos,
        m_out, l_out, acc_out, store.kv_heads, group, split, float(scaling), int(sliding_window or 0),
        D=d, BLOCK_G=block_g, BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(d),
        HAS_VOTES=store.log_votes is not None, HAS_WINDOW=bool(sliding_window))
    m_out, l_out, acc_out = m_out[:, :, :group], l_out[:, :, :group], acc_out[:, :, :group]
    big = m_out.amax(1, keepdim=True)
    big = torch.where(torch.isinf(big), torch.zeros_like(big), big)
    w = torch.exp(m_out - big)                                   # [S, splits, G]
    denom = (w * l_out).sum(1)
    out = (w[..., None] * acc_out).sum(1) / denom.clamp(min=1e-30)[..., None]
    out = torch.where(denom[..., None] > 0, out, torch.zeros_like(out))
    return out.reshape(b, hq, 1, d).to(query.dtype)
