"""Eval items: what is hidden in the haystack, what is asked, how the answer is scored."""

from __future__ import annotations

from dataclasses import dataclass

from ..haystack.needles import Needle
from .babi import BabiQuestion


@dataclass(frozen=True)
class EvalItem:
    """One question of a needle grid.

    Attributes
    ----------
    id
        Unique within the run.
    needle
        What :func:`headprobe.haystack.context.build_context` inserts (its ``answer`` marks the answer span).
    question
        The question (``None``: the needle's own).
    gold
        The expected answer.
    scorer
        ``rouge``, ``exact``, ``f1`` or ``fidelity`` (:func:`headprobe.eval.answer_scores.score_answer`;
        ``fidelity`` scores against the full cache's answer to the same prompt, not against ``gold``).
    choices
        The answers the question allows, for ``exact`` scoring.
    """

    id: str
    needle: Needle
    question: str | None
    gold: str
    scorer: str = "rouge"
    choices: tuple[str, ...] = ()


def items_from_needles(needles: list[Needle], scorer: str | None = None) -> list[EvalItem]:
    """Retrieval needles are scored by ROUGE-1 recall; reasoning needles by exact answer between their
    two candidates."""
    out = []
    for n in needles:
        if n.kind == "reasoning":
            out.append(EvalItem(n.id, n, None, n.answer, scorer or "exact", tuple(n.candidates)))
        else:
            out.append(EvalItem(n.id, n, None, n.answer, scorer or "rouge"))
    return out


def items_from_babi(questions: list[BabiQuestion]) -> list[EvalItem]:
    """bAbI questions as items; the answer span marks the last fact (the answer may not be in the text)."""
    out = []
    for q in questions:
        anchor = q.facts[-1]
        needle = Needle(id=q.id, kind="retrieval", needle=q.text, question=q.question, answer=anchor)
        out.append(EvalItem(q.id, needle, f"{q.question} Answer with one word.", q.answer, "exact", q.choices))
    return out


#: The long-generation request: a long answer whose later tokens still depend on the whole context.
LONGGEN_QUESTION = ("Write a long, detailed report on the text above, several paragraphs, going through it "
                    "from beginning to end and mentioning every specific fact, name and number it contains.")


def items_from_longgen(needles: list[Needle]) -> list[EvalItem]:
    """Long-generation items: the needle is hidden as usual, the model is asked for a long report.

    Scored by ``fidelity`` (ROUGE-L F1 against the full cache's report of the same prompt); each trial
    also records whether the needle's answer appears in the report (``needle_recall``).
    """
    return [EvalItem(f"longgen-{n.id}", n, LONGGEN_QUESTION, n.answer, "fidelity") for n in needles]
