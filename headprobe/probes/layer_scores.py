"""Head scores of response steps: every layer at once, or layer by layer as the rows arrive.

A needle pass names the scores it records (:class:`~headprobe.probes.probe_config.NeedleScores`): the
retrieval pass the copy score (Wu et al.) as ``retrieval`` and the attention-weight score as
``enhanced_retrieval`` (HeadKV-ER), the reasoning pass the attention-weight score as
``retrieval_reasoning`` (HeadKV-R2). ER and R2 are the same rule (:func:`~headprobe.probes.head_scores.reasoning_scores`); the copy score is
:func:`~headprobe.probes.head_scores.copy_scores`. The row recorder hands over rows layer by layer;
:func:`copy_scores_by_layer` and :func:`reasoning_scores_by_layer` stack the layers whose rows have one
shape along the batch axis and score them in one call. Each trial and layer is scored exactly as it would
be alone: the scores are per row, and the stacking only repeats the per-trial inputs.
:class:`StepScorer` is the row callback that adds the scores of a block of steps to a batch's totals as
each layer's rows arrive (fast mode's continuations, reuse mode's response branches).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..attention.recorder import RowCallback
from .head_scores import copy_scores, reasoning_scores
from .probe_config import NeedleScores

#: Rows of one forward by layer: ``layer -> (rows [batch, query_heads, steps, keys],
#: key_positions [keys] or [batch, keys])``.
LayerRows = dict[int, tuple[torch.Tensor, torch.Tensor]]


def zero_totals(scores: NeedleScores, batch: int, layers: int, heads: int) -> dict[str, torch.Tensor]:
    """Score name → ``[batch, layers, query_heads]`` float64 zeros: the sums a batch of trials adds to."""
    return {name: torch.zeros(batch, layers, heads, dtype=torch.float64) for name in scores.names}


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


@dataclass
class StepScorer:
    """Row-recorder callback that adds a block of response steps' scores, layer by layer, to ``totals``.

    The scores are computed where the rows are (``spans``, ``step_tokens`` and ``step_mask`` on their
    device); only the per-head sums ``[batch, query_heads]`` are added to ``totals`` on the host.

    Attributes
    ----------
    totals
        Score name → ``[batch, layers, query_heads]`` float64 sums (:func:`zero_totals`).
    scores
        Which scores go under which name.
    spans
        The batch's answer spans and prompt tokens.
    step_tokens
        ``[batch, steps]`` the token each step produces (for the copy score).
    step_mask
        ``[batch, steps]`` boolean, ``False`` for padding steps.
    """

    totals: dict[str, torch.Tensor]
    scores: NeedleScores
    spans: AnswerSpans
    step_tokens: torch.Tensor
    step_mask: torch.Tensor

    def __call__(self, layer: int, rows: torch.Tensor, key_positions: torch.Tensor) -> None:
        """Add the scores of ``rows`` ``[batch, query_heads, steps, keys]`` (keys at ``key_positions``)."""
        spans = self.spans
        if self.scores.copy is not None:
            self.totals[self.scores.copy][:, layer] += copy_scores(rows, key_positions, spans.start, spans.end,
                                                                   self.step_tokens, self.step_mask,
                                                                   spans.prompt_tokens).cpu()
        self.totals[self.scores.weight][:, layer] += reasoning_scores(rows, key_positions, spans.start, spans.end,
                                                                      self.step_mask).cpu()
