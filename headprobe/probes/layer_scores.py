"""A step's head scores for every layer at once: the rows of all layers scored in one call.

Retrieval needles give two scores per head, ``retrieval`` (Wu et al.'s copy score) and
``enhanced_retrieval`` (HeadKV-ER); reasoning needles give ``retrieval_reasoning`` (HeadKV-R2). ER and
R2 are the same rule (:func:`~headprobe.probes.head_scores.reasoning_scores`); the copy score is
:func:`~headprobe.probes.head_scores.copy_scores`. The row recorder hands over rows layer by layer;
:func:`copy_scores_by_layer` and :func:`reasoning_scores_by_layer` stack the layers whose rows have one
shape along the batch axis and score them in one call. Each trial and layer is scored exactly as it would
be alone: the scores are per row, and the stacking only repeats the per-trial inputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..attention.recorder import RowCallback
from .head_scores import copy_scores, reasoning_scores

#: Rows of one forward by layer: ``layer -> (rows [batch, query_heads, steps, keys],
#: key_positions [keys] or [batch, keys])``.
LayerRows = dict[int, tuple[torch.Tensor, torch.Tensor]]


def score_names(kind: str) -> tuple[str, ...]:
    """The scores a needle kind yields: ``("retrieval", "enhanced_retrieval")`` or ``("retrieval_reasoning",)``."""
    return ("retrieval", "enhanced_retrieval") if kind == "retrieval" else ("retrieval_reasoning",)


def weight_score_name(kind: str) -> str:
    """The name of the attention-weight score (HeadKV-ER for retrieval needles, HeadKV-R2 for reasoning)."""
    return "enhanced_retrieval" if kind == "retrieval" else "retrieval_reasoning"


def collect_rows(store: LayerRows) -> RowCallback:
    """A row-recorder callback that puts each layer's rows and key positions (on the CPU) into ``store``."""
    def keep(layer: int, rows: torch.Tensor, key_positions: torch.Tensor) -> None:
        store[layer] = (rows.cpu(), key_positions.cpu())
    return keep


@dataclass(frozen=True)
class AnswerSpans:
    """What the rows of a batch of trials are scored against.

    Attributes
    ----------
    start, end
        ``[batch]`` answer span ``[start, end)`` in prompt token positions.
    prompt_tokens
        ``[batch, positions]`` prompt token ids at absolute positions (``-1`` past a prompt's end).
    """

    start: torch.Tensor
    end: torch.Tensor
    prompt_tokens: torch.Tensor


@dataclass(frozen=True)
class LayerScores:
    """Scores of some layers for a batch of trials.

    Attributes
    ----------
    layers
        The layer indices, in the order of ``values``' second axis.
    values
        ``[batch, len(layers), query_heads]`` float64.
    """

    layers: list[int]
    values: torch.Tensor

    def add_to(self, totals: torch.Tensor) -> None:
        """Add to ``totals`` ``[batch, layers, query_heads]``."""
        if self.layers:
            totals[:, self.layers] += self.values

    def write_to(self, totals: torch.Tensor) -> None:
        """Replace these layers' entries of ``totals`` ``[batch, layers, query_heads]``."""
        if self.layers:
            totals[:, self.layers] = self.values


def copy_scores_by_layer(rows: LayerRows, spans: AnswerSpans, step_tokens: torch.Tensor,
                         step_mask: torch.Tensor) -> LayerScores:
    """Copy score of every layer in ``rows`` (see :func:`~headprobe.probes.head_scores.copy_scores`).

    Parameters
    ----------
    step_tokens
        ``[batch, steps]`` token produced (or forced) at each step.
    step_mask
        ``[batch, steps]`` boolean, ``False`` for padding steps.
    """
    parts = []
    for layers, stacked, key_positions in _stacked_layers(rows):
        n = len(layers)
        scores = copy_scores(stacked, key_positions, spans.start.repeat(n), spans.end.repeat(n),
                             step_tokens.repeat(n, 1), step_mask.repeat(n, 1), spans.prompt_tokens.repeat(n, 1))
        parts.append((layers, scores))
    return _per_layer(parts, spans.start.shape[0])


def reasoning_scores_by_layer(rows: LayerRows, spans: AnswerSpans, step_mask: torch.Tensor) -> LayerScores:
    """HeadKV-R2 / ER score of every layer in ``rows`` (see :func:`~headprobe.probes.head_scores.reasoning_scores`).

    Parameters
    ----------
    step_mask
        ``[batch, steps]`` boolean, ``False`` for padding steps.
    """
    parts = []
    for layers, stacked, key_positions in _stacked_layers(rows):
        n = len(layers)
        scores = reasoning_scores(stacked, key_positions, spans.start.repeat(n), spans.end.repeat(n),
                                  step_mask.repeat(n, 1))
        parts.append((layers, scores))
    return _per_layer(parts, spans.start.shape[0])


def _stacked_layers(rows: LayerRows) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Groups of layers whose rows have one shape: ``(layers, rows [n·batch, heads, steps, keys],
    key_positions)``, layer-major along the first axis. Key positions stay ``[keys]`` when the layers
    share them, else become ``[n·batch, keys]``."""
    groups: dict[tuple, list[int]] = {}
    for layer in sorted(rows):
        layer_rows = rows[layer][0]
        groups.setdefault((tuple(layer_rows.shape), layer_rows.dtype), []).append(layer)
    for layers in groups.values():
        batch = rows[layers[0]][0].shape[0]
        stacked = torch.cat([rows[layer][0] for layer in layers])
        positions = [rows[layer][1] for layer in layers]
        if all(p.dim() == 1 and torch.equal(p, positions[0]) for p in positions):
            key_positions = positions[0]
        else:
            key_positions = torch.cat([p.expand(batch, -1) for p in positions])
        yield layers, stacked, key_positions


def _per_layer(parts: list[tuple[list[int], torch.Tensor]], batch: int) -> LayerScores:
    """Undo the stacking: ``[n·batch, heads]`` per group into one ``[batch, layers, heads]``."""
    if not parts:
        return LayerScores([], torch.zeros(batch, 0, 1, dtype=torch.float64))
    layers = [layer for group, _ in parts for layer in group]
    values = torch.cat([scores.reshape(len(group), batch, -1) for group, scores in parts]).transpose(0, 1)
    return LayerScores(layers, values)
