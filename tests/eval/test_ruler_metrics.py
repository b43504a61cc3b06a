"""RULER's metrics on hand-made predictions with known scores, and against RULER's own code where installed."""

from __future__ import annotations

import importlib.util
import random

import pytest

from headprobe import HeadprobeError
from headprobe.eval.ruler_metrics import (
    postprocess_pred,
    ruler_average,
    string_match_all_sample,
    string_match_part_sample,
    task_score,
)


def test_string_match_all_counts_the_share_of_references_found():
    refs = ["1234567", "7654321"]
    assert string_match_all_sample("The numbers are 1234567 and 7654321.", refs) == 1.0
    assert string_match_all_sample("Only 1234567.", refs) == 0.5
    assert string_match_all_sample("None of them.", refs) == 0.0
    # a three-reference multivalue sample with two found
    assert string_match_all_sample("a b", ["a", "b", "c"]) == pytest.approx(2 / 3)


def test_matching_ignores_case_and_word_boundaries():
    assert string_match_all_sample("the key is ABC-DEF", ["abc-def"]) == 1.0
    assert string_match_all_sample("Flippant-Twine", ["flippant-twine"]) == 1.0
    assert string_match_all_sample("1234", ["12"]) == 1.0        # a substring counts, as in RULER
    assert string_match_all_sample("12 34", ["1234"]) == 0.0     # no normalisation of spaces


def test_string_match_part_needs_any_one_reference():
    refs = ["Denver Broncos", "Broncos"]
    assert string_match_part_sample("The broncos.", refs) == 1.0
    assert string_match_part_sample("denver broncos won", refs) == 1.0
    assert string_match_part_sample("Denver", refs) == 0.0


def test_task_score_is_a_rounded_percentage_over_cleaned_predictions():
    refs = [["7"], ["8"], ["9"]]
    assert task_score("string_match_all", ["7", "no", "no"], refs) == 33.33
    assert task_score("string_match_all", ["7", "8", "no"], refs) == 66.67
    assert task_score("string_match_part", ["7", "8", "9"], refs) == 100.0
    assert task_score("string_match_all", ["7 9", "x"], [["7", "8"], ["x"]]) == 75.0


def test_postprocess_pred_is_rulers():
    assert postprocess_pred("  1234\t5678 \n") == "1234\n5678"
    assert postprocess_pred("\x00a\x1fb") == "a\nb"
    assert postprocess_pred(None) == ""
    # a control character splits what it sat in: the reference is no longer found
    assert task_score("string_match_all", ["12\t34"], [["12\t34"]]) == 0.0


def test_average_and_refusals():
    assert ruler_average({"niah_single_1": 100.0, "vt": 50.0, "qa_1": 33.33}) == 61.11
    with pytest.raises(HeadprobeError, match="metric"):
        task_score("rouge", ["a"], [["a"]])
    with pytest.raises(HeadprobeError, match="2 predictions for 1 references"):
        task_score("string_match_all", ["a", "b"], [["a"]])
    with pytest.raises(HeadprobeError, match="non-empty list"):
        string_match_all_sample("a", [])
    with pytest.raises(HeadprobeError, match="non-empty list"):
        string_match_part_sample("a", "a")


@pytest.mark.skipif(importlib.util.find_spec("long_context_eval") is None,
                    reason="RULER's own code comes with nvidia-long-context-eval (pip install --no-deps)")
def test_same_scores_as_rulers_own_functions():
    from long_context_eval.eval.synthetic import constants as ruler

    rng = random.Random(0)
    alphabet = ["12", "34", "AB", "ab", "x", " ", "-", "\n"]
    preds = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(200)]
    refs = [[rng.choice(["12", "ab", "1234", "AB-x"]) for _ in range(rng.randint(1, 3))] for _ in range(200)]
    cleaned = [postprocess_pred(p) for p in preds]     # RULER's evaluate.py cleans before its metric
    assert task_score("string_match_all", preds, refs) == ruler.string_match_all(cleaned, refs)
    assert task_score("string_match_part", preds, refs) == ruler.string_match_part(cleaned, refs)
    per_all = ruler.string_match_all_per_sample(cleaned, refs)
    assert [100 * string_match_all_sample(p, r) for p, r in zip(cleaned, refs)] == pytest.approx(per_all)
