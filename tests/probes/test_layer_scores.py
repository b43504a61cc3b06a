"""Scoring the rows of all layers in one call gives exactly the scores of one call per layer."""

from __future__ import annotations

import torch

from headprobe.probes.head_scores import copy_scores, reasoning_scores
from headprobe.probes.layer_scores import AnswerSpans, copy_scores_by_layer, reasoning_scores_by_layer


def _layer_rows(seed: int = 0):
    """Rows of 4 layers for 3 trials: layers 0, 1, 3 see 40 keys at positions 0..39; layer 2 (a sliding
    window) sees 16 keys at positions 24..39. Rows are softmaxed random logits with ties at the top of
    some rows (two keys of equal weight)."""
    gen = torch.Generator().manual_seed(seed)
    batch, heads, steps = 3, 5, 4
    rows = {}
    for layer, keys in ((0, 40), (1, 40), (2, 16), (3, 40)):
        logits = torch.randn(batch, heads, steps, keys, generator=gen) * 3
        logits[:, :, 0, 5 % keys] = logits[:, :, 0, 7 % keys] = 10.0
        positions = torch.arange(40 - keys, 40)
        rows[layer] = (logits.softmax(-1), positions)
    return rows, batch


def _spans(batch: int) -> AnswerSpans:
    prompt_tokens = torch.randint(0, 50, (batch, 40), generator=torch.Generator().manual_seed(1))
    return AnswerSpans(torch.tensor([5, 20, 30]), torch.tensor([9, 23, 39]), prompt_tokens)


def test_stacked_layers_score_exactly_as_one_layer_at_a_time():
    rows, batch = _layer_rows()
    spans = _spans(batch)
    step_mask = torch.tensor([[True, True, True, False], [True, True, False, False], [True] * 4])
    step_tokens = spans.prompt_tokens[:, [6, 21, 33, 0]]        # some produced tokens equal span tokens
    copy = copy_scores_by_layer(rows, spans, step_tokens, step_mask)
    weight = reasoning_scores_by_layer(rows, spans, step_mask)
    assert sorted(copy.layers) == sorted(weight.layers) == [0, 1, 2, 3]
    for i, layer in enumerate(copy.layers):
        layer_rows, positions = rows[layer]
        expected = copy_scores(layer_rows, positions, spans.start, spans.end, step_tokens, step_mask,
                               spans.prompt_tokens)
        assert torch.equal(copy.values[:, i], expected), layer
    for i, layer in enumerate(weight.layers):
        layer_rows, positions = rows[layer]
        expected = reasoning_scores(layer_rows, positions, spans.start, spans.end, step_mask)
        assert torch.equal(weight.values[:, i], expected), layer
    assert copy.values.abs().sum() > 0 and weight.values.abs().sum() > 0


def test_layers_with_other_key_positions_stack_with_per_trial_positions():
    rows, batch = _layer_rows(seed=3)
    rows[1] = (rows[1][0], torch.arange(3, 43))                          # same key count, other positions
    rows[3] = (rows[3][0], torch.arange(40)[None].repeat(batch, 1))      # [batch, keys] positions
    spans = _spans(batch)
    mask = torch.ones(batch, 4, dtype=torch.bool)
    tokens = spans.prompt_tokens[:, [6, 7, 21, 33]]
    copy = copy_scores_by_layer(rows, spans, tokens, mask)
    weight = reasoning_scores_by_layer(rows, spans, mask)
    for i, layer in enumerate(copy.layers):
        layer_rows, positions = rows[layer]
        expected = copy_scores(layer_rows, positions, spans.start, spans.end, tokens, mask, spans.prompt_tokens)
        assert torch.equal(copy.values[:, i], expected), layer
    for i, layer in enumerate(weight.layers):
        layer_rows, positions = rows[layer]
        assert torch.equal(weight.values[:, i], reasoning_scores(layer_rows, positions, spans.start, spans.end,
                                                                 mask)), layer


def test_add_to_and_write_to_touch_only_their_layers():
    rows, batch = _layer_rows()
    del rows[1]
    spans = _spans(batch)
    scores = reasoning_scores_by_layer(rows, spans, torch.ones(batch, 4, dtype=torch.bool))
    totals = torch.full((batch, 4, 5), 2.0, dtype=torch.float64)
    scores.add_to(totals)
    assert torch.equal(totals[:, 1], torch.full((batch, 5), 2.0, dtype=torch.float64))
    assert torch.equal(totals[:, scores.layers], scores.values + 2.0)
    scores.write_to(totals)
    assert torch.equal(totals[:, scores.layers], scores.values)
