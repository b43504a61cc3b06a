"""How :func:`~headprobe.eval.datasets.run_dataset_eval` prompts, bounds and scores its examples.

An answer task is any object with the four methods of :class:`AnswerTask`. The default is
:class:`LongBenchQA` (LongBench-style QA, token-F1); RULER's is :class:`headprobe.eval.ruler_task.RulerTask`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import HeadprobeError, param
from ..haystack.prompt_format import ANSWER_CUE, plain_question, prompt_format_of
from .answer_scores import answer_text, score_answer


class AnswerTask(Protocol):
    """What a dataset eval needs to know about its examples."""

    def prompt_ids(self, tokenizer: Any, ex: Any, max_length: int, chat_template: bool) -> list[int]:
        """Token ids of the prompt of ``ex``, at most ``max_length``."""
        ...

    def new_tokens(self, ex: Any, max_new_tokens: int) -> int:
        """Tokens ``ex`` may generate, given the run's ``max_new_tokens``."""
        ...

    def trial(self, ex: Any, response: str, form: str) -> dict[str, Any]:
        """The trial fields of one answer (``response``, ``gold``, ``score`` in [0, 1], and any others)."""
        ...

    def task_record(self, form: str) -> dict[str, Any]:
        """Fields the result's ``task`` records on top of the dataset's (``kind``, ``scorer`` may be replaced)."""
        ...


def qa_prompt_ids(tokenizer: Any, ex: Any, max_length: int, chat_template: bool = True) -> list[int]:
    """Prompt token ids; a context too long for ``max_length`` is cut in the middle (LongBench's way).

    Under the chat template the question comes before the answer instruction; the plain form
    (:mod:`headprobe.haystack.prompt_format`) puts the instruction first and ends with the answer cue.
    """
    head = "Read the text below and answer the question.\n\n"
    instruction = "Answer in a short phrase, based on the text above."
    if prompt_format_of(tokenizer, chat_template) == "plain":
        tail = f"\n\n{plain_question(instruction, ex.question)}{ANSWER_CUE}"
    else:
        tail = f"\n\nQuestion: {ex.question}\n{instruction}"

    def render(context: str) -> list[int]:
        text = head + context + tail
        if chat_template and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
            return tokenizer(text, add_special_tokens=False)["input_ids"]
        return tokenizer(text)["input_ids"]

    ids = render(ex.context)
    if len(ids) <= max_length:
        return ids
    ctx = tokenizer(ex.context, add_special_tokens=False)["input_ids"]
    keep = len(ctx) - (len(ids) - max_length) - 2
    while True:     # decoding and re-tokenising the cut may add a token or two: cut more, never the question
        if keep <= 0:
            raise HeadprobeError(f"{param('max_length', max_length)}: too short for the question of row {ex.id}")
        cut = tokenizer.decode(ctx[:keep // 2]) + " ... " + tokenizer.decode(ctx[len(ctx) - keep // 2:])
        ids = render(cut)
        if len(ids) <= max_length:
            return ids
        keep -= len(ids) - max_length


@dataclass(frozen=True)
class LongBenchQA:
    """Context / question / answers rows, LongBench's prompt cut in the middle, token-F1 (max over answers);
    with the plain prompt form the response's first line is scored."""

    def prompt_ids(self, tokenizer: Any, ex: Any, max_length: int, chat_template: bool) -> list[int]:
        return qa_prompt_ids(tokenizer, ex, max_length, chat_template)

    def new_tokens(self, ex: Any, max_new_tokens: int) -> int:  # noqa: ARG002 (one budget for every row)
        return max_new_tokens

    def trial(self, ex: Any, response: str, form: str) -> dict[str, Any]:
        return {"response": response, "gold": list(ex.answers),
                "score": score_answer(answer_text(response, form), list(ex.answers), "f1")}

    def task_record(self, form: str) -> dict[str, Any]:
        # the answer is the line after the cue (answer_text); the record says so
        return {"scored": "first line"} if form == "plain" else {}
