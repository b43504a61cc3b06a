"""Choose the Triton kernels or the PyTorch path.

``auto`` (default) uses Triton for CUDA tensors when Triton is installed, PyTorch otherwise. ``triton``
forces the kernels (on CPU tensors they run only under ``TRITON_INTERPRET=1``); where they cannot run, the
PyTorch path is used and a warning says so once.

The first launch of each kernel is tried: Triton compiles a kernel and builds its launcher (which needs a
C compiler, the Python headers and ``libcuda.so.1``) on first use, so an installed Triton can still fail
there. A failed first launch warns once, switches this process to the PyTorch path and returns the
PyTorch result; errors of a kernel that has launched before are raised.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, TypeVar

import torch

from ...errors import HeadprobeError
from .launch import interpreting
from .torch_ref import compact_torch, ragged_attention_torch


class RaggedBuffers(NamedTuple):
    """A layer's flat buffers, as the kernels read and write them (the store hands them out,
    :meth:`headprobe.runtime.store.LayerStore.buffers`).

    ``keys``/``values`` ``[rows, head_dim]`` and ``positions`` ``[rows]`` int32; per segment
    ``s = b · kv_heads + h`` its first row ``offsets[s]`` and ``lengths[s]`` (int64); ``log_votes`` ``[rows]``
    float32 or ``None``.
    """

    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    offsets: torch.Tensor
    lengths: torch.Tensor
    log_votes: torch.Tensor | None


class SegmentStore(Protocol):
    """What the attention reads of a layer's store (:class:`headprobe.runtime.store.LayerStore`): its
    ``buffers()`` for the kernel, ``padded()`` (the per-segment padded view) for the PyTorch path, or the
    views of the rows of one width (``row_widths``, ``rows_padded``) when rows differ (``rows_differ``)."""

    batch: int
    kv_heads: int

    def buffers(self) -> RaggedBuffers: ...

    def padded(self) -> dict[str, torch.Tensor]: ...

    def rows_differ(self) -> bool: ...

    def row_widths(self) -> Any: ...

    def rows_padded(self, rows: list[int], width: int) -> dict[str, torch.Tensor]: ...


class TokenSelection(Protocol):
    """Which prompt tokens each segment keeps: ``index`` ``[segments, k_max]`` and ``count`` ``[segments]``."""

    index: torch.Tensor
    count: torch.Tensor

BACKENDS = ("auto", "torch", "triton")
_backend = "auto"
_warned: set[str] = set()
#: Kernels that have launched once in this process (their later errors are real errors).
_launched: set[str] = set()
#: Why Triton was switched off in this process (first launch failed), or ``None``.
_launch_failure: str | None = None

T = TypeVar("T")


def set_kernel_backend(name: str) -> str:
    """Select the kernel backend; returns the previous one."""
    global _backend
    if name not in BACKENDS:
        raise HeadprobeError(f"kernel backend {name!r}: expected one of {', '.join(BACKENDS)}")
    previous, _backend = _backend, name
    return previous


def get_backend() -> str:
    return _backend


@functools.cache
def triton_available() -> bool:
    """Whether Triton imports (checked once per process)."""
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install raises more than ImportError; either way no Triton
        return False
    return True


def launch_failure() -> str | None:
    """Why the Triton kernels were switched off in this process (a first launch failed), else ``None``."""
    return _launch_failure


def reset_launch_state() -> None:
    """Forget launch failures, launched kernels and given warnings (a fresh process's state)."""
    global _launch_failure
    _launch_failure = None
    _launched.clear()
    _warned.clear()


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"headprobe: {reason}; using the PyTorch path", RuntimeWarning, stacklevel=4)


def _use_triton(device: torch.device) -> bool:
    if _backend == "torch" or _launch_failure is not None:
        return False
    runnable = triton_available() and (device.type == "cuda" or (device.type == "cpu" and interpreting()))
    if _backend == "triton":
        if not runnable:
            reason = "Triton is not installed (pip install 'headprobe[gpu]')" if not triton_available() else \
                f"Triton cannot launch on {device.type} (set TRITON_INTERPRET=1 to interpret on CPU)"
            _warn_once(reason)
            return False
        return True
    return runnable and device.type == "cuda"


def _first_launch(kernel: str, launch: Callable[[], T], fallback: Callable[[], T]) -> T:
    """Run ``launch``; if this kernel has never launched and it raises, warn, switch Triton off, fall back."""
    global _launch_failure
    if kernel in _launched:
        return launch()
    try:
        result = launch()
    except Exception as exc:  # noqa: BLE001 - compiler, launcher build, driver: any reason it cannot run here
        detail = (str(exc).strip().splitlines() or [""])[0][:200]
        _launch_failure = f"the Triton {kernel} kernel failed to launch ({type(exc).__name__}: {detail})"
        _warn_once(_launch_failure)
        return fallback()
    _launched.add(kernel)
    return result


def compact(buffers: RaggedBuffers, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
            selection: TokenSelection) -> None:
    """Gather the selected prompt pairs of every segment of a layer into its buffers (one launch); sets
    ``buffers.lengths`` to the counts."""

    def with_torch() -> None:
        compact_torch(keys, values, positions, selection.index, selection.count, buffers.offsets,
                      buffers.keys, buffers.values, buffers.positions)
        buffers.lengths.copy_(selection.count)

    if not _use_triton(keys.device):
        return with_torch()

    def with_triton() -> None:
        # Triton kernels: imported only where Triton runs (the `gpu` extra)
        from .compact import compact_triton
        compact_triton(keys, values, positions, selection.index, selection.count, buffers.offsets,
                       buffers.keys, buffers.values, buffers.positions, buffers.lengths)

    return _first_launch("compaction", with_triton, with_torch)


def _torch_attention(query: torch.Tensor, view: dict[str, torch.Tensor], query_positions: torch.Tensor,
                     scaling: float, sliding_window: int | None, softcap: float | None) -> torch.Tensor:
    return ragged_attention_torch(query, view["keys"], view["values"], view["positions"], view["valid"],
                                  query_positions, scaling, sliding_window, softcap, view.get("log_votes"))


def ragged_attention(query: torch.Tensor, store: SegmentStore, query_positions: torch.Tensor, scaling: float,
                     sliding_window: int | None = None, softcap: float | None = None,
                     max_len: int | None = None) -> torch.Tensor:
    """Attention of ``query`` ``[batch, q_heads, n, head_dim]`` over the ragged store of its layer.

    ``max_len`` is the longest segment when the caller knows it on the host (the decode kernel sizes its
    launch from it; without it the kernel reads ``lengths`` from the device, one sync).

    Returns ``[batch, q_heads, n, head_dim]``.
    """

    def with_torch() -> torch.Tensor:
        if not store.rows_differ():
            return _torch_attention(query, store.padded(), query_positions, scaling, sliding_window, softcap)
        # rows of other budgets (a stacked cache): the rows of one width attend together, each as it would alone
        widths = store.row_widths()
        out = torch.empty_like(query)
        for width in sorted(set(widths.tolist())):
            rows = [b for b in range(store.batch) if widths[b] == width]
            pick = torch.tensor(rows, device=query.device)
            out[pick] = _torch_attention(query[pick], store.rows_padded(rows, width), query_positions[pick],
                                         scaling, sliding_window, softcap)
        return out

    if query.shape[2] != 1 or softcap or not _use_triton(query.device):
        return with_torch()

    def with_triton() -> torch.Tensor:
        # Triton kernels: imported only where Triton runs (the `gpu` extra)
        from .ragged_decode import ragged_decode_triton
        buf = store.buffers()
        return ragged_decode_triton(query, buf.keys, buf.values, buf.positions, buf.offsets, buf.lengths,
                                    store.kv_heads, query_positions, scaling, sliding_window, buf.log_votes,
                                    max_len=max_len)

    return _first_launch("ragged decode", with_triton, with_torch)
