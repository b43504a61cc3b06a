"""Per-step head scores from attention rows (Wu et al. copy score; HeadKV-R2 / ER score).

Both functions take one layer's rows for a batch of trials and return each trial's score per query
head, summed over its steps. A *step* is a query position that predicts one response token.
"""

from __future__ import annotations

import torch


def copy_scores(
    rows: torch.Tensor,
    key_positions: torch.Tensor,
    span_start: torch.Tensor,
    span_end: torch.Tensor,
    step_tokens: torch.Tensor,
    step_mask: torch.Tensor,
    prompt_tokens: torch.Tensor,
) -> torch.Tensor:
    """Retrieval (copy) score of Wu et al.

    At each step the head's top-1 attended position ``p`` earns ``1/len(span)`` if ``p`` lies in the
    answer span and the token produced at that step equals the prompt token at ``p``.

    Parameters
    ----------
    rows
        ``[batch, heads, steps, keys]`` attention probabilities.
    key_positions
        ``[keys]`` or ``[batch, keys]`` absolute positions of the keys.
    span_start, span_end
        ``[batch]`` answer span ``[start, end)`` in prompt token positions.
    step_tokens
        ``[batch, steps]`` token produced (or forced) at each step.
    step_mask
        ``[batch, steps]`` boolean, ``False`` for padding steps.
    prompt_tokens
        ``[batch, positions]`` token ids at absolute positions (at least up to the span end).

    Returns
    -------
    torch.Tensor
        ``[batch, heads]`` float64 scores.
    """
    top = rows.argmax(dim=-1)                                   # [b, h, s]
    pos = _positions(key_positions.to(top.device), top)         # absolute positions
    start = span_start.to(pos.device)[:, None, None]
    end = span_end.to(pos.device)[:, None, None]
    inside = (pos >= start) & (pos < end)
    safe = pos.clamp(max=prompt_tokens.shape[1] - 1)
    copied = torch.gather(prompt_tokens.to(pos.device)[:, None, :].expand(-1, pos.shape[1], -1), 2, safe)
    same = copied == step_tokens.to(pos.device)[:, None, :]
    hit = inside & same & step_mask.to(pos.device)[:, None, :]
    span_len = (span_end - span_start).to(torch.float64).to(pos.device)
    return hit.to(torch.float64).sum(dim=-1) / span_len[:, None]


def reasoning_scores(
    rows: torch.Tensor,
    key_positions: torch.Tensor,
    span_start: torch.Tensor,
    span_end: torch.Tensor,
    step_mask: torch.Tensor,
) -> torch.Tensor:
    """HeadKV-R2 (and HeadKV-ER) score.

    At each step take the head's top-k attended positions with ``k = len(span)``; each one inside the
    answer span adds its attention weight ``/ len(span)``. No token-equality condition.

    Parameters
    ----------
    rows
        ``[batch, heads, steps, keys]`` attention probabilities.
    key_positions
        ``[keys]`` or ``[batch, keys]`` absolute positions of the keys.
    span_start, span_end
        ``[batch]`` answer span ``[start, end)`` in prompt token positions.
    step_mask
        ``[batch, steps]`` boolean, ``False`` for padding steps.

    Returns
    -------
    torch.Tensor
        ``[batch, heads]`` float64 scores.
    """
    span_len = (span_end - span_start).to(rows.device)
    k_max = int(min(span_len.max().item(), rows.shape[-1]))
    values, top = rows.topk(k_max, dim=-1)                      # [b, h, s, k]
    pos = _positions(key_positions.to(top.device), top)
    start = span_start.to(pos.device)[:, None, None, None]
    end = span_end.to(pos.device)[:, None, None, None]
    rank_ok = torch.arange(k_max, device=pos.device)[None, None, None, :] < span_len[:, None, None, None]
    inside = (pos >= start) & (pos < end) & rank_ok & step_mask.to(pos.device)[:, None, :, None]
    total = (values.to(torch.float64) * inside).sum(dim=(-1, -2))
    return total / span_len.to(torch.float64)[:, None]


def _positions(key_positions: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Absolute positions of key indices ``index`` ``[batch, heads, steps(, k)]``."""
    if key_positions.dim() == 1:
        return key_positions[index]
    batch = index.shape[0]
    flat = index.reshape(batch, -1)
    return torch.gather(key_positions.expand(batch, -1), 1, flat).reshape(index.shape)
