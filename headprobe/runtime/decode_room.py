"""How many decode rows a head gets at prefill, and how a full head grows.

A full (uncompressed) cache holds, for every head, exactly the tokens seen so far. The compressed cache
never reserves more than that up front: a head's decode room at prefill is what the policy asks for
(:meth:`~headprobe.runtime.policies.base.Policy.reserve`), at most what can still pass through the cache
(``max_new_tokens - 1``: the last new token is never fed back) and at most the prompt tokens the head
dropped, or, when it dropped fewer, an eighth of what it keeps (at least :data:`FIRST_STEP` rows: a long
prompt kept whole is not copied again for a short answer). A head that runs out of room regrows by
:func:`growth` (an eighth of its capacity, at least :data:`FIRST_STEP` rows), so an answer that stops
early leaves little unused room, and a long one re-lays a layer out only a logarithmic number of times.
"""

from __future__ import annotations

import numpy as np
import torch

#: Decode rows a head that dropped (almost) nothing of the prompt gets at prefill, and the least a full
#: head regrows by.
FIRST_STEP = 8


def decode_room(asked: torch.Tensor, kept: torch.Tensor, prompt_lengths: torch.Tensor, kv_heads: int,
                max_new_tokens: int) -> torch.Tensor:
    """The decode room of every segment at prefill (``[segments]``): :func:`first_room` of the segments'
    tensors (read on the host, as the store lays out its capacities there anyway).

    Parameters
    ----------
    asked
        ``[segments]`` the room the policy asks for.
    kept
        ``[segments]`` prompt pairs the segment keeps.
    prompt_lengths
        ``[batch]`` real prompt tokens per row (segment ``b * kv_heads + h`` is row ``b``).
    kv_heads
        KV heads per row.
    max_new_tokens
        Tokens the generation may add.
    """
    seen = prompt_lengths.repeat_interleave(kv_heads)
    room = first_room(asked.cpu().numpy(), kept.cpu().numpy(), seen.cpu().numpy(), max_new_tokens)
    return torch.as_tensor(room, dtype=kept.dtype, device=kept.device)


def growth(capacity: np.ndarray, extra: int) -> np.ndarray:
    """Rows a full segment of ``capacity`` grows by to take ``extra`` more tokens."""
    return np.maximum(np.maximum(capacity // 8, FIRST_STEP), extra)


def first_room(asked: np.ndarray, kept: np.ndarray, prompt: int | np.ndarray, max_new_tokens: int) -> np.ndarray:
    """:func:`decode_room` on host arrays: ``prompt`` is the prompt length of every segment, or of all (what
    ``headprobe explain`` models, and the room a cross-layer rebalance lays layers out with)."""
    cap = np.clip(np.maximum(np.maximum(prompt - kept, 0), kept // 8), FIRST_STEP, None)
    cap = cap.clip(max=max(max_new_tokens - 1, 0))
    return np.minimum(asked, cap)


def grown_capacity(capacity: np.ndarray, need: np.ndarray) -> np.ndarray:
    """The capacity a segment of ``capacity`` rows ends at once it has held ``need`` pairs (each regrowth
    adds :func:`growth` rows, as :meth:`~headprobe.runtime.store.LayerStore.ensure_room` does one token at a
    time)."""
    capacity = np.asarray(capacity, dtype=np.int64).copy()
    need = np.asarray(need, dtype=np.int64)
    while (short := capacity < need).any():
        capacity = np.where(short, capacity + growth(capacity, 1), capacity)
    return capacity


__all__ = ("FIRST_STEP", "decode_room", "first_room", "grown_capacity", "growth")
