"""Layer retention per task type (DynamicKV §3).

For each sample prompt the last ``window`` query rows of every layer are pooled into per-token scores
(SnapKV's rule: mean over the window rows, max-pool over positions) for each KV head (mean over its
query heads). The globally top ``capacity × layers × kv_heads`` (layer, head, token) scores are the
tokens a cache of that total would keep; each layer's share of them is its retention rate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..attention.recorder import RowRecorder, RowRequest
from ..attention.rows import pooled_window_scores
from ..haystack.context import render_instruction_prompt
from ..haystack.tasks import TaskSample

if TYPE_CHECKING:
    from ..models.loading import LoadedModel


@dataclass
class RetentionConfig:
    """Settings of the layer-retention analysis.

    Attributes
    ----------
    window
        Query rows at the end of the prompt (``ws`` in DynamicKV).
    kernel_size
        Pooling kernel over positions.
    capacity
        Tokens per head of the notional cache; the top ``capacity · layers · kv_heads`` scores win.
    max_tokens
        Prompts longer than this are cut (context truncated, instruction kept).
    chat_template
        Apply the model's chat template (else the plain form, which ends with the answer cue).
    """

    window: int = 8
    kernel_size: int = 7
    capacity: int = 128
    max_tokens: int = 2048
    chat_template: bool = True


def task_prompt_ids(tokenizer, sample: TaskSample, config: RetentionConfig) -> list[int]:
    """Token ids of a task sample, with the context cut so the prompt fits ``max_tokens``."""
    context = sample.context
    for _ in range(6):
        text, add_special = render_instruction_prompt(tokenizer, context, sample.instruction, config.chat_template)
        ids = tokenizer(text, add_special_tokens=add_special)["input_ids"]
        if len(ids) <= config.max_tokens:
            return list(ids)
        context = context[: int(len(context) * config.max_tokens / len(ids) * 0.97)]
    return list(ids[-config.max_tokens:])


def layer_shares(scores: torch.Tensor, capacity: int) -> torch.Tensor:
    """Each layer's share of the global top-k.

    Parameters
    ----------
    scores
        ``[layers, kv_heads, tokens]`` pooled window scores.
    capacity
        Tokens per head; ``k = capacity · layers · kv_heads`` (at most all tokens).

    Returns
    -------
    torch.Tensor
        ``[layers]`` shares summing to 1. Ties at the threshold are broken by position order of ``topk``.
    """
    layers, heads, tokens = scores.shape
    k = min(capacity * layers * heads, scores.numel())
    top = scores.reshape(-1).float().topk(k).indices
    counts = torch.bincount(top // (heads * tokens), minlength=layers).to(torch.float64)
    return counts / counts.sum()


@torch.no_grad()
def run_retention_sample(lm: LoadedModel, sample: TaskSample, config: RetentionConfig) -> dict[str, Any]:
    """Retention rates of one prompt: a log record with ``retention`` ``[layers]``."""
    start = time.perf_counter()
    model, tok = lm.model, lm.tokenizer
    ids = task_prompt_ids(tok, sample, config)
    n = len(ids)
    window = min(config.window, max(1, n - 1))
    prefix = n - window
    group = lm.identity.group_size
    per_layer: dict[int, torch.Tensor] = {}

    def keep(layer: int, rows: torch.Tensor, key_positions: torch.Tensor) -> None:
        # Sliding-window layers see fewer keys: place their scores at absolute positions.
        full = torch.zeros(rows.shape[0], rows.shape[1], rows.shape[2], n, dtype=rows.dtype, device=rows.device)
        full[..., key_positions] = rows
        pooled = pooled_window_scores(full, prefix, config.kernel_size)        # [1, q_heads, prefix]
        kv = pooled.reshape(1, -1, group, prefix).mean(dim=2)                   # [1, kv_heads, prefix]
        per_layer[layer] = kv[0].cpu()

    with RowRecorder(model) as rec:
        rec.request = RowRequest(torch.arange(prefix, n)[None], 0, keep)
        model(input_ids=torch.tensor([ids], device=lm.device), logits_to_keep=1)
    scores = torch.stack([per_layer[i] for i in sorted(per_layer)])            # [layers, kv_heads, prefix]
    shares = layer_shares(scores, config.capacity)
    return {"trial": sample.id, "task": sample.task, "prompt_tokens": n,
            "retention": [round(float(x), 6) for x in shares], "seconds": round(time.perf_counter() - start, 3)}
