"""The attention-row primitive: softmax rows of chosen query positions, every head, every layer."""

from .recorder import RowRecorder, RowRequest
from .rows import attention_rows, pooled_window_scores

__all__ = ["RowRecorder", "RowRequest", "attention_rows", "pooled_window_scores"]
