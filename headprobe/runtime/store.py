"""Ragged per-(batch row, KV head) key/value storage of one layer, behind verbs.

One flat buffer per layer holds every segment back to back; segment ``s = b * kv_heads + h`` owns rows
``offsets[s] .. offsets[s] + capacity[s]`` of which the first ``lengths[s]`` are in use. Decoding writes
new tokens at ``offsets + lengths`` (in place, no copy of the cache); a segment that runs out of room is
regrown once by re-laying out the layer with a larger reserve.

The buffers are private: a policy changes its layer only through the verbs (:meth:`LayerStore.write_selection`,
:meth:`~LayerStore.append`, :meth:`~LayerStore.keep_in_place`, :meth:`~LayerStore.keep_first`,
:meth:`~LayerStore.remove`, :meth:`~LayerStore.replace_pairs`, the per-pair state and
:meth:`~LayerStore.relayout`) and reads it through :meth:`~LayerStore.padded` and the metadata properties.
Only the kernels see the flat buffers (:meth:`~LayerStore.buffers`).

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

from .decode_room import growth
from .kernels.dispatch import RaggedBuffers, compact, ragged_attention


@dataclass
class Selection:
    """Tokens to keep, per segment.

    Attributes
    ----------
    index
        ``[segments, k_max]`` int64 token indices into the prompt keys (entries past ``count`` ignored).
    count
        ``[segments]`` int64 number of kept tokens per segment.
    scores
        ``[batch, kv_heads, k]`` the scores of the kept tokens before the window, best first, when the
        selection lists them in that order (``window_and_topk(..., window_first=True)``), else ``None``.
    """

    index: torch.Tensor
    count: torch.Tensor
    scores: torch.Tensor | None = None


class LayerStore:
    """The kept pairs of one attention layer (empty until :meth:`allocate`).

    Besides keys, values and their absolute positions, a store can hold per-pair statistics that move
    with their pair (KeepKV's votes ``log p`` and score estimates) and counts the bytes of policy state
    kept beside the pairs (MorphKV's window queries): :meth:`memory_bytes` is every byte the layer holds.

    Attributes
    ----------
    batch, kv_heads, head_dim
        Sizes; ``segments = batch * kv_heads``.
    """

    def __init__(self) -> None:
        self.batch = self.kv_heads = self.head_dim = 0
        self._keys: torch.Tensor | None = None
        self.release()

    # ---- allocation ------------------------------------------------------------------------------

    def allocate(self, batch: int, kv_heads: int, head_dim: int, capacity: torch.Tensor | np.ndarray,
                 dtype: torch.dtype, device: torch.device, votes: bool = False) -> LayerStore:
        """Allocate empty segments of the given capacities (``[segments]``); returns the store.

        ``votes``: the pairs carry KeepKV votes (``log p``, added to their attention logits).
        """
        self.batch, self.kv_heads, self.head_dim = batch, kv_heads, head_dim
        self._layout(capacity, dtype, device, votes)
        self._lengths = torch.zeros_like(self._capacity)
        self._host_lengths = np.zeros_like(self._host_capacity)
        self._peak = torch.zeros_like(self._capacity)
        self._pair_state: dict[str, torch.Tensor] = {}
        self._state_bytes = 0
        self._limit: tuple[torch.Tensor, np.ndarray] | None = None
        self._frozen = None
        return self

    def set_limit(self, limit: torch.Tensor | np.ndarray) -> None:
        """The length ``[segments]`` at which :meth:`at_limit` calls a segment full (by default its capacity):
        a constant-size policy evicts there while its capacity grows from a smaller decode room."""
        host = host_array(limit).reshape(-1).copy()
        self._limit = (torch.from_numpy(host).to(self._capacity.device), host)

    def release(self) -> None:
        """Free the buffers (the store is empty again, as before :meth:`allocate`)."""
        self._keys = self._values = self._positions = self._log_votes = None
        self._pair_state = {}
        self._state_bytes = 0
        self._frozen: tuple[torch.Tensor, np.ndarray] | None = None

    # ---- rows of several stores ------------------------------------------------------------------

    def stack_rows(self, stores: list[LayerStore]) -> LayerStore:
        """Fill this store with the batch rows of ``stores``, in order (one copy of their pairs); returns it.

        Each source keeps its segments' capacity, length, peak and limit, so the stacked rows decode
        exactly as each source would alone. Sources must agree on KV heads, head size, dtype and device,
        and hold no per-pair statistics or votes.
        """
        first = stores[0]
        for s in stores:
            if s._pair_state or s._log_votes is not None or s._frozen is not None:
                raise ValueError("stack_rows: a store with votes, per-pair state or frozen rows cannot be stacked")
            if (s.kv_heads, s.head_dim, s._keys.dtype, s._keys.device) != (
                    first.kv_heads, first.head_dim, first._keys.dtype, first._keys.device):
                raise ValueError("stack_rows: the stores differ in KV heads, head size, dtype or device")
        self.batch, self.kv_heads, self.head_dim = sum(s.batch for s in stores), first.kv_heads, first.head_dim
        self._layout(np.concatenate([s._host_capacity for s in stores]), first._keys.dtype, first._keys.device,
                     votes=False, zeroed=False)          # every segment row is copied next
        base = 0
        for s in stores:                                  # every source's segments, back to back
            rows = s._spare
            self._keys[base:base + rows] = s._keys[:rows]
            self._values[base:base + rows] = s._values[:rows]
            self._positions[base:base + rows] = s._positions[:rows]
            base += rows
        self._lengths = torch.cat([s._lengths for s in stores])
        self._host_lengths = np.concatenate([s._host_lengths for s in stores])
        self._peak = torch.cat([s._peak for s in stores])
        self._pair_state = {}
        self._state_bytes = sum(s._state_bytes for s in stores)
        # a source without a limit of its own evicts at its capacity: -1 says so segment by segment
        limits = [s._limit or (torch.full_like(s._capacity, -1), np.full_like(s._host_capacity, -1)) for s in stores]
        self._limit = None if all(s._limit is None for s in stores) else (
            torch.cat([lim[0] for lim in limits]), np.concatenate([lim[1] for lim in limits]))
        self._frozen = None
        return self

    def take_rows(self, source: LayerStore, first: int, count: int) -> LayerStore:
        """Fill this store with batch rows ``first .. first + count - 1`` of ``source`` (one copy of their
        pairs); returns it.

        The rows' segments keep their capacity, length, peak and limit: the store is the one those rows
        built alone before :meth:`stack_rows`.
        """
        h = source.kv_heads
        seg = slice(first * h, (first + count) * h)
        start = int(source._host_capacity[: first * h].sum())
        self.batch, self.kv_heads, self.head_dim = count, h, source.head_dim
        self._layout(source._host_capacity[seg].copy(), source._keys.dtype, source._keys.device,
                     votes=source._log_votes is not None, zeroed=False)
        rows = self._spare
        self._keys[:rows] = source._keys[start:start + rows]
        self._values[:rows] = source._values[start:start + rows]
        self._positions[:rows] = source._positions[start:start + rows]
        if self._log_votes is not None:
            self._log_votes[:rows] = source._log_votes[start:start + rows]
        self._lengths = source._lengths[seg].clone()
        self._host_lengths = source._host_lengths[seg].copy()
        self._peak = source._peak[seg].clone()
        self._pair_state = {}
        self._state_bytes = 0
        own = source._limit is not None and bool((source._limit[1][seg] >= 0).all())
        self._limit = (source._limit[0][seg].clone(), source._limit[1][seg].copy()) if own else None
        self._frozen = None
        return self

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only the batch rows ``rows`` (in that order), in new buffers: one copy of their pairs, the
        others freed. Their segments keep capacity, length, peak, limit and frozen state."""
        h = self.kv_heads
        segs = np.concatenate([np.arange(r * h, (r + 1) * h) for r in rows]) if rows else np.zeros(0, np.int64)
        starts = np.cumsum(self._host_capacity) - self._host_capacity
        blocks = [(int(starts[r * h]), int(self._host_capacity[r * h:(r + 1) * h].sum())) for r in rows]
        keys, values, positions = self._keys, self._values, self._positions
        pick = torch.from_numpy(segs).to(self._capacity.device)
        lengths, peak = self._lengths[pick], self._peak[pick]
        limit = None if self._limit is None else (self._limit[0][pick], self._limit[1][segs].copy())
        frozen = None if self._frozen is None else self._frozen[1][segs]
        host_lengths = self._host_lengths[segs].copy()
        self.batch = len(rows)
        self._layout(self._host_capacity[segs].copy(), keys.dtype, keys.device, votes=False, zeroed=False)
        at = 0
        for start, size in blocks:                  # each row's segments are one block, in order
            self._keys[at:at + size] = keys[start:start + size]
            self._values[at:at + size] = values[start:start + size]
            self._positions[at:at + size] = positions[start:start + size]
            at += size
        self._lengths, self._host_lengths, self._peak, self._limit = lengths, host_lengths, peak, limit
        self._frozen = None
        if frozen is not None and frozen.any():
            self.freeze(frozen)

    def freeze_rows(self, first: int, count: int) -> None:
        """:meth:`freeze` the segments of batch rows ``first .. first + count - 1`` too."""
        host = self._frozen[1].copy() if self._frozen is not None else np.zeros(self.segments, dtype=bool)
        host[first * self.kv_heads:(first + count) * self.kv_heads] = True
        self.freeze(host)

    def freeze(self, host_frozen: np.ndarray) -> None:
        """Stop changing the segments marked True (``[segments]`` host bool): appends write them nothing and
        :meth:`at_limit` never calls them full, so a finished batch row keeps what it held when it finished
        while the other rows decode on."""
        host = np.asarray(host_frozen, dtype=bool).reshape(-1).copy()
        self._frozen = (torch.from_numpy(host).to(self._capacity.device), host) if host.any() else None

    @property
    def allocated(self) -> bool:
        return self._keys is not None

    def _layout(self, capacity: torch.Tensor | np.ndarray, dtype: torch.dtype, device: torch.device,
                votes: bool, zeroed: bool = True) -> None:
        """Fresh zeroed buffers and segment metadata for ``capacity`` (``[segments]``); with ``zeroed=False``
        only the spare row is set (the caller writes every segment row next)."""
        host = host_array(capacity).reshape(-1)
        self._host_capacity = host
        self._capacity = torch.from_numpy(host.copy()).to(device)
        self._offsets = torch.cumsum(self._capacity, 0) - self._capacity
        self._spare = int(host.sum())
        rows = self._spare + 1
        # Zeroed: unused slots are read (masked) by the strided view, and must never hold NaN.
        make = torch.zeros if zeroed else torch.empty
        self._keys = make(rows, self.head_dim, dtype=dtype, device=device)
        self._values = make(rows, self.head_dim, dtype=dtype, device=device)
        self._positions = torch.full((rows,), -1, dtype=torch.int32, device=device)
        self._log_votes = torch.zeros(rows, dtype=torch.float32, device=device) if votes else None
        if not zeroed:
            self._keys[self._spare] = 0
            self._values[self._spare] = 0

    # ---- sizes -----------------------------------------------------------------------------------

    @property
    def segments(self) -> int:
        return self.batch * self.kv_heads

    @property
    def lengths(self) -> torch.Tensor:
        """``[segments]`` int64 pairs held per segment (on the device; read it, do not write it)."""
        return self._lengths

    @property
    def capacity(self) -> torch.Tensor:
        """``[segments]`` int64 rows each segment owns (on the device)."""
        return self._capacity

    @property
    def host_lengths(self) -> np.ndarray:
        """``[segments]`` NumPy mirror of :attr:`lengths` (always equal to it)."""
        return self._host_lengths

    @property
    def host_capacity(self) -> np.ndarray:
        """``[segments]`` NumPy mirror of :attr:`capacity`."""
        return self._host_capacity

    def kept(self) -> torch.Tensor:
        """``[batch, kv_heads]`` tokens held per segment."""
        return self._lengths.reshape(self.batch, self.kv_heads).clone()

    def peak(self) -> torch.Tensor:
        """``[batch, kv_heads]`` the most tokens each segment ever held."""
        return self._peak.reshape(self.batch, self.kv_heads).clone()

    def max_length(self) -> int:
        """The longest segment (from the host mirror: no device read)."""
        return int(self._host_lengths.max()) if self._host_lengths.size else 0

    def element_size(self) -> int:
        """Bytes of one key (or value) element."""
        return self._keys.element_size()

    def memory_bytes(self) -> int:
        """Bytes this layer really allocates (buffers, positions, votes, metadata, policy state)."""
        tensors = [self._keys, self._values, self._positions, self._offsets, self._lengths, self._capacity]
        if self._log_votes is not None:
            tensors.append(self._log_votes)
        tensors.extend(self._pair_state.values())
        return sum(t.numel() * t.element_size() for t in tensors) + self._state_bytes

    def used_bytes(self) -> int:
        """Bytes of the pairs actually held (lengths × bytes per token)."""
        return int(self._lengths.sum()) * self.bytes_per_token()

    def bytes_per_token(self) -> int:
        per = 2 * self.head_dim * self._keys.element_size() + self._positions.element_size()
        return per + (4 if self._log_votes is not None else 0)

    def at_limit(self, limit: torch.Tensor | None = None,
                 host_limit: np.ndarray | None = None) -> tuple[torch.Tensor, np.ndarray]:
        """Segments whose length reached ``limit`` (default: :meth:`set_limit`'s, else their capacity), on the
        device and on the host.

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
            limit, host_limit = getattr(self, "_limit", None) or (self._capacity, self._host_capacity)
            if limit is not self._capacity and (host_limit < 0).any():      # stacked rows without a limit
                limit = torch.where(limit < 0, self._capacity, limit)
                host_limit = np.where(host_limit < 0, self._host_capacity, host_limit)
        full, host_full = self._lengths >= limit, self._host_lengths >= host_limit
        if self._frozen is not None:
            full, host_full = full & ~self._frozen[0], host_full & ~self._frozen[1]
        return full, host_full

    # ---- views -----------------------------------------------------------------------------------

    def view_index(self, first: int = 0, last: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded gather index of the stored pairs of segments ``first .. last - 1`` (default: all).

        Returns
        -------
        index, valid
            ``[segments, width]`` flat row index (the spare row where ``valid`` is False) and
            ``[segments, width]`` bool; ``width`` is :func:`view_width` of the longest of those segments.
        """
        last = self.segments if last is None else last
        host = self._host_lengths[first:last]
        return self._index(torch.arange(first, last, device=self._lengths.device),
                           view_width(int(host.max()) if host.size else 0))

    def _index(self, segments: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        ar = torch.arange(width, device=self._lengths.device)
        valid = ar[None, :] < self._lengths[segments, None]
        return torch.where(valid, self._offsets[segments, None] + ar[None, :], self._spare), valid

    def padded(self) -> dict[str, torch.Tensor]:
        """Keys, values, positions, votes and mask as ``[segments, width, ...]`` tensors, to read.

        ``index`` (the flat row of each entry) addresses the per-pair state (:meth:`pair_state`). When every
        segment has the same capacity the tensors are views of the buffers, so they are read, not written.
        """
        return self._padded(0, self.segments)

    def padded_positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``[segments, width]`` positions and valid mask of the stored pairs (a gather of the positions
        only, where :meth:`padded` would gather keys and values too)."""
        index, valid = self.view_index()
        return self._positions[index].long(), valid

    def rows_differ(self) -> bool:
        """Whether the batch rows' padded views differ (other capacities or other widths: rows of a stacked
        cache with other budgets), so that one view of all rows would pad every row to the longest."""
        if self.batch < 2:
            return False
        return bool((self._host_capacity != self._host_capacity[0]).any()) or len(set(self.row_widths())) > 1

    def row_widths(self) -> np.ndarray:
        """``[batch]`` the :func:`view_width` of each batch row's longest segment (from the host mirror)."""
        longest = self._host_lengths.reshape(self.batch, self.kv_heads).max(1) if self.segments else \
            np.zeros(self.batch, dtype=np.int64)
        return np.array([view_width(int(n)) for n in longest], dtype=np.int64)

    def rows_padded(self, rows: list[int], width: int) -> dict[str, torch.Tensor]:
        """:meth:`padded` of some batch rows' segments at ``width`` (``[rows · kv_heads, width, ...]``): for
        rows whose :meth:`row_widths` is ``width``, the same values and shapes a store holding only that row
        gives, so the attention of those rows is the attention of each alone."""
        h = self.kv_heads
        if len(rows) == 1:           # one row: a strided view where its capacities allow, as alone
            return self._padded(rows[0] * h, (rows[0] + 1) * h)
        segments = torch.tensor([r * h + k for r in rows for k in range(h)], device=self._lengths.device)
        index, valid = self._index(segments, width)
        return self._gathered(index, valid)

    def _padded(self, first: int, last: int) -> dict[str, torch.Tensor]:
        index, valid = self.view_index(first, last)
        width = index.shape[1]
        caps = self._host_capacity[first:last]
        cap = int(caps[0]) if caps.size else 0
        if cap >= width and bool((caps == cap).all()):
            # Equal capacities: the segments are a strided view of the flat buffer, no gather needed.
            seg, start = last - first, int(self._host_capacity[:first].sum())
            rows = slice(start, start + seg * cap)
            out = {"index": index, "valid": valid,
                   "keys": self._keys[rows].view(seg, cap, -1)[:, :width],
                   "values": self._values[rows].view(seg, cap, -1)[:, :width],
                   "positions": self._positions[rows].view(seg, cap)[:, :width].long()}
            if self._log_votes is not None:
                out["log_votes"] = self._log_votes[rows].view(seg, cap)[:, :width]
            return out
        return self._gathered(index, valid)

    def _gathered(self, index: torch.Tensor, valid: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {"index": index, "valid": valid, "keys": self._keys[index], "values": self._values[index],
               "positions": self._positions[index].long()}
        if self._log_votes is not None:
            out["log_votes"] = self._log_votes[index]
        return out

    def buffers(self) -> RaggedBuffers:
        """The flat buffers, for the kernels (:mod:`headprobe.runtime.kernels.dispatch`) only."""
        return RaggedBuffers(self._keys, self._values, self._positions, self._offsets, self._lengths,
                             self._log_votes)

    def attend(self, query: torch.Tensor, query_positions: torch.Tensor, scaling: float,
               sliding_window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        """Attention of ``query`` ``[batch, q_heads, n, head_dim]`` over the stored pairs; same shape out."""
        return ragged_attention(query, self, query_positions, scaling, sliding_window, softcap,
                                max_len=self.max_length())

    # ---- writes ----------------------------------------------------------------------------------

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
        count = host_array(selection.count).reshape(-1)
        if bool((count > self._host_capacity).any()):
            raise ValueError("selection larger than the segment capacity")
        compact(self.buffers(), keys, values, positions, selection)
        self._host_lengths = count
        if self._log_votes is not None and log_votes is not None:
            k = selection.index.shape[1]
            ar = torch.arange(k, device=keys.device)
            valid = ar[None, :] < selection.count[:, None]
            rows = (self._offsets[:, None] + ar[None, :])[valid]
            self._log_votes[rows] = log_votes[valid].float()
        self._track_peak()

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
        if valid is None and self._frozen is not None:       # finished rows take nothing (decided on the host)
            ok = (~self._frozen[0])[:, None].expand(b * h, n)
            added = ok.long().sum(1)
            host_added = np.where(self._frozen[1], 0, n).astype(np.int64)
        elif valid is None:
            ok = torch.ones(b * h, n, dtype=torch.bool, device=keys.device)
            added = torch.full((b * h,), n, dtype=torch.int64, device=keys.device)
            host_added = np.full(b * h, n, dtype=np.int64)
        else:
            ok = valid[:, None, :].expand(b, h, n).reshape(b * h, n)
            added = ok.long().sum(1)
            host_added = host_array(added)
        slot = self._lengths[:, None] + torch.cumsum(ok.long(), 1) - 1
        rows = torch.where(ok, self._offsets[:, None] + slot, self._spare).reshape(-1)
        self._keys[rows] = keys.reshape(b * h * n, d).to(self._keys.dtype)
        self._values[rows] = values.reshape(b * h * n, d).to(self._values.dtype)
        self._positions[rows] = positions[:, None, :].expand(b, h, n).reshape(-1).to(torch.int32)
        if self._log_votes is not None:
            self._log_votes[rows] = 0.0
        for t in self._pair_state.values():
            t[rows] = 0.0
        self._lengths = self._lengths + added
        self._host_lengths = self._host_lengths + host_added
        self._track_peak()

    def ensure_room(self, extra: int) -> None:
        """Make room for ``extra`` more tokens in every segment (re-layout when some segment is full)."""
        room = self._host_capacity - self._host_lengths
        short = room < extra
        if self._frozen is not None:                # a finished row takes nothing more
            short &= ~self._frozen[1]
        if bool(short.any()):       # a full segment grows by a step (an eighth of it); the others keep their room
            room = np.clip(room, 0, None)
            self.relayout(np.where(short, room + growth(self._host_capacity, extra), room), keep_limit=True)

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
        host_count = host_array(count).reshape(-1) if host_count is None else np.asarray(host_count, dtype=np.int64)
        k = local_index.shape[1]
        if k == 0:
            self._lengths = torch.zeros_like(self._lengths)
            self._host_lengths = np.zeros_like(self._host_lengths)
            return
        ar = torch.arange(k, device=local_index.device)
        valid = ar[None, :] < count[:, None]
        src = torch.where(valid, self._offsets[:, None] + local_index.clamp(min=0), self._spare)
        dst = torch.where(valid, self._offsets[:, None] + ar[None, :], self._spare)
        self._move_rows(dst.reshape(-1), src.reshape(-1))
        self._lengths = count.to(self._lengths.dtype).clone()
        self._host_lengths = host_count.copy()

    def keep_first(self, lengths: torch.Tensor) -> None:
        """Cut every segment to its first ``lengths[s]`` pairs (``[segments]``, at most what it holds); reads
        them to the host once."""
        self._lengths = lengths.to(device=self._lengths.device, dtype=torch.int64).reshape(-1).clone()
        self._host_lengths = host_array(self._lengths).reshape(-1)
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
        src = torch.where(mask, self._offsets + self._lengths - 1, self._spare)
        dst = torch.where(mask, self._offsets + local_slot, self._spare)
        self._move_rows(dst, src)
        self._lengths = self._lengths - mask.long()
        self._host_lengths = self._host_lengths - host_mask

    def replace_pairs(self, local_slot: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      log_votes: torch.Tensor | None = None, state: dict[str, torch.Tensor] | None = None) -> None:
        """Overwrite pair ``local_slot[s]`` of every segment where ``mask[s]`` (a merge's result), in place.

        Parameters
        ----------
        local_slot
            ``[segments]`` slot to overwrite, ``< lengths`` where ``mask``.
        mask
            ``[segments]`` bool; the other segments write nothing (their writes go to the spare row).
        keys, values
            ``[segments, head_dim]`` the new pairs.
        log_votes
            ``[segments]`` their votes ``log p`` (a store with votes).
        state
            Per-pair statistics (:meth:`add_pair_state`) by name, ``[segments, ...]``.
        """
        rows = torch.where(mask, self._offsets + local_slot, self._spare)
        self._keys[rows] = keys.to(self._keys.dtype)
        self._values[rows] = values.to(self._values.dtype)
        if log_votes is not None:
            self._log_votes[rows] = log_votes.to(self._log_votes.dtype)
        for name, value in (state or {}).items():
            buffer = self._pair_state[name]
            buffer[rows] = value.to(buffer.dtype)

    def relayout(self, reserve: torch.Tensor | np.ndarray | int, keep_limit: bool = False) -> None:
        """Reallocate tightly: capacity = length + reserve per segment (one copy of the kept pairs); the limit
        of :meth:`set_limit` goes too, unless ``keep_limit`` (a segment regrowing its decode room)."""
        if not keep_limit:
            self._limit = None
        index, valid = self.view_index()
        reserve_host = np.broadcast_to(host_array(reserve), self._host_lengths.shape)
        keys, values, positions, log_votes = self._keys, self._values, self._positions, self._log_votes
        self._layout(self._host_lengths + reserve_host, keys.dtype, keys.device, votes=log_votes is not None)
        width = index.shape[1]
        ar = torch.arange(width, device=index.device)
        dst = torch.where(valid, self._offsets[:, None] + ar[None, :], self._spare).reshape(-1)
        src = index.reshape(-1)
        self._keys[dst] = keys[src]
        self._values[dst] = values[src]
        self._positions[dst] = positions[src]
        if log_votes is not None:
            self._log_votes[dst] = log_votes[src]
        for name, t in self._pair_state.items():
            moved = torch.zeros((self._keys.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
            moved[dst] = t[src]
            self._pair_state[name] = moved
        self._lengths = self._lengths.clone()
        self._peak = torch.maximum(self._peak, self._lengths)

    # ---- policy state ----------------------------------------------------------------------------

    def add_pair_state(self, name: str, first: torch.Tensor) -> None:
        """Add a float32 per-pair statistic that moves with its pair (counted in :meth:`memory_bytes`).

        Parameters
        ----------
        name
            Its name, for :meth:`pair_state`, :meth:`set_pair_state` and :meth:`replace_pairs`.
        first
            ``[segments, k, *trailing]`` its values for each segment's first ``k`` pairs (those past the
            segment's length are ignored). Every other pair, and each appended one, starts at 0.
        """
        k = first.shape[1]
        buffer = torch.zeros((self._keys.shape[0], *first.shape[2:]), dtype=torch.float32, device=self._keys.device)
        ar = torch.arange(k, device=first.device)
        valid = ar[None, :] < self._lengths[:, None]
        buffer[(self._offsets[:, None] + ar[None, :])[valid]] = first[valid].to(buffer.dtype)
        self._pair_state[name] = buffer

    def pair_state(self, name: str, index: torch.Tensor) -> torch.Tensor:
        """The statistic ``name`` of the pairs at ``index`` (``padded()["index"]``): ``[*index.shape, ...]``."""
        return self._pair_state[name][index]

    def set_pair_state(self, name: str, index: torch.Tensor, values: torch.Tensor) -> None:
        """Write the statistic ``name`` of the pairs at ``index`` (``padded()["index"]``; padding entries
        address the spare row, which no pair reads)."""
        buffer = self._pair_state[name]
        buffer[index] = values.to(buffer.dtype)

    def set_state_bytes(self, nbytes: int) -> None:
        """Count ``nbytes`` of policy state kept beside the pairs (MorphKV's window queries) as this layer's
        memory."""
        self._state_bytes = nbytes

    # ---- internals -------------------------------------------------------------------------------

    def _move_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy rows ``src`` to rows ``dst`` of every per-pair buffer (all reads before the writes)."""
        for t in (self._keys, self._values, self._positions, self._log_votes, *self._pair_state.values()):
            if t is not None:
                t[dst] = t[src].clone()

    def _track_peak(self) -> None:
        torch.maximum(self._peak, self._lengths, out=self._peak)


#: The padded views of the store are rounded up to at least this many columns (so that rows of a stacked
#: cache with close lengths share a width, and each row's attention has the shapes it has alone).
VIEW_WIDTH_STEP = 32


def view_width(longest: int) -> int:
    """Columns of a padded view whose longest segment holds ``longest`` pairs: rounded up to a step of
    :data:`VIEW_WIDTH_STEP`, or an eighth of the next power of two when that is more (at most a quarter of
    padding), at least one step.

    >>> [view_width(n) for n in (0, 1, 32, 33, 256, 257, 1000, 2000)]
    [32, 32, 32, 64, 256, 320, 1024, 2048]
    """
    step = max(VIEW_WIDTH_STEP, (1 << max(longest - 1, 0).bit_length()) // 8)
    return max(-(-longest // step), 1) * step


def host_array(x: torch.Tensor | np.ndarray | int) -> np.ndarray:
    """``x`` as a host int64 array (a device tensor is read once: callers keep this off the decode path)."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.int64).numpy().copy()
    return np.array(x, dtype=np.int64)
