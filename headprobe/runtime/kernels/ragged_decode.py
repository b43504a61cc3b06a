"""Triton kernel: decode attention over ragged per-KV-head segments, GQA, split-K, KeepKV vote bias.

Grid: ``(segments, splits)``. Program ``(s, j)`` serves KV head ``s`` and all ``group`` query heads that
read it: it streams rows ``j·split .. (j+1)·split`` of the segment in blocks of ``BLOCK_N`` with an online
softmax. ``Q·Kᵀ`` and ``P·V`` are ``tl.dot`` products (tensor cores); the query group is padded to at
least 16 rows, the smallest ``tl.dot`` tile. The number of splits is chosen from the longest segment so
that the launch fills the GPU (about :data:`PROGRAMS_PER_SM` programs per streaming multiprocessor): short
budgets over few heads still use every SM, long heads are cut into many splits and short heads' extra
splits exit at once. float32 caches multiply in IEEE float32 (no TF32), as does bfloat16 under the
interpreter, whose ``tl.dot`` multiplies bfloat16 bit patterns as integers. With one split the kernel writes the normalised output; otherwise it writes partial
``(max, sum, acc)`` per split and a second kernel merges them by log-sum-exp.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import LazyKernel, device_guard, interpreting, sm_count

#: Programs per streaming multiprocessor the split-K launch aims for.
PROGRAMS_PER_SM = 2
#: Splits are whole multiples of this many rows (the largest ``BLOCK_N`` tried), at least one multiple.
SPLIT_ALIGN = 64


def _ragged_decode_kernel(Q, OK, OV, OP, VOTES, OFF, LEN, QPOS, OUT, M_OUT, L_OUT, ACC_OUT,
                          heads, group, split, scaling, window,
                          D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                          HAS_VOTES: tl.constexpr, HAS_WINDOW: tl.constexpr, FINAL: tl.constexpr,
                          DOT_FP32: tl.constexpr, BLOCK_N: tl.constexpr):
    s = tl.program_id(0)
    j = tl.program_id(1)
    n_splits = tl.num_programs(1)
    b = s // heads
    off = tl.load(OFF + s).to(tl.int64)
    length = tl.load(LEN + s)
    qpos = tl.load(QPOS + b)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    gmask = g < group
    dmask = d < D
    # Q is [batch * q_heads, D]; this segment's query heads are s*group .. s*group+group-1.
    qrow = s.to(tl.int64) * group + g
    q = tl.load(Q + qrow[:, None] * D + d[None, :], mask=gmask[:, None] & dmask[None, :], other=0.0)
    q = q.to(OK.dtype.element_ty)
    m_i = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    start = j * split
    end = tl.minimum(start + split, length)
    # 64-bit scalar base per block, 32-bit tile offsets (loop invariant): pointer tiles stay small.
    r = tl.arange(0, BLOCK_N)
    tile = r[:, None] * D + d[None, :]
    for n0 in range(start, end, BLOCK_N):
        nmask = n0 + r < end
        row0 = off + n0
        if BLOCK_D == D:   # no column mask: keeps the loads vectorised (and pipelined)  # noqa: SIM108 (a constexpr branch: Triton compiles one side only)
            kv_mask = nmask[:, None]
        else:
            kv_mask = nmask[:, None] & dmask[None, :]
        k = tl.load(OK + row0 * D + tile, mask=kv_mask, other=0.0)
        v = tl.load(OV + row0 * D + tile, mask=kv_mask, other=0.0)
        if DOT_FP32:
            logits = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            logits = tl.dot(q, tl.trans(k))
        logits = logits * scaling                                                     # [G, N] fp32
        if HAS_VOTES:
            lv = tl.load(VOTES + row0 + r, mask=nmask, other=0.0)
            logits = logits + lv[None, :]
        pos = tl.load(OP + row0 + r, mask=nmask, other=0)
        ok = nmask & (pos <= qpos)
        if HAS_WINDOW:
            ok = ok & (qpos - pos < window)
        logits = tl.where(ok[None, :], logits, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logits, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(logits - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT_FP32:  # noqa: SIM108 (a constexpr branch: Triton compiles one side only)
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if FINAL:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(OUT + qrow[:, None] * D + d[None, :], out.to(OUT.dtype.element_ty),
                 mask=gmask[:, None] & dmask[None, :])
    else:
        base = (s.to(tl.int64) * n_splits + j) * BLOCK_G + g
        tl.store(M_OUT + base, m_i, mask=gmask)
        tl.store(L_OUT + base, l_i, mask=gmask)
        tl.store(ACC_OUT + base[:, None] * D + d[None, :], acc, mask=gmask[:, None] & dmask[None, :])


def _combine_kernel(OUT, M_OUT, L_OUT, ACC_OUT, group, n_splits,
                    D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
    """Merge the splits of segment ``program_id(0)`` by log-sum-exp; rows with nothing visible give 0."""
    s = tl.program_id(0)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    gmask = g < group
    mask2 = gmask[:, None] & (d < D)[None, :]
    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    for j in range(n_splits):
        base = (s.to(tl.int64) * n_splits + j) * BLOCK_G + g
        m_j = tl.load(M_OUT + base, mask=gmask, other=float("-inf"))
        l_j = tl.load(L_OUT + base, mask=gmask, other=0.0)
        a_j = tl.load(ACC_OUT + base[:, None] * D + d[None, :], mask=mask2, other=0.0)
        m_new = tl.maximum(m, m_j)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        beta = tl.exp(m_j - m_safe)
        l_sum = l_sum * alpha + l_j * beta
        acc = acc * alpha[:, None] + a_j * beta[:, None]
        m = m_new
    out = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
    qrow = s.to(tl.int64) * group + g
    tl.store(OUT + qrow[:, None] * D + d[None, :], out.to(OUT.dtype.element_ty), mask=mask2)


#: Compiled: autotuned over key-block size, warps and pipeline stages per head size and group tile;
#: interpreted: the first configuration.
DECODE_KERNEL = LazyKernel(
    _ragged_decode_kernel,
    [({"BLOCK_N": bn}, warps, stages) for bn in (64, 32) for warps in (4, 8) for stages in (2, 3, 4)],
    key=["D", "BLOCK_G", "HAS_VOTES", "HAS_WINDOW", "FINAL", "DOT_FP32"])
COMBINE_KERNEL = LazyKernel(_combine_kernel, [({}, 4, 1)])


def choose_split(max_len: int, segments: int, sms: int) -> int:
    """Rows per split so that ``segments × splits`` programs give about ``PROGRAMS_PER_SM × sms``.

    Returns a multiple of :data:`SPLIT_ALIGN`, at least one; ``splits = ceil(max_len / split)``.
    """
    want = max(1, -(-PROGRAMS_PER_SM * sms // max(segments, 1)))          # splits per segment
    split = -(-max(max_len, 1) // want)
    return -(-split // SPLIT_ALIGN) * SPLIT_ALIGN


def _splits(lengths: torch.Tensor, segments: int, device: torch.device, split: int | None,
            max_len: int | None) -> tuple[int, int]:
    """Rows per split-K program (``split``, default :func:`choose_split`) and the number of splits, from the
    longest segment (``max_len``; else read from ``lengths``, one device sync)."""
    if max_len is None:
        max_len = int(lengths.max())
    if split is None:
        split = choose_split(max_len, segments, sm_count(device))
    return split, max(1, triton.cdiv(max(max_len, 1), split))


def _partials(segments: int, splits: int, block_g: int, d: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each split's running max and sum ``[segments, splits, block_g]`` and accumulator
    ``[segments, splits, block_g, d]`` (float32), which the combine kernel merges."""
    m_out = torch.empty(segments, splits, block_g, dtype=torch.float32, device=device)
    return m_out, torch.empty_like(m_out), torch.empty(segments, splits, block_g, d, dtype=torch.float32,
                                                       device=device)


def ragged_decode_triton(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                         offsets: torch.Tensor, lengths: torch.Tensor, kv_heads: int,
                         query_positions: torch.Tensor, scaling: float, sliding_window: int | None = None,
                         log_votes: torch.Tensor | None = None, split: int | None = None,
                         max_len: int | None = None) -> torch.Tensor:
    """One decode step of ``query`` over ragged per-KV-head segments.

    Parameters
    ----------
    query
        ``[batch, q_heads, 1, head_dim]``.
    keys, values
        ``[rows, head_dim]`` flat buffers; segment ``s = b · kv_heads + h`` holds rows
        ``offsets[s] .. offsets[s] + lengths[s]``.
    positions
        ``[rows]`` int32 absolute positions of the stored pairs.
    offsets, lengths
        ``[segments]`` int64.
    query_positions
        ``[batch, 1]``; key ``j`` is visible when ``pos_j <= pos_q`` (and inside ``sliding_window``).
    log_votes
        ``[rows]`` float32 added to the logits (KeepKV), or ``None``.
    split
        Rows per split-K program (default: :func:`choose_split` from the SM count).
    max_len
        The longest segment, when the caller knows it (else read from ``lengths``, one device sync).

    Returns
    -------
    torch.Tensor
        ``[batch, q_heads, 1, head_dim]`` in the query dtype.
    """
    b, hq, n, d = query.shape
    if n != 1:
        raise ValueError(f"query: the ragged decode kernel serves one new token per row, got {n}")
    segments = b * kv_heads
    group = hq // kv_heads
    dev = query.device
    out = torch.empty(b * hq, d, dtype=query.dtype, device=dev)
    if segments == 0:
        return out.reshape(b, hq, 1, d)
    split, splits = _splits(lengths, segments, dev, split, max_len)
    block_g = max(16, triton.next_power_of_2(group))
    block_d = max(16, triton.next_power_of_2(d))
    final = splits == 1
    m_out, l_out, acc_out = (out,) * 3 if final else _partials(segments, splits, block_g, d, dev)
    q = query.reshape(b * hq, d).contiguous()
    qpos = query_positions[:, -1].to(torch.int64).contiguous()
    votes = log_votes if log_votes is not None else positions
    with device_guard(dev):
        DECODE_KERNEL.launch((segments, splits), q, keys, values, positions, votes, offsets, lengths, qpos,
                             out, m_out, l_out, acc_out, kv_heads, group, split, float(scaling),
                             int(sliding_window or 0), D=d, BLOCK_G=block_g, BLOCK_D=block_d,
                             HAS_VOTES=log_votes is not None, HAS_WINDOW=bool(sliding_window), FINAL=final,
                             DOT_FP32=keys.dtype == torch.float32 or (keys.dtype == torch.bfloat16 and interpreting()))
        if not final:
            COMBINE_KERNEL.launch((segments,), out, m_out, l_out, acc_out, group, splits,
                                  D=d, BLOCK_G=block_g, BLOCK_D=block_d)
    return out.reshape(b, hq, 1, d)
