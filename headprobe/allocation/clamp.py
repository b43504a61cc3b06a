"""Clamp an allocator's budgets to a prompt length for a model (sliding-window layers capped at their window).

The arithmetic is :func:`~headprobe.budget_arithmetic.clamp_and_redistribute`; this module adds what
allocation knows: the capacity's window and sink, and the model's sliding-window layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..budget_arithmetic import clamp_and_redistribute
from ..errors import HeadprobeError


def clamp_for_model(budgets: np.ndarray, cap, prompt_len: int | None, model) -> np.ndarray:
    """Clamp an allocator's budgets to ``prompt_len`` for ``model`` (sliding-window layers capped at
    their window). ``cap`` is a :class:`~headprobe.allocation.common.Capacity`."""
    if prompt_len is None:
        raise HeadprobeError("clamping needs a prompt length (--prompt-len)")
    limits = None
    if model.sliding_window and model.layer_types:
        limits = [model.sliding_window if t == "sliding_attention" else None for t in model.layer_types]
    return clamp_and_redistribute(np.asarray(budgets), prompt_len, cap.window, cap.sink, limits=limits)


__all__: Sequence[str] = ("clamp_for_model",)
