"""Choose the Triton kernels or the PyTorch path.

``auto`` (default) uses Triton for CUDA tensors when Triton is installed, PyTorch otherwise. ``triton``
forces the kernels (on CPU tensors they run only under ``TRITON_INTERPRET=1``); where they cannot run, the
PyTorch path is used and a warning says so once.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

import torch

from .torch_ref import compact_torch, ragged_attention_torch

if TYPE_CHECKING:  # pragma: no cover
    from ..store import LayerStore, Selection

BACKENDS = ("auto", "torch", "triton")
_backend = "auto"
_warned: set[str] = set()


def set_backend(name: str) -> str:
    """Select the kernel backend; returns the previous one."""
    global _backend
    if name not in BACKENDS:
        from ...errors import HeadprobeError
        raise HeadprobeError(f"kernel backend {name!r}: expected one of {', '.join(BACKENDS)}")
    previous, _backend = _backend, name
    return previous


def get_backend() -> str:
    return _backend


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def _use_triton(device: torch.device) -> bool:
    if _backend == "torch":
        return False
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    runnable = triton_available() and (device.type == "cuda" or (interpret and device.type == "cpu"))
    if _backend == "triton":
        if not runnable:
            reason = "Triton is not installed" if not triton_available() else \
                f"Triton cannot launch on {device.type} (set TRITON_INTERPRET=1 to interpret on CPU)"
            if reason not in _warned:
                _warned.add(reason)
                warnings.warn(f"headprobe: {reason}; using the PyTorch path", RuntimeWarning, stacklevel=3)
            return False
        return True
    return runnable and device.type == "cuda"


def compact(store: LayerStore, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
            selection: Selection) -> None:
    """Gather the selected prompt pairs of every segment of a layer into the store (one launch)."""
    if _use_triton(keys.device):
        from .compact import compact_triton
        compact_triton(keys, values, positions, selection.index, selection.count, store.offsets,
                       store.keys, store.values, store.positions, store.lengths)
    else:
        compact_torch(keys, values, positions, selection.index, selection.count, store.offsets,
                      store.keys, store.values, store.positions)
        store.lengths.copy_(selection.count)


def ragged_attention(query: torch.Tensor, store: LayerStore, query_positions: torch.Tensor, scaling: float,
                     sliding_window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """Attention of ``query`` ``[batch, q_heads, n, head_dim]`` over the ragged store of its layer.

    Returns ``[batch, q_heads, n, head_dim]``.
    """
    if query.shape[2] == 1 and not softcap and _use_triton(query.device):
        from .ragged_decode import ragged_decode_triton
        return ragged_decode_triton(query, store, query_positions, scaling, sliding_window)
    view = store.padded()
    return ragged_attention_torch(query, view["keys"], view["values"], view["positions"], view["valid"],
                                  query_positions, scaling, sliding_window, softcap, view.get("log_votes"))
