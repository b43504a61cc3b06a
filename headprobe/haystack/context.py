"""Building a trial's prompt: haystack cut to a length in model tokens, needle at a depth, answer span.

The needle is inserted at the requested depth moved back to the previous sentence start, the prompt is
rendered in one of two forms (:mod:`headprobe.haystack.prompt_format`: the model's chat template when it
has one and it is wanted, else plain text ending with the answer cue ``Answer:``) and tokenised once; the
answer span and the question span are located by mapping character offsets to tokens through the
tokenizer's offset mapping, so they are exact even when tokens merge across a boundary. The question
span says where the question ends relative to the last prompt token (what an observation window of the
last ``w`` prompt tokens sees of it).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from functools import lru_cache

from ..errors import HeadprobeError, param
from .corpus import Haystack
from .needles import Needle
from .prompt_format import ANSWER_CUE, plain_question, prompt_format_of

_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+")


@dataclass(frozen=True)
class TrialContext:
    """A rendered, tokenised trial prompt.

    Attributes
    ----------
    input_ids
        Prompt token ids (chat template applied, or the plain form's answer cue), ending where the model's
        response starts.
    text
        The rendered prompt.
    answer_span
        ``(start, end)`` token positions of the answer inside the needle (end exclusive).
    needle_span
        ``(start, end)`` token positions of the needle.
    answer_chars
        ``(start, end)`` character offsets of the answer in ``text``.
    depth
        Requested depth in [0, 1]; ``actual_depth`` is where the needle landed (share of haystack chars).
    response_prefix
        Text appended after the rendered prompt to start the response: the answer cue ``Answer:`` of the
        plain form, ``The answer is:`` after the chat template for reasoning needles, else empty.
    question_span
        ``(start, end)`` token positions of the question asked after the document (the needle's or the
        item's question sentence, without the ``Question:`` label and the answer instruction);
        ``(0, 0)`` when there is none.
    prompt_format
        ``"chat"`` or ``"plain"`` (:mod:`headprobe.haystack.prompt_format`).
    """

    input_ids: list[int]
    text: str
    answer_span: tuple[int, int]
    needle_span: tuple[int, int]
    answer_chars: tuple[int, int]
    target_length: int
    depth: float
    actual_depth: float
    response_prefix: str = ""
    question_span: tuple[int, int] = (0, 0)
    prompt_format: str = "chat"

    @property
    def length(self) -> int:
        return len(self.input_ids)

    @property
    def after_question(self) -> int:
        """Prompt tokens after the question's last token: the answer instruction, the chat template's end
        (``<|im_end|>``, ``<|im_start|>assistant`` ...) and any response prefix; in the plain form only the
        line break and the cue ``Answer:``. A window of the last ``w`` tokens sees the question only when
        ``w > after_question``."""
        self._check_question()
        return self.length - self.question_span[1]

    @property
    def question_window(self) -> int:
        """The smallest window of last prompt tokens that holds the whole question: question tokens plus
        :attr:`after_question`."""
        self._check_question()
        return self.length - self.question_span[0]

    def _check_question(self) -> None:
        if self.question_span[1] <= self.question_span[0]:
            raise HeadprobeError("this prompt has no question to measure a window from")


def answer_instruction(needle: Needle | None) -> str:
    """How to answer: with one of a reasoning needle's two candidates, else in a short phrase."""
    if needle is not None and needle.kind == "reasoning":
        c1, c2 = needle.candidates
        return f"Answer with {c1} or {c2} only, based on the document above."
    return "Answer in a short phrase, based on the document above."


#: The label before the question in both forms.
QUESTION_LABEL = "Question: "


def question_prompt(needle: Needle | None, question: str | None = None, prompt_format: str = "chat") -> str:
    """The text after the document: the question and how to answer.

    Chat form: ``Question: <q>`` then the instruction. Plain form: the instruction, then ``Question: <q>``
    and a line break; the cue (:func:`response_prefix`) follows.
    """
    q = question if question is not None else (needle.question if needle else "")
    if prompt_format == "plain":
        return plain_question(answer_instruction(needle), q)
    return f"{QUESTION_LABEL}{q}\n{answer_instruction(needle)}"


#: Start of the model's response for reasoning needles under a chat template, so a small model names a
#: candidate at once instead of restating the question ("The older person ..."). The plain form's answer
#: cue does the same for every needle.
REASONING_RESPONSE_PREFIX = "The answer is:"


def response_prefix(needle: Needle | None, prompt_format: str = "chat") -> str:
    """Text after the rendered prompt that starts the response: the plain form's answer cue; under a chat
    template, ``The answer is:`` for reasoning needles and nothing otherwise."""
    if prompt_format == "plain":
        return ANSWER_CUE
    return REASONING_RESPONSE_PREFIX if needle is not None and needle.kind == "reasoning" else ""


def render_prompt(tokenizer, user_text: str, chat_template: bool) -> tuple[str, int, bool]:
    """Render ``user_text`` as the model's prompt.

    Returns
    -------
    text, offset, add_special_tokens
        The prompt, the character offset of ``user_text`` inside it, and whether tokenising it should add
        the tokenizer's special tokens (not when a chat template supplied them).
    """
    if chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": user_text}], tokenize=False,
                                             add_generation_prompt=True)
        offset = text.find(user_text)
        if offset < 0:
            raise HeadprobeError("the chat template changed the prompt text; "
                                 "render the prompt without the chat template")
        return text, offset, False
    return user_text, 0, True


def render_instruction_prompt(tokenizer, document: str, instruction: str, chat_template: bool) -> tuple[str, bool]:
    """A document followed by an instruction (the layer-retention task prompts), in the prompt's form.

    Chat form: ``document + "\\n\\n" + instruction`` as the user's turn. Plain form: the same text, then the
    answer cue on a line of its own.

    Returns
    -------
    text, add_special_tokens
        As :func:`render_prompt`.
    """
    text, _, add_special = render_prompt(tokenizer, f"{document}\n\n{instruction}", chat_template)
    if prompt_format_of(tokenizer, chat_template) == "plain":
        text += f"\n{ANSWER_CUE}"
    return text, add_special


@lru_cache(maxsize=8)
def _haystack_tokens(tokenizer, text: str) -> tuple[tuple[int, int], ...]:
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return tuple(tuple(o) for o in enc["offset_mapping"])


@lru_cache(maxsize=8)
def _sentence_starts(text: str) -> tuple[int, ...]:
    return (0,) + tuple(m.end() for m in _SENTENCE_END.finditer(text))


def _sentence_start_at_or_before(text: str, char: int) -> int:
    starts = _sentence_starts(text)
    return starts[bisect.bisect_right(starts, char) - 1]


def build_context(
    tokenizer,
    haystack: Haystack,
    needle: Needle | None,
    length: int,
    depth: float,
    chat_template: bool = True,
    max_context: int | None = None,
    question: str | None = None,
) -> TrialContext:
    """Build one trial prompt of about ``length`` tokens with ``needle`` at ``depth``.

    Parameters
    ----------
    tokenizer
        A fast tokenizer (offset mapping).
    haystack
        The text to cut.
    needle
        The needle, or ``None`` for the plain haystack prompt (used for prefix reuse).
    length
        Target prompt length in model tokens (template, haystack, needle and question included); the
        result is at most ``length`` and within a sentence of it.
    depth
        Where the needle goes, 0 (start of the haystack) to 1 (end).
    chat_template
        Apply the tokenizer's chat template when it has one; otherwise the prompt is plain text that ends
        with the answer cue ``Answer:`` (:mod:`headprobe.haystack.prompt_format`).
    max_context
        The model's context; lengths beyond it are refused.

    Raises
    ------
    HeadprobeError
        If ``length`` exceeds ``max_context`` or the haystack is too short.
    """
    if max_context and length > max_context:
        raise HeadprobeError(f"{param('lengths', length)}: beyond the model's context of {max_context} tokens")
    if not 0.0 <= depth <= 1.0:
        raise HeadprobeError(f"{param('depths', depth)}: expected a depth between 0 and 1")
    offsets = _haystack_tokens(tokenizer, haystack.text)
    asked = question if question is not None else (needle.question if needle else "")
    form = prompt_format_of(tokenizer, chat_template)
    qtext = question_prompt(needle, question, form)
    overhead = _prompt_overhead(tokenizer, needle, qtext, chat_template, form)
    budget = length - overhead
    if budget <= 0:
        raise HeadprobeError(f"{param('lengths', length)}: too short for the prompt around the haystack "
                             f"({overhead} tokens)")
    best = _longest_fitting(tokenizer, haystack, offsets, budget, needle, depth, qtext, chat_template, length,
                            asked, form)
    if best is None:
        raise HeadprobeError(f"could not fit a prompt into {length} tokens; try a larger {param('lengths')} value")
    return best


def _prompt_overhead(tokenizer, needle: Needle | None, qtext: str, chat_template: bool, form: str) -> int:
    """The tokens of the prompt around the haystack: template, question, the needle (with a chat prompt's
    response prefix) and, for a plain prompt, the answer cue."""
    empty, _, add_special = render_prompt(tokenizer, f"\n\n{qtext}", chat_template)
    cue = ANSWER_CUE if form == "plain" else ""       # the cue ends every plain prompt, with or without a needle
    overhead = len(tokenizer(empty + cue, add_special_tokens=add_special)["input_ids"])
    if needle is not None:
        after = "" if form == "plain" else response_prefix(needle)
        overhead += len(tokenizer(" " + needle.needle + after, add_special_tokens=False)["input_ids"]) + 1
    return overhead


def _longest_fitting(tokenizer, haystack: Haystack, offsets: tuple[tuple[int, int], ...], budget: int,
                     needle: Needle | None, depth: float, qtext: str, chat_template: bool, length: int,
                     asked: str, form: str) -> TrialContext | None:
    """The longest prompt of at most ``length`` tokens found in up to six cuts of the haystack at a sentence
    start, starting with ``budget`` haystack tokens and moving the cut by what the last prompt missed
    (``None`` if none fits).

    Raises
    ------
    HeadprobeError
        If the haystack is too short for a cut.
    """
    text = haystack.text
    best: TrialContext | None = None
    for _ in range(6):
        if budget > len(offsets):
            raise HeadprobeError(
                f"haystack {haystack.name}: too short for {length} tokens ({len(offsets)} tokens of text); "
                f"pass a longer {param('haystack')} or smaller {param('lengths')}"
            )
        cut = _sentence_start_at_or_before(text, offsets[budget - 1][1])
        if cut == 0:
            cut = offsets[budget - 1][1]
        body = text[:cut].rstrip()
        context = _assemble(tokenizer, body, needle, depth, qtext, chat_template, length, asked, form)
        if context.length <= length and (best is None or context.length > best.length):
            best = context
        if best is not None and length - best.length <= 16:
            break
        step = length - context.length
        if step == 0 or (step > 0 and best is context and budget >= len(offsets)):
            break
        budget = max(1, budget + (step if step < 0 else max(1, step // 2)))
    return best


def _assemble(tokenizer, body: str, needle: Needle | None, depth: float, qtext: str, chat_template: bool,
              length: int, asked: str = "", form: str = "chat") -> TrialContext:
    if needle is None:
        document, needle_at, actual = body, None, depth
    else:
        insert = _sentence_start_at_or_before(body, round(depth * len(body)))
        if depth >= 1.0:
            document = body + " " + needle.needle
            needle_at = len(body) + 1
        else:
            prefix = body[:insert]
            document = prefix + needle.needle + " " + body[insert:]
            needle_at = insert
        actual = needle_at / max(1, len(body))
    user_text = f"{document}\n\n{qtext}"
    text, offset, add_special = render_prompt(tokenizer, user_text, chat_template)
    prefix = response_prefix(needle, form)
    text += prefix
    enc = tokenizer(text, add_special_tokens=add_special, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    question_span = (0, 0)
    if asked.strip():
        # user_text = document + "\n\n" + qtext, and qtext holds "Question: " + asked
        q_start = offset + len(document) + 2 + qtext.index(QUESTION_LABEL + asked) + len(QUESTION_LABEL)
        question_span = chars_to_tokens(offsets, q_start, q_start + len(asked))
    if needle is None:
        return TrialContext(ids, text, (0, 0), (0, 0), (0, 0), length, depth, actual, prefix,
                            question_span=question_span, prompt_format=form)
    needle_start = offset + needle_at
    answer_start = needle_start + needle.answer_offset
    answer_chars = (answer_start, answer_start + len(needle.answer))
    answer_span = chars_to_tokens(offsets, *answer_chars)
    needle_span = chars_to_tokens(offsets, needle_start, needle_start + len(needle.needle))
    return TrialContext(ids, text, answer_span, needle_span, answer_chars, length, depth, actual, prefix,
                        question_span, form)


def response_tokens(tokenizer, context: TrialContext, answer: str) -> list[int]:
    """Token ids of ``answer`` as the model's response continues the prompt: the response the probes score,
    which starts after the prompt's last token (the plain form's cue ``Answer:``, or the chat template's
    generation prompt).

    After a response prefix ("Answer:", "The answer is:") the answer follows a space; tokenising prefix and
    answer together and dropping the prefix's tokens gives the ids a model would produce there.
    """
    if not context.response_prefix:
        return list(tokenizer(answer, add_special_tokens=False)["input_ids"])
    head = tokenizer(context.response_prefix, add_special_tokens=False)["input_ids"]
    both = tokenizer(context.response_prefix + " " + answer, add_special_tokens=False)["input_ids"]
    if both[:len(head)] == head:
        return list(both[len(head):])
    return list(tokenizer(" " + answer, add_special_tokens=False)["input_ids"])


def chars_to_tokens(offsets: list[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """Token span ``[first, last + 1)`` of the tokens that overlap characters ``[start, end)``.

    Tokens with empty offsets (special tokens) never count. Raises ``ValueError`` if no token overlaps.
    """
    hits = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
    if not hits:
        raise ValueError(f"no token covers characters {start}-{end}")
    return hits[0], hits[-1] + 1


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """Number of leading tokens two prompts share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
