"""Ragged per-(batch row, KV head) key/value storage of one layer.

One flat buffer per layer holds every segment back to back; segment ``s = b * kv_heads + h`` owns rows
``offsets[s] .. offsets[s] + capacity[s]`` of which the first ``lengths[s]`` are in use. Decoding writes
new tokens at ``offsets + lengths`` (in place, no copy of the cache); a segment that runs out of room is
regrown once by re-laying out the layer with a larger reserve.

Decoding never waits for the device. The store keeps a host mirror of ``lengths`` and ``capacity``
(NumPy ``host_lengths``, ``host_capacity``), updated by its own methods alongside the device tensors, so
that every decision (is some segment full, how wide is the padded view, the longest segment the decode
kernel must cover) is taken on the host, and the writes are dense: a segment that has nothing to write
at some step writes to the *spare row*, one row past the last segment that no segment owns and no
pair is ever read from. Reading a device value on the host (``.item()``, ``bool(tensor)``,
``int(tensor)``, boolean-mask indexing, ``nonzero``) would block until the device has finished all the
work queued before it, once per layer per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Selection:
    """Tokens to keep, per segment.

    Attributes
    ----------
    index
        ``[segments, k_max]`` int64 token indices into the prompt keys (entries past ``count`` ignored).
    count
        ``[segments]`` int64 number of kept tokens per segment.
    """

    index: torch.Tensor
    count: torch.Tensor


class LayerStore:
    """The compressed cache of one attention layer.

    Attributes
    ----------
    keys, values
        ``[total_capacity + 1, head_dim]`` flat buffers (post-RoPE keys); the last row is the spare row.
    positions
        ``[total_capacity + 1]`` int32 absolute token positions of the stored pairs.
    log_votes
        ``[total_capacity + 1]`` float32 KeepKV ``log p`` per pair, or ``None`` when the policy has no votes.
    offsets, lengths, capacity
        ``[segments]`` int64 segment metadata on the device; ``segments = batch * kv_heads``.
    host_lengths, host_capacity
        ``[segments]`` int64 NumPy mirrors of ``lengths`` and ``capacity`` (always equal to them).
    spare
        Index of the spare row (``total_capacity``): the target of masked-out writes.
    peak_lengths
        ``[segments]`` the largest length each segment ever reached.
    """

    def __init__(self, batch: int, kv_heads: int, head_dim: int, capacity: torch.Tensor | np.ndarray,
                 dtype: torch.dtype, device: torch.device, votes: bool = False) -> None:
        self.batch, self.kv_heads, self.head_dim = batch, kv_heads, head_dim
        host = _host(capacity).reshape(-1)
        self.host_capacity = host
        self.host_lengths = np.zeros_like(host)
        capacity = torch.from_numpy(host.copy()).to(device)
        self.capacity = capacity
        self.offsets = torch.cumsum(capacity, 0) - capacity
        self.lengths = torch.zeros_like(capacity)
        self.peak_lengths = torch.zeros_like(capacity)
        self.spare = int(host.sum())
        rows = self.spare + 1
        # Zeroed: unused slots are read (masked) by the strided view, and must never hold NaN.
        self.keys = torch.zeros(rows, head_dim, dtype=dtype, device=device)
        self.values = torch.zeros(rows, head_dim, dtype=dtype, device=device)
        self.positions = torch.full((rows,), -1, dtype=torch.int32, device=device)
        self.log_votes = torch.zeros(rows, dtype=torch.float32, device=device) if votes else None
        self.extra_bytes = 0  # policy state counted as cache memory (MorphKV queries)
        #: Per-pair policy statistics ``[total_capacity + 1, ...]`` that move with their pair (KeepKV scores).
        self.aux: dict[str, torch.Tensor] = {}

    # ---- sizes -----------------------------------------------------------------------------------

    @property
    def segments(self) -> int:
        return self.batch * self.kv_heads

    def kept(self) -> torch.Tensor:
        """``[batch, kv_heads]`` tokens held per segment."""
        return self.lengths.reshape(self.batch, self.kv_heads).clone()

    def max_length(self) -> int:
        """The longest segment (from the host mirror: no device read)."""
        return int(self.host_lengths.max()) if self.host_lengths.size else 0

    def memory_bytes(self) -> int:
        """Bytes this layer really allocates (buffers, positions, votes, metadata, policy state)."""
        tensors = [self.keys, self.values, self.positions, self.offsets, self.lengths, self.capacity]
        if self.log_votes is not None:
            tensors.append(self.log_votes)
        tensors.extend(self.aux.values())
        return sum(t.numel() * t.element_size() for t in tensors) + self.extra_bytes

    def bytes_per_token(self) -> int:
        per = 2 * self.head_dim * self.keys.element_size() + self.positions.element_size()
        return per + (4 if self.log_votes is not None else 0)

    def at_limit(self, limit: torch.Tensor | None = None,
                 host_limit: np.ndarray | None = None) -> tuple[torch.Tensor, np.ndarray]:
        """Segments whose length reached ``limit`` (default: their capacity), on the device and on the host.

        Parameters
        ----------
        limit, host_limit
            ``[segments]`` the same limit as a device tensor and as a host array (both or neither).

        Returns
        -------
        full, host_full
            ``[segments]`` bool tensor and the same values as a NumPy array (decide with the host one).
        """
        if limit is None:
            limit, host_limit = self.capacity, self.host_capacity
        return self.lengths >= limit, self.host_lengths >= host_limit

    # ---- views -----------------------------------------------------------------------------------

    def view_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded gather index of the stored pairs.

        Returns
        -------
        index, valid
            ``[segments, max_len]`` flat row index (the spare row where ``valid`` is False) and
            ``[segments, max_len]`` bool.
        """
        width = max(self.max_length(), 1)
        ar = torch.arange(width, device=self.lengths.device)
        valid = ar[None, :] < self.lengths[:, None]
        index = torch.where(valid, self.offsets[:, None] + ar[None, :], self.spare)
        return index, valid

    def padded(self) -> dict[str, torch.Tensor]:
        """Keys, values, positions and mask as ``[segments, max_len, ...]`` tensors (copies)."""
        index, valid = self.view_index()
        width = index.shape[1]
        cap = int(self.host_capacity[0]) if self.host_capacity.size else 0
        if cap >= width and bool((self.host_capacity == cap).all()):
            # Equal capacities: the segments are a strided view of the flat buffer, no gather needed.
            seg = self.segments
            out = {"index": index, "valid": valid,
                   "keys": self.keys[: seg * cap].view(seg, cap, -1)[:, :width],
                   "values": self.values[: seg * cap].view(seg, cap, -1)[:, :width],
                   "positions": self.positions[: seg * cap].view(seg, cap)[:, :width].long()}
            if self.log_votes is not None:
                out["log_votes"] = self.log_votes[: seg * cap].view(seg, cap)[:, :width]
            return out
        out = {"index": index, "valid": valid, "keys": self.keys[index], "values": self.values[index],
               "positions": self.positions[index].long()}
        if self.log_votes is not None:
            out["log_votes"] = self.log_votes[index]
        return out

    # ---- writes ----------------------------------------------------------------------------------

    def add_aux(self, name: str, trailing: tuple[int, ...] = (), fill: float = 0.0) -> torch.Tensor:
        """Allocate a per-pair statistic ``[total_capacity + 1, *trailing]`` float32."""
        self.aux[name] = torch.full((self.keys.shape[0], *trailing), fill, dtype=torch.float32,
                                    device=self.keys.device)
        return self.aux[name]

    def _move_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy rows ``src`` to rows ``dst`` of every per-pair buffer (all reads before the writes)."""
        for t in (self.keys, self.values, self.positions, self.log_votes, *self.aux.values()):
            if t is not None:
                t[dst] = t[src].clone()

    def set_lengths(self, lengths: torch.Tensor) -> None:
        """Set every segment's length (``[segments]``, at most its capacity); reads it to the host once."""
        self.lengths = lengths.to(device=self.lengths.device, dtype=torch.int64).reshape(-1).clone()
        self.host_lengths = _host(self.lengths).reshape(-1)
        self._track_peak()

    def remove(self, local_slot: torch.Tensor, mask: torch.Tensor, host_mask: np.ndarray) -> None:
        """Drop pair ``local_slot[s]`` of every segment where ``mask[s]`` (the last pair moves into its slot).

        Parameters
        ----------
        local_slot
            ``[segments]`` slot to drop, ``< lengths`` where ``mask``.
        mask, host_mask
            ``[segments]`` bool on the device and the same values on the host (:meth:`at_limit`).
        """
        if not host_mask.any():
            return
        src = torch.where(mask, self.offsets + self.lengths - 1, self.spare)
        dst = torch.where(mask, self.offsets + local_slot, self.spare)
        self._move_rows(dst, src)
        self.lengths = self.lengths - mask.long()
        self.host_lengths = self.host_lengths - host_mask

    def _track_peak(self) -> None:
        torch.maximum(self.peak_lengths, self.lengths, out=self.peak_lengths)

    def write_selection(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                        selection: Selection, log_votes: torch.Tensor | None = None) -> None:
        """Fill the (empty) store with the selected prompt tokens, all segments in one gather.

        Parameters
        ----------
        keys, values
            ``[batch, kv_heads, tokens, head_dim]`` prompt keys and values.
        positions
            ``[batch, tokens]`` absolute positions.
        selection
            Kept token indices per segment; ``count <= capacity``.
        log_votes
            ``[segments, k_max]`` initial ``log p`` of the selected pairs (KeepKV), else zeros.
        """
        from .kernels.dispatch import compact

        count = _host(selection.count).reshape(-1)
        if bool((count > self.host_capacity).any()):
            raise ValueError("selection larger than the segment capacity")
        compact(self, keys, values, positions, selection)
        self.host_lengths = count
        if self.log_votes is not None and log_votes is not None:
            k = selection.index.shape[1]
            ar = torch.arange(k, device=keys.device)
            valid = ar[None, :] < selection.count[:, None]
            rows = (self.offsets[:, None] + ar[None, :])[valid]
            self.log_votes[rows] = log_votes[valid].float()
        self._track_peak()

    def ensure_room(self, extra: int) -> None:
        """Make room for ``extra`` more tokens in every segment (re-layout when some segment is full)."""
        room = self.host_capacity - self.host_lengths
        if bool((room < extra).any()):
            self.relayout(np.clip(room, 0, None) + max(extra, 64))

    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
               valid: torch.Tensor | None = None) -> None:
        """Append tokens at the end of every segment, in place.

        Parameters
        ----------
        keys, values
            ``[batch, kv_heads, n, head_dim]``.
        positions
            ``[batch, n]`` absolute positions.
        valid
            ``[batch, n]`` bool; tokens marked False (padding) are skipped, which reads the counts to the
            host. ``None`` (every token real, as while decoding) writes all ``n`` with no device read.
        """
        b, h, n, d = keys.shape
        self.ensure_room(n)
        if valid is None:
            ok = torch.ones(b * h, n, dtype=torch.bool, device=keys.device)
            added = torch.full((b * h,), n, dtype=torch.int64, device=keys.device)
            host_added = np.full(b * h, n, dtype=np.int64)
        else:
            ok = valid[:, None, :].expand(b, h, n).reshape(b * h, n)
            added = ok.long().sum(1)
            host_added = _host(added)
        slot = self.lengths[:, None] + torch.cumsum(ok.long(), 1) - 1
        rows = torch.where(ok, self.offsets[:, None] + slot, self.spare).reshape(-1)
        self.keys[rows] = keys.reshape(b * h * n, d).to(self.keys.dtype)
        self.values[rows] = values.reshape(b * h * n, d).to(self.values.dtype)
        self.positions[rows] = positions[:, None, :].expand(b, h, n).reshape(-1).to(torch.int32)
        if self.log_votes is not None:
            self.log_votes[rows] = 0.0
        for t in self.aux.values():
            t[rows] = 0.0
        self.lengths = self.lengths + added
        self.host_lengths = self.host_lengths + host_added
        self._track_peak()

    def overwrite(self, local_slot: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                  positions: torch.Tensor) -> None:
        """Write one new token per segment into slot ``local_slot`` (an evicted pair), in place.

        Parameters
        ----------
        local_slot
            ``[segments]`` slot within the segment, ``< lengths``.
        keys, values
            ``[batch, kv_heads, 1, head_dim]``.
        positions
            ``[batch]`` positions of the new tokens.
        """
        rows = self.offsets + local_slot
        self.keys[rows] = keys.reshape(-1, self.head_dim).to(self.keys.dtype)
        self.values[rows] = values.reshape(-1, self.head_dim).to(self.values.dtype)
        self.positions[rows] = positions[:, None].expand(self.batch, self.kv_heads).reshape(-1).to(torch.int32)
        if self.log_votes is not None:
            self.log_votes[rows] = 0.0
        for t in self.aux.values():
            t[rows] = 0.0

    def keep_in_place(self, local_index: torch.Tensor, count: torch.Tensor,
                      host_count: np.ndarray | None = None) -> None:
        """Keep only the given pairs of each segment, moved to the front of the segment (no realloc).

        Parameters
        ----------
        local_index
            ``[segments, k_max]`` slots to keep (entries past ``count`` ignored).
        count
            ``[segments]`` number of slots kept.
        host_count
            ``count`` on the host when the caller knows it (else it is read from the device).
        """
        host_count = _host(count).reshape(-1) if host_count is None else np.asarray(host_count, dtype=np.int64)
        k = local_index.shape[1]
        if k == 0:
            self.lengths = torch.zeros_like(self.lengths)
            self.host_lengths = np.zeros_like(self.host_lengths)
            return
        ar = torch.arange(k, device=local_index.device)
        valid = ar[None, :] < count[:, None]
        src = torch.where(valid, self.offsets[:, None] + local_index.clamp(min=0), self.spare)
        dst = torch.where(valid, self.offsets[:, None] + ar[None, :], self.spare)
        self._move_rows(dst.reshape(-1), src.reshape(-1))
        self.lengths = count.to(self.lengths.dtype).clone()
        self.host_lengths = host_count.copy()

    def relayout(self, reserve: torch.Tensor | np.ndarray | int) -> None:
        """Reallocate tightly: capacity = length + reserve per segment (one copy of the kept pairs)."""
        index, valid = self.view_index()
        reserve_host = np.broadcast_to(_host(reserve), self.host_lengths.shape)
        new = LayerStore(self.batch, self.kv_heads, self.head_dim, self.host_lengths + reserve_host, self.keys.dtype,
                         self.keys.device, votes=self.log_votes is not None)
        width = index.shape[1]
        ar = torch.arange(width, device=index.device)
        dst = torch.where(valid, new.offsets[:, None] + ar[None, :], new.spare).reshape(-1)
        src = index.reshape(-1)
        new.keys[dst] = self.keys[src]
        new.values[dst] = self.values[src]
        new.positions[dst] = self.positions[src]
        if self.log_votes is not None:
            new.log_votes[dst] = self.log_votes[src]
        for name, t in self.aux.items():
            new.aux[name] = torch.zeros((new.keys.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
            new.aux[name][dst] = t[src]
        new.lengths = self.lengths.clone()
        new.host_lengths = self.host_lengths.copy()
        new.peak_lengths = torch.maximum(self.peak_lengths, new.lengths)
        new.extra_bytes = self.extra_bytes
        self.__dict__.update(new.__dict__)


def _host(x: torch.Tensor | np.ndarray | int) -> np.ndarray:
    """``x`` as a host int64 array (a device tensor is read once: callers keep this off the decode path)."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.int64).numpy().copy()
    return np.array(x, dtype=np.int64)
