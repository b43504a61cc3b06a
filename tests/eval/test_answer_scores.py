"""Accuracy scoring on hand-made answers."""

import pytest

from headprobe import HeadprobeError
from headprobe.eval.answer_scores import exact_answer, score_answer


def test_rouge_recall_counts_gold_words_in_the_response():
    gold = "play dominoes with retired fishermen"
    assert score_answer("You should play dominoes with retired fishermen.", gold) == 1.0
    assert score_answer("Play dominoes.", gold) == pytest.approx(2 / 5)
    assert score_answer("Go to the beach", gold) == 0.0


def test_exact_answer_with_choices():
    places = ("kitchen", "garden", "office")
    assert exact_answer("office", "office", places) == 1.0
    assert exact_answer("Mary is in the office.\nThe kitchen is empty.", "office", places) == 1.0  # first line only
    assert exact_answer("The office or the kitchen", "office", places) == 0.0   # hedging between choices
    assert exact_answer("kitchen", "office", places) == 0.0
    assert exact_answer("officer", "office", places) == 0.0                     # whole words only
    assert exact_answer("Yes, she is.", "yes", ("yes", "no")) == 1.0
    assert exact_answer("No.", "yes", ("yes", "no")) == 0.0
    assert exact_answer("two", "two", ("none", "one", "two")) == 1.0


def test_exact_answer_without_choices_needs_the_answer_first():
    assert exact_answer("Blue tulip, I think", "blue tulip") == 1.0
    assert exact_answer("It is blue tulip", "blue tulip") == 0.0
    assert exact_answer("blue tulips", "blue tulip") == 0.0


def test_f1_takes_the_best_gold_answer():
    assert score_answer("the Eiffel Tower", ["Eiffel Tower", "Paris"], "f1") == 1.0
    assert score_answer("Paris, France", ["Eiffel Tower", "Paris"], "f1") == pytest.approx(2 / 3)
    assert score_answer("", ["Paris"], "f1") == 0.0


def test_unknown_scorer_is_one_line_error():
    with pytest.raises(HeadprobeError, match="unknown scorer"):
        score_answer("a", "a", "bleu")


def test_rouge_l_f1_by_hand():
    from headprobe.eval.answer_scores import rouge_l_f1

    assert rouge_l_f1("The cat sat on the mat.", "the cat sat on the mat") == 1.0
    # words a b c d vs a c e: LCS "a c" = 2; precision 2/4, recall 2/3 -> F1 = 4/7
    assert rouge_l_f1("alpha beta gamma delta", "alpha gamma epsilon") == pytest.approx(4 / 7)
    assert rouge_l_f1("one two", "three four") == 0.0
    assert rouge_l_f1("", "") == 1.0 and rouge_l_f1("", "x") == 0.0
    assert score_answer("alpha beta gamma delta", "alpha gamma epsilon", "fidelity") == pytest.approx(4 / 7)
