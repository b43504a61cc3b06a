"""Answer-text scoring: normalise an answer and measure how much of the gold answer a response holds.

Plain functions of two strings, no model involved. The probes' success gates
(:mod:`headprobe.probes.gates`) and eval's answer scores (:mod:`headprobe.eval.answer_scores`) both
measure answers with these, so the module sits below both.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """LongBench's QA normalisation: lowercase, drop punctuation and articles, squeeze whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def qa_f1(prediction: str, gold: str) -> float:
    """LongBench QA token-F1 between a response and the gold answer."""
    pred = normalize_answer(prediction).split()
    ref = normalize_answer(gold).split()
    if not pred or not ref:
        return 0.0
    common = Counter(pred) & Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred)
    recall = same / len(ref)
    return 2 * precision * recall / (precision + recall)


def rouge1_recall(prediction: str, gold: str) -> float:
    """ROUGE-1 recall of the gold answer's words in the response (lowercased word tokens)."""
    pred = Counter(re.findall(r"\w+", prediction.lower()))
    ref = Counter(re.findall(r"\w+", gold.lower()))
    if not ref:
        return 0.0
    overlap = sum((pred & ref).values())
    return overlap / sum(ref.values())
