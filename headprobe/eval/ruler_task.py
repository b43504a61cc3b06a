"""RULER under KV-cache settings: prompts in kvpress's split, RULER's scores, per-task tables.

The examples run through :func:`headprobe.eval.datasets.run_dataset_eval` (one cell per setting, one shared
prompt forward per example) with :class:`RulerTask` as its ``answer_task``: how an example is prompted, how
many tokens it may generate and how its answer is scored.

Prompts follow kvpress's pipeline (``KVPressTextGenerationPipeline.preprocess``): with a chat template the
user turn is the context followed by the question, then the template's assistant header, then RULER's
answer prefix (the answer is written after it); in the plain form the prompt is the context, the question,
a newline and the answer prefix. The question therefore comes after the context, where a window-based
policy sees it. headprobe compresses the whole prompt, question included (kvpress by default compresses
the context only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import HeadprobeError
from ..haystack.prompt_format import prompt_format_of
from .ruler_data import RulerExample
from .ruler_metrics import FAMILY_METRIC, SAMPLE_METRICS, postprocess_pred, ruler_average


def ruler_prompt_text(tokenizer: Any, ex: RulerExample, chat_template: bool = True) -> tuple[str, bool]:
    """The prompt of ``ex`` as text, and whether the tokenizer should add its special tokens (plain form)."""
    if prompt_format_of(tokenizer, chat_template) == "chat":
        turn = tokenizer.apply_chat_template([{"role": "user", "content": ex.context + ex.question}],
                                             add_generation_prompt=True, tokenize=False)
        return turn + ex.answer_prefix, False
    return ex.context + ex.question + "\n" + ex.answer_prefix, True


def ruler_score(ex: RulerExample, response: str) -> float:
    """RULER's per-sample metric of ``response`` (cleaned as RULER cleans it), in [0, 1]."""
    return SAMPLE_METRICS[FAMILY_METRIC[ex.family]](postprocess_pred(response), ex.outputs)


@dataclass(frozen=True)
class RulerTask:
    """How :func:`~headprobe.eval.datasets.run_dataset_eval` prompts, bounds and scores RULER examples.

    Attributes
    ----------
    record
        What the result's ``task`` records besides ``kind`` (the folder or the generation request).
    max_new_tokens
        A cap on RULER's tokens to generate per task (``None``: RULER's own, 128 for NIAH, 30 for VT, 120
        for CWE, 50 for FWE, 32 for QA).
    """

    record: dict[str, Any]
    max_new_tokens: int | None = None

    def prompt_ids(self, tokenizer: Any, ex: RulerExample, max_length: int, chat_template: bool) -> list[int]:
        """Token ids of the prompt; one longer than ``max_length`` (the model's context) is refused."""
        text, special = ruler_prompt_text(tokenizer, ex, chat_template)
        ids = tokenizer(text, add_special_tokens=special)["input_ids"]
        if len(ids) + self.new_tokens(ex, 0) > max_length:
            raise HeadprobeError(f"RULER sample {ex.id}: {len(ids)} prompt tokens and {self.new_tokens(ex, 0)} to "
                                 f"generate are beyond the model's context of {max_length} tokens")
        return ids

    def question_span(self, tokenizer: Any, ex: RulerExample, ids: list[int], chat_template: bool) -> tuple[int, int]:
        """``(start, end)`` token positions of the question (RULER's split) in the prompt's tokens ``ids``:
        the tokens that start before the question's first character are the context (a token across the
        boundary is context), those that start before its end are the question."""
        text, special = ruler_prompt_text(tokenizer, ex, chat_template)
        start = text.rfind(ex.question) if ex.question else -1
        enc = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
        if start < 0 or list(enc["input_ids"]) != list(ids):
            raise HeadprobeError(f"RULER sample {ex.id}: cannot find where the question starts in its prompt")
        end = start + len(ex.question)
        offsets = enc["offset_mapping"]
        return (sum(1 for s, e in offsets if s < start or s == e == 0),
                sum(1 for s, e in offsets if s < end or s == e == 0))

    def new_tokens(self, ex: RulerExample, max_new_tokens: int) -> int:  # noqa: ARG002 (the QA task's signature)
        """Tokens ``ex`` may generate: RULER's for its task, capped by :attr:`max_new_tokens`."""
        return min(ex.tokens_to_generate, self.max_new_tokens or ex.tokens_to_generate)

    def trial(self, ex: RulerExample, response: str, form: str) -> dict[str, Any]:  # noqa: ARG002
        """The trial fields of one answer: task, length, response, gold strings, RULER's score."""
        return {"task": ex.task, "length": ex.length, "response": response, "gold": list(ex.outputs),
                "score": ruler_score(ex, response)}

    def task_record(self, form: str) -> dict[str, Any]:  # noqa: ARG002
        return {"kind": "ruler", "scorer": "ruler", **self.record,
                **({"max_new_tokens": self.max_new_tokens} if self.max_new_tokens else {})}


def ratio_capacities(prompt_lengths: Sequence[int], ratios: Sequence[float]) -> dict[float, int]:
    """kvpress's compression ratio (the share of the prompt's KV removed) as a capacity per KV head.

    Each ratio ``r`` becomes ``round((1 - r) * mean prompt length)`` tokens per head, one capacity for every
    setting, so every setting at ``r`` keeps the same number of tokens (a budget map sums to the capacity
    times the heads).

    Raises
    ------
    HeadprobeError
        A ratio outside [0, 1), or no prompts.
    """
    if not prompt_lengths:
        raise HeadprobeError("--ratios: no prompts to take the length of")
    for r in ratios:
        if not 0 <= r < 1:
            raise HeadprobeError(f"--ratios {r}: expected a share of the prompt removed, in [0, 1)")
    mean = float(np.mean(prompt_lengths))
    return {r: max(1, round((1 - r) * mean)) for r in ratios}


def ruler_scores(result: Any) -> list[dict[str, Any]]:
    """Per setting and (task, length): RULER's score (mean sample score times 100, rounded to 2), the full
    cache's beside it when the result has a ``full`` setting, and per setting RULER's average over tasks
    (``task`` ``"average"``)."""
    per = _scores_by_setting(result)
    full = next((per[s["label"]] for s in result.settings if s["policy"] == "full" and s["label"] in per), None)
    rows = []
    for s in result.settings:
        scores = per.get(s["label"])
        if scores is None:
            continue
        for (task, length), score in scores.items():
            rows.append({"setting": s["label"], "capacity": s["capacity"], "task": task, "length": length,
                         "score": score, "full": full.get((task, length)) if full else None})
        rows.append({"setting": s["label"], "capacity": s["capacity"], "task": "average", "length": None,
                     "score": ruler_average({f"{k}": v for k, v in scores.items()}),
                     "full": ruler_average({f"{k}": v for k, v in full.items()}) if full else None})
    return rows


def _task_trials(cell: dict[str, Any]) -> dict[tuple[str, Any], list[dict[str, Any]]]:
    """A cell's trials by (task, length), in the order they come."""
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for t in cell["trials"]:
        groups.setdefault((t["task"], t.get("length")), []).append(t)
    return groups


def _score(trials: list[dict[str, Any]]) -> float:
    """RULER's score of some trials: the mean sample score times 100, rounded to 2."""
    return round(float(np.mean([t["score"] for t in trials])) * 100, 2)


def _share(trials: list[dict[str, Any]]) -> float:
    """The bytes the cache held as a share of a full cache of the same tokens, mean over ``trials``."""
    return float(np.mean([t["cache_bytes"] / max(t["full_cache_bytes"], 1) for t in trials]))


def _scores_by_setting(result: Any) -> dict[str, dict[tuple[str, Any], float]]:
    return {cell["setting"]: {k: _score(v) for k, v in _task_trials(cell).items()} for cell in result.cells}


def ruler_points(result: Any) -> list[dict[str, Any]]:
    """What the RULER figure draws: per setting and panel, RULER's score against the cache it held.

    One point per setting and per ``"task@length"`` panel (the run's tasks at each length), plus a panel
    ``"average"`` (RULER's average over those tasks) when there are several. ``share`` is the bytes the
    cache held as a share of a full cache of the same tokens, mean over the panel's samples (for a setting
    that masks, e.g. kvpress's AdaKVPress, the full cache: 1.0); ``ratio`` is the compression ratio the
    setting's capacity came from (``task.ratios``), ``None`` for a setting with no capacity.

    Returns
    -------
    list of dict
        ``setting``, ``name``, ``capacity``, ``ratio``, ``panel``, ``score`` (0-100, as
        :func:`ruler_scores`), ``share``, ``full_score`` (the ``full`` setting's score on the panel, or
        ``None``) and ``kvpress`` (a setting run by kvpress).
    """
    ratios = {int(c): float(r) for r, c in (result.task.get("ratios") or {}).items()}
    settings = {s["label"]: s for s in result.settings}
    per: dict[str, dict[str, tuple[float, float]]] = {}
    for cell in result.cells:
        groups = _task_trials(cell)
        panels = {f"{task}@{length}": (_score(ts), _share(ts)) for (task, length), ts in groups.items()}
        if len(groups) > 1:
            panels["average"] = (ruler_average({k: v[0] for k, v in panels.items()}), _share(cell["trials"]))
        per[cell["setting"]] = panels
    full = next((per[s["label"]] for s in result.settings if s["policy"] == "full" and s["label"] in per), {})
    points = []
    for label, panels in per.items():
        s = settings[label]
        for panel, (score, share) in panels.items():
            points.append({"setting": label, "name": s["name"], "capacity": s["capacity"],
                           "ratio": ratios.get(s["capacity"]) if s["capacity"] is not None else None,
                           "panel": panel, "score": score, "share": share,
                           "full_score": full[panel][0] if panel in full else None,
                           "kvpress": s["name"].startswith("kvpress:")})
    return points


def format_ruler_scores(rows: list[dict[str, Any]]) -> str:
    """A text table of :func:`ruler_scores`: setting, task, length, score, the full cache's, the difference."""
    lines = [f"{'setting':<24} {'task':<16} {'length':>6} {'score':>7} {'full':>7} {'diff':>7}"]
    for r in rows:
        full = "-" if r["full"] is None else f"{r['full']:.2f}"
        diff = "-" if r["full"] is None else f"{r['score'] - r['full']:+.2f}"
        length = "-" if r["length"] is None else str(r["length"])
        lines.append(f"{r['setting']:<24} {r['task']:<16} {length:>6} {r['score']:>7.2f} {full:>7} {diff:>7}")
    return "\n".join(lines)
