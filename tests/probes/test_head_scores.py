"""Scoring rules and gates on hand-made inputs with known answers."""

from __future__ import annotations

import pytest
import torch

from headprobe.answer_text import normalize_answer, qa_f1, rouge1_recall
from headprobe.probes.head_scores import copy_scores, reasoning_scores
from headprobe.probes.retention import layer_shares


def _rows(argmax_positions, keys=10, weight=0.7):
    """[1, heads, steps, keys] rows whose top-1 is at the given position, rest spread evenly."""
    heads, steps = len(argmax_positions), len(argmax_positions[0])
    rows = torch.full((1, heads, steps, keys), (1 - weight) / (keys - 1))
    for h in range(heads):
        for s in range(steps):
            rows[0, h, s, argmax_positions[h][s]] = weight
    return rows


def test_copy_score_needs_span_and_token_equality():
    prompt = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 17, 18, 19]])
    span = (torch.tensor([4]), torch.tensor([7]))           # tokens 14, 15, 16
    produced = torch.tensor([[14, 15, 99]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    # head 0 copies 14 then 15 (2 hits); head 1 points inside the span but the token differs at step 2;
    # head 2 points outside the span.
    rows = _rows([[4, 5, 6], [5, 5, 6], [1, 2, 3]])
    got = copy_scores(rows, torch.arange(10), *span, produced, mask, prompt)
    assert got[0].tolist() == pytest.approx([2 / 3, 1 / 3, 0.0])
    # a padded step never counts
    mask[0, 1] = False
    assert copy_scores(rows, torch.arange(10), *span, produced, mask, prompt)[0, 0] == pytest.approx(1 / 3)


def test_copy_score_uses_absolute_key_positions():
    prompt = torch.arange(100, 120)[None]
    rows = _rows([[2]], keys=5)                              # key index 2 = absolute position 12
    got = copy_scores(rows, torch.arange(10, 15), torch.tensor([12]), torch.tensor([13]),
                      torch.tensor([[112]]), torch.ones(1, 1, dtype=torch.bool), prompt)
    assert got.item() == 1.0


def test_reasoning_score_sums_topk_weights_inside_span():
    rows = torch.zeros(1, 1, 1, 8)
    rows[0, 0, 0] = torch.tensor([0.05, 0.3, 0.25, 0.2, 0.1, 0.05, 0.05, 0.0])
    # span [2, 4): k = 2 -> top-2 positions are 1 (0.3, outside) and 2 (0.25, inside)
    got = reasoning_scores(rows, torch.arange(8), torch.tensor([2]), torch.tensor([4]), torch.ones(1, 1, dtype=bool))
    assert got.item() == pytest.approx(0.25 / 2)
    # span [1, 4): k = 3 -> 0.3 + 0.25 + 0.2 all inside
    got = reasoning_scores(rows, torch.arange(8), torch.tensor([1]), torch.tensor([4]), torch.ones(1, 1, dtype=bool))
    assert got.item() == pytest.approx(0.75 / 3)


def test_reasoning_score_per_trial_k_in_a_batch():
    rows = torch.zeros(2, 1, 1, 6)
    rows[:, 0, 0] = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0, 0.0])
    got = reasoning_scores(rows, torch.arange(6), torch.tensor([0, 1]), torch.tensor([1, 3]),
                           torch.ones(2, 1, dtype=torch.bool))
    assert got[:, 0].tolist() == pytest.approx([0.4, (0.3 + 0.0) / 2])  # trial 2: top-2 = {0 (out), 1 (in)}


def test_gates():
    assert normalize_answer("The  Blue, tulips!") == "blue tulips"
    assert qa_f1("pottery", "pottery") == 1.0
    assert qa_f1("The older one loves pottery", "pottery") == pytest.approx(2 * (1 / 4) / (1 / 4 + 1))
    assert qa_f1("sailing", "pottery") == 0.0
    assert rouge1_recall("to play dominoes with fishermen", "play dominoes with retired fishermen") == 0.8
    assert rouge1_recall("nothing", "a b") == 0.0


def test_layer_shares_count_global_winners():
    scores = torch.zeros(3, 1, 4)
    scores[0, 0] = torch.tensor([9.0, 8.0, 0.0, 0.0])
    scores[1, 0] = torch.tensor([7.0, 0.0, 0.0, 0.0])
    scores[2, 0] = torch.tensor([6.0, 0.5, 0.1, 0.0])
    # capacity 1 per head -> k = 3 winners: 9, 8 (layer 0), 7 (layer 1)
    assert layer_shares(scores, 1).tolist() == pytest.approx([2 / 3, 1 / 3, 0.0])
