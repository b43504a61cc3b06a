"""RULER's metrics, as RULER computes them: ``string_match_all`` and ``string_match_part``.

Source: RULER's ``scripts/eval/synthetic/constants.py`` and ``scripts/eval/evaluate.py`` (NVIDIA/RULER,
Apache-2.0), shipped as ``long_context_eval/eval/synthetic/constants.py`` and
``long_context_eval/eval/evaluate.py`` in the ``nvidia-long-context-eval`` package (26.3):

- a prediction is first cleaned by ``postprocess_pred``: stripped, every control character
  (``[\\x00-\\x1f]``) turned into a newline, stripped again;
- ``string_match_all`` (NIAH, variable tracking, common and frequent words): per sample, the share of the
  references found in the prediction, case-insensitively, as substrings;
- ``string_match_part`` (QA): per sample, 1 when any reference is found, else 0;
- a task's score is the mean over its samples times 100, rounded to 2 decimals; RULER's average is the
  plain mean of the task scores.

A reference is found when ``reference.lower() in prediction.lower()``: no word boundaries (``"12"`` is found
in ``"1234"``) and no normalisation beyond lower case.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..errors import HeadprobeError

#: RULER's task families (the ``task`` of ``synthetic.yaml``) and the metric each is scored by.
FAMILY_METRIC = {"niah": "string_match_all", "variable_tracking": "string_match_all",
                 "common_words_extraction": "string_match_all", "freq_words_extraction": "string_match_all",
                 "qa": "string_match_part"}

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess_pred(prediction: str | None) -> str:
    """RULER's ``postprocess_pred``: strip, control characters to newlines, strip (``None`` reads as ``""``)."""
    if prediction is None:
        return ""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def _check_refs(refs: Sequence[str]) -> list[str]:
    if isinstance(refs, str) or not refs:
        raise HeadprobeError(f"references {refs!r}: expected a non-empty list of strings")
    return [str(r) for r in refs]


def string_match_all_sample(prediction: str, refs: Sequence[str]) -> float:
    """The share of ``refs`` found in ``prediction`` (case-insensitive substrings), in [0, 1]."""
    refs = _check_refs(refs)
    pred = prediction.lower()
    return sum(1.0 if r.lower() in pred else 0.0 for r in refs) / len(refs)


def string_match_part_sample(prediction: str, refs: Sequence[str]) -> float:
    """1.0 when any of ``refs`` is found in ``prediction`` (case-insensitive substring), else 0.0."""
    refs = _check_refs(refs)
    pred = prediction.lower()
    return max(1.0 if r.lower() in pred else 0.0 for r in refs)


SAMPLE_METRICS = {"string_match_all": string_match_all_sample, "string_match_part": string_match_part_sample}


def task_score(metric: str, predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """A task's RULER score: the per-sample metric of the cleaned predictions, mean times 100, rounded to 2.

    Parameters
    ----------
    metric
        ``string_match_all`` or ``string_match_part``.
    predictions
        Raw model outputs (cleaned here with :func:`postprocess_pred`, as RULER's evaluate.py does).
    references
        One list of gold strings per prediction (RULER's ``outputs``).
    """
    if metric not in SAMPLE_METRICS:
        raise HeadprobeError(f"metric {metric!r}: expected one of {', '.join(SAMPLE_METRICS)}")
    if not predictions or len(predictions) != len(references):
        raise HeadprobeError(f"{len(predictions)} predictions for {len(references)} references: expected the same "
                             "number, at least one")
    fn = SAMPLE_METRICS[metric]
    scores = [fn(postprocess_pred(p), r) for p, r in zip(predictions, references, strict=True)]
    return round(sum(scores) / len(scores) * 100, 2)


def ruler_average(task_scores: dict[str, float]) -> float:
    """RULER's average over tasks: the plain mean of the task scores, rounded to 2 decimals."""
    if not task_scores:
        raise HeadprobeError("no task scores to average")
    return round(sum(task_scores.values()) / len(task_scores), 2)
