"""How the Triton kernels are built and launched: interpreter or compiler, autotuning, device, SM count.

A kernel is decorated on its first launch, for the mode in effect then (compiled, or interpreted under
``TRITON_INTERPRET=1``). Interpreting also needs Triton itself imported with the variable set: Triton
decorates its own helpers (``tl.zeros``, ``tl.sum``, ``tl.max``) at import. Compiled kernels autotune over
their configurations; under the interpreter the first configuration is used, which keeps CPU runs fast. Launches happen under the device guard of the tensors
(Triton launches on the current CUDA device otherwise).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: Streaming multiprocessors assumed where there is no CUDA device (the interpreter): sizes split-K.
DEFAULT_SM_COUNT = 8


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``), read at each launch."""
    try:
        from triton import knobs  # triton >= 3.4 parses the variable itself
    except ImportError:
        return os.environ.get("TRITON_INTERPRET", "0") == "1"
    return bool(knobs.runtime.interpret)


def interpreter_loaded() -> bool:
    """Whether Triton was imported with ``TRITON_INTERPRET=1`` (its own helpers are then interpreted)."""
    try:
        from triton.language import standard
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    return not isinstance(getattr(standard, "zeros", None), JITFunction)


def device_guard(device: torch.device) -> contextlib.AbstractContextManager:
    """Make ``device`` the current CUDA device for a launch (a no-op for CPU tensors)."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``; :data:`DEFAULT_SM_COUNT` off CUDA."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_sm_count(index)
    return DEFAULT_SM_COUNT


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


class LazyKernel:
    """A Triton kernel from a plain function, decorated at first launch for the current mode.

    Parameters
    ----------
    fn
        The kernel body (a function written for ``triton.jit``, not decorated).
    configs
        ``[(meta, num_warps, num_stages), ...]``: constexpr values the launcher does not pass. Compiled
        kernels autotune over all of them (keyed by ``key``); the interpreter uses the first.
    key
        Argument names whose values select a tuned configuration.
    """

    def __init__(self, fn: Callable, configs: Sequence[tuple[dict[str, Any], int, int]],
                 key: Sequence[str] = ()) -> None:
        self.fn = fn
        self.configs = list(configs)
        self.key = list(key)
        self._built: dict[bool, Any] = {}

    def kernel(self):
        """The decorated kernel for the current mode (an autotuner when compiled with several configs)."""
        # Triton is optional (the `gpu` extra): imported only to launch a kernel
        import triton

        interpret = interpreting()
        if interpret not in self._built:
            jitted = triton.jit(self.fn)          # reads TRITON_INTERPRET now, as decorating at import would
            if not interpret and len(self.configs) > 1:
                configs = [triton.Config(meta, num_warps=warps, num_stages=stages)
                           for meta, warps, stages in self.configs]
                jitted = triton.autotune(configs=configs, key=self.key)(jitted)
            self._built[interpret] = jitted
        return self._built[interpret]

    def launch(self, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
        """Run the kernel over ``grid``; the meta-parameters autotuning does not choose are filled in."""
        if interpreting() and not interpreter_loaded():
            raise RuntimeError("TRITON_INTERPRET=1 was set after Triton was imported; set it before")
        if interpreting() or len(self.configs) == 1:
            meta, warps, stages = self.configs[0]
            kwargs = {**meta, "num_warps": warps, "num_stages": stages, **kwargs}
        self.kernel()[grid](*args, **kwargs)
