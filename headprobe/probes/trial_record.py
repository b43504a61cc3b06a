"""A needle trial's log record: where the needle was, what the model answered, its gates and head scores."""

from __future__ import annotations

from typing import Any

import torch

from ..answer_text import qa_f1, rouge1_recall
from ..haystack.context import TrialContext
from ..haystack.needles import Needle
from .gates import GATE_THRESHOLD
from .trial_grid import TrialSpec


def trial_gates(needle: Needle, response: str, margin: float | None,
                greedy_is_gold: bool | None) -> tuple[dict[str, Any], bool]:
    """Gate values of a trial and whether it counts under the published gate.

    Parameters
    ----------
    needle
        The trial's needle; its kind picks the published gate (QA-F1 for reasoning, ROUGE-1 recall else).
    response
        The decoded response.
    margin
        Reasoning needles: ``log p(correct) − log p(distractor)`` (the likelihood gate), else ``None``.
    greedy_is_gold
        Fast mode: whether greedy decoding reproduces the forced response; the published gate then also
        requires it. ``None`` in reference mode.

    Returns
    -------
    gates, passed
        ``{"rouge1_recall", "qa_f1", ["greedy_is_gold"], ["likelihood_margin", "likelihood"], "published"}``
        and the published gate's verdict.
    """
    gates: dict[str, Any] = {"rouge1_recall": round(rouge1_recall(response, needle.answer), 4),
                             "qa_f1": round(qa_f1(response, needle.answer), 4)}
    if greedy_is_gold is not None:
        gates["greedy_is_gold"] = greedy_is_gold
    if margin is not None:
        gates["likelihood_margin"] = round(margin, 4)
        gates["likelihood"] = margin > 0
    gate_value = gates["qa_f1"] if needle.kind == "reasoning" else gates["rouge1_recall"]
    published = gate_value > GATE_THRESHOLD
    if greedy_is_gold is not None:
        published = published and greedy_is_gold
    gates["published"] = published
    return gates, published


def trial_record(spec: TrialSpec, ctx: TrialContext, response: str, scores: dict[str, torch.Tensor],
                 gates: dict[str, Any], passed: bool, seconds: float, mode: str) -> dict[str, Any]:
    """One line of the trial log.

    Parameters
    ----------
    scores
        Score name → ``[layers, query_heads]`` sums over the trial's steps (rounded to 6 decimals here).
    """
    return {
        "trial": spec.id, "needle": spec.needle_id, "length": spec.length, "depth": spec.depth, "seed": spec.seed,
        "mode": mode, "prompt_tokens": ctx.length, "answer_span": list(ctx.answer_span),
        "actual_depth": round(ctx.actual_depth, 4), "response": response, "gates": gates, "passed": passed,
        "scores": {k: [[round(float(x), 6) for x in row] for row in v.tolist()] for k, v in scores.items()},
        "seconds": round(seconds, 3),
    }
