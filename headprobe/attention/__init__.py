"""The attention-row primitive: softmax rows of chosen query positions, every head, every layer."""

from .rows import attention_rows, pooled_window_scores

__all__ = ["attention_rows", "pooled_window_scores"]
