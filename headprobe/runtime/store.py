"""Ragged per-(batch row, KV head) key/value storage of one layer.

One flat buffer per layer holds every segment back to back; segment ``s = b * kv_heads + h`` owns rows
``offsets[s] .. offsets[s] + capacity[s]`` of which the first ``lengths[s]`` are in use. Decoding writes
new tokens at ``offsets + lengths`` (in place, no copy of the cache); a segment that runs out of room is
regrown once by re-laying out the layer with a larger reserve.
"""

from __future__ import annotations

from dataclasses import dataclass

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
        ``[total_capacity, head_dim]`` flat buffers (post-RoPE keys).
    positions
        ``[total_capacity]`` int32 absolute token positions of the stored pairs.
    log_votes
        ``[total_capacity]`` float32 KeepKV ``log p`` per pair, or ``None`` when the policy has no votes.
    offsets, lengths, capacity
        ``[segments]`` int64 segment metadata; ``segments = batch * kv_heads``.
    peak_lengths
        ``[segments]`` the largest length each segment ever reached.
    """

    def __init__(self, batch: int, kv_heads: int, head_dim: int, capacity: torch.Tensor, dtype: torch.dtype,
                 device: torch.device, votes: bool = False) -> None:
        self.batch, self.kv_heads, self.head_dim = batch, kv_heads, head_dim
        capacity = capacity.to(device=device, dtype=torch.int64).reshape(-1)
        self.capacity = capacity
        self.offsets = torch.cumsum(capacity, 0) - capacity
        self.lengths = torch.zeros_like(capacity)
        self.peak_lengths = torch.zeros_like(capacity)
        total = max(int(capacity.sum()), 1)
        # Zeroed: unused slots are read (masked) by the strided view, and must never hold NaN.
        self.keys = torch.zeros(total, head_dim, dtype=dtype, device=device)
        self.values = torch.zeros(total, head_dim, dtype=dtype, device=device)
        self.positions = torch.full((total,), -1, dtype=torch.int32, device=device)
        self.log_votes = torch.zeros(total, dtype=torch.float32, device=device) if votes else None
        self.extra_bytes = 0  # policy state counted as cache memory (MorphKV queries)
        #: Per-pair policy statistics ``[total_capacity, ...]`` that move with their pair (KeepKV scores).
        self.aux: dict[str, torch.Tensor] = {}

    # ---- sizes -----------------------------------------------------------------------------------

    @property
    def segments(self) -> int:
        return self.batch * self.kv_heads

    def kept(self) -> torch.Tensor:
        """``[batch, kv_heads]`` tokens held per segment."""
        return self.lengths.reshape(self.batch, self.kv_heads).clone()

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

    # ---- views -----------------------------------------------------------------------------------

    def view_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded gather index of the stored pairs.

        Returns
        -------
        index, valid
            ``[segments, max_len]`` flat row index (clamped to a valid row where ``valid`` is False) and
            ``[segments, max_len]`` bool.
        """
        width = max(int(self.lengths.max()) if self.lengths.numel() else 0, 1)
        ar = torch.arange(width, device=self.lengths.device)
        valid = ar[None, :] < self.lengths[:, None]
        index = self.offsets[:, None] + ar[None, :]
        index = torch.where(valid, index, torch.zeros_like(index)).clamp_(max=self.keys.shape[0] - 1)
        return index, valid

    def padded(self) -> dict[str, torch.Tensor]:
        """Keys, values, positions and mask as ``[segments, max_len, ...]`` tensors (copies)."""
        index, valid = self.view_index()
        width = index.shape[1]
        cap = int(self.capacity[0]) if self.capacity.numel() else 0
        if cap >= width and bool((self.capacity == cap).all()) and self.segments * cap <= self.keys.shape[0]:
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
        """Allocate a per-pair statistic ``[total_capacity, *trailing]`` float32."""
        self.aux[name] = torch.full((self.keys.shape[0], *trailing), fill, dtype=torch.float32,
                                    device=self.keys.device)
        return self.aux[name]

    def _move_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        for t in (self.keys, self.values, self.positions, self.log_votes, *self.aux.values()):
            if t is not None:
                t[dst] = t[src].clone()

    def remove(self, local_slot: torch.Tensor, mask: torch.Tensor) -> None:
        """Drop pair ``local_slot[s]`` of every segment where ``mask[s]`` (the last pair moves into its slot)."""
        if not bool(mask.any()):
            return
        src = (self.offsets + self.lengths - 1)[mask]
        dst = (self.offsets + local_slot)[mask]
        self._move_rows(dst, src)
        self.lengths = self.lengths - mask.long()

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

        if bool((selection.count > self.capacity).any()):
            raise ValueError("selection larger than the segment capacity")
        compact(self, keys, values, positions, selection)
        if self.log_votes is not None and log_votes is not None:
            k = selection.index.shape[1]
            ar = torch.arange(k, device=keys.device)
            valid = ar[None, :] < selection.count[:, None]
            rows = (self.offsets[:, None] + ar[None, :])[valid]
            self.log_votes[rows] = log_votes[valid].float()
        self._track_peak()

    def ensure_room(self, extra: int) -> None:
        """Make room for ``extra`` more tokens in every segment (re-layout when some segment is full)."""
        room = self.capacity - self.lengths
        if bool((room < extra).any()):
            self.relayout(room.clamp(min=0) + max(extra, 64))

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
            ``[batch, n]`` bool; tokens marked False (padding) are skipped.
        """
        b, h, n, d = keys.shape
        self.ensure_room(n)
        k = keys.reshape(b * h, n, d)
        v = values.reshape(b * h, n, d)
        pos = positions[:, None, :].expand(b, h, n).reshape(b * h, n)
        if valid is None:
            ok = torch.ones(b * h, n, dtype=torch.bool, device=keys.device)
        else:
            ok = valid[:, None, :].expand(b, h, n).reshape(b * h, n)
        slot = self.lengths[:, None] + torch.cumsum(ok.long(), 1) - 1
        rows = (self.offsets[:, None] + slot)[ok]
        self.keys[rows] = k[ok].to(self.keys.dtype)
        self.values[rows] = v[ok].to(self.values.dtype)
        self.positions[rows] = pos[ok].to(torch.int32)
        if self.log_votes is not None:
            self.log_votes[rows] = 0.0
        for t in self.aux.values():
            t[rows] = 0.0
        self.lengths += ok.long().sum(1)
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

    def keep_in_place(self, local_index: torch.Tensor, count: torch.Tensor) -> None:
        """Keep only the given pairs of each segment, moved to the front of the segment (no realloc).

        Parameters
        ----------
        local_index
            ``[segments, k_max]`` slots to keep (entries past ``count`` ignored).
        count
            ``[segments]`` number of slots kept.
        """
        k = local_index.shape[1]
        if k == 0:
            self.lengths.zero_()
            return
        ar = torch.arange(k, device=local_index.device)
        valid = ar[None, :] < count[:, None]
        src = (self.offsets[:, None] + local_index.clamp(min=0))[valid]
        dst = (self.offsets[:, None] + ar[None, :])[valid]
        self._move_rows(dst, src)
        self.lengths = count.to(self.lengths.dtype).clone()

    def relayout(self, reserve: torch.Tensor | int) -> None:
        """Reallocate tightly: capacity = length + reserve per segment (one copy of the kept pairs)."""
        index, valid = self.view_index()
        reserve_t = torch.as_tensor(reserve, device=self.lengths.device, dtype=torch.int64).expand_as(self.lengths)
        new = LayerStore(self.batch, self.kv_heads, self.head_dim, self.lengths + reserve_t, self.keys.dtype,
                         self.keys.device, votes=self.log_votes is not None)
        width = index.shape[1]
        ar = torch.arange(width, device=index.device)
        dst = (new.offsets[:, None] + ar[None, :])[valid]
        src = index[valid]
        new.keys[dst] = self.keys[src]
        new.values[dst] = self.values[src]
        new.positions[dst] = self.positions[src]
        if self.log_votes is not None:
            new.log_votes[dst] = self.log_votes[src]
        for name, t in self.aux.items():
            new.aux[name] = torch.zeros((new.keys.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
            new.aux[name][dst] = t[src]
        new.lengths = self.lengths.clone()
        new.peak_lengths = torch.maximum(self.peak_lengths, new.lengths)
        new.extra_bytes = self.extra_bytes
        self.__dict__.update(new.__dict__)
