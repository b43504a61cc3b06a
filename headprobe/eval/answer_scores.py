"""Scoring a model's answer against the gold answer (hand-checkable, no model involved)."""

from __future__ import annotations

from ..answer_text import normalize_answer, qa_f1, rouge1_recall
from ..errors import HeadprobeError

SCORERS = ("rouge", "exact", "f1", "fidelity")


def first_line(response: str) -> str:
    """The response up to its first line break (small models ramble on after the answer)."""
    text = response.strip()
    return text.split("\n", 1)[0] if text else ""


def answer_text(response: str, prompt_format: str) -> str:
    """The part of a response that answers, for a prompt of ``prompt_format`` (``"chat"`` or ``"plain"``).

    Under the chat template the whole response is the model's turn. After the plain form's cue
    (``Answer:``) a base model writes its answer on that line and then goes on writing the document it was
    given (another ``Question:``, another heading), so the answer is the response's first line, as in
    LongBench's scoring of its few-shot tasks (``pred.split("\\n")[0]``). Without this a token-F1 counts
    every word of the continuation against the answer.
    """
    return first_line(response) if prompt_format == "plain" else response


def exact_answer(response: str, gold: str, choices: tuple[str, ...] = ()) -> float:
    """1.0 when the gold answer is in the response's first line as whole words and no other choice is.

    Parameters
    ----------
    response
        The model's answer.
    gold
        The expected answer (one or a few words).
    choices
        Every answer the question allows (for example all locations, or ``yes``/``no``); naming another
        one besides the gold answer is wrong. Without choices, the normalised response must start
        with the gold answer.
    """
    words = f" {normalize_answer(first_line(response))} "
    target = normalize_answer(gold)
    if not target:
        return 0.0
    if not choices:
        return float(words.strip().startswith(target) and
                     (len(words.strip()) == len(target) or words.strip()[len(target)] == " "))
    if f" {target} " not in words:
        return 0.0
    others = [normalize_answer(c) for c in choices if normalize_answer(c) != target]
    return float(not any(f" {o} " in words for o in others if o))


def rouge_l_f1(response: str, reference: str) -> float:
    """ROUGE-L F1: longest common subsequence of the normalised words of ``response`` and ``reference``.

    The long-generation task scores a compressed cache's answer against the full cache's answer to the
    same prompt (1.0: word for word the same text).
    """
    a, b = normalize_answer(response).split(), normalize_answer(reference).split()
    if not a or not b:
        return float(a == b)
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    lcs = prev[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(a), lcs / len(b)
    return 2 * precision * recall / (precision + recall)


def score_answer(response: str, gold: str | list[str], scorer: str = "rouge",
                 choices: tuple[str, ...] = ()) -> float:
    """Score in [0, 1]: ``rouge`` (ROUGE-1 recall of the gold words, the needle papers' measure),
    ``exact`` (:func:`exact_answer`), ``f1`` (LongBench token-F1, max over gold answers) or ``fidelity``
    (:func:`rouge_l_f1` against a reference text: the full cache's answer)."""
    golds = [gold] if isinstance(gold, str) else list(gold)
    if not golds:
        raise HeadprobeError("no gold answer to score against")
    if scorer == "rouge":
        return max(rouge1_recall(response, g) for g in golds)
    if scorer == "exact":
        return max(exact_answer(response, g, choices) for g in golds)
    if scorer == "f1":
        return max(qa_f1(response, g) for g in golds)
    if scorer == "fidelity":
        return max(rouge_l_f1(response, g) for g in golds)
    raise HeadprobeError(f"unknown scorer {scorer!r}; expected one of {', '.join(SCORERS)}")


