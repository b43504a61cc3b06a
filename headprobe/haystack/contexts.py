"""A user's own examples for profiling: each a context, a question and an answer located in the context.

:func:`read_contexts` reads a JSONL/JSON/CSV/Parquet file or a dataset folder through ``datasets``
(:func:`~headprobe.haystack.qa_data.read_rows`, the reader of ``eval --task dataset`` too) with configurable
field names (:class:`ContextFields`, ``--fields context=...,question=...,answer=...``). An example is
used when its answer occurs verbatim in its context (the first occurrence, or the one at the given answer
offset); examples whose answer is not in their context are counted and named in
:attr:`ContextSet.not_in_context`, never dropped silently. :func:`document_prompt` renders an example as
the needle probes render a trial (:mod:`headprobe.haystack.context`): the user's context in place of the
haystack, then the question and the answer instruction, in the chat template when the model has one.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError
from .context import TrialContext, chars_to_tokens, question_prompt, render_prompt, response_prefix
from .prompt_format import prompt_format_of
from .qa_data import ContextFields, QARow, read_rows

__all__ = ["ContextExample", "ContextFields", "ContextSet", "DocumentPrompt", "document_prompt", "read_contexts"]

_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+|\n\s*\n")


@dataclass(frozen=True)
class ContextExample:
    """One used example.

    Attributes
    ----------
    id
        The example's id (unique in its set).
    context, question, answer
        Its text.
    answer_start
        Character offset of the answer in ``context``.
    """

    id: str
    context: str
    question: str
    answer: str
    answer_start: int

    @property
    def needle_id(self) -> str:
        """The example's id (fast mode's batches look trials' needles up by it)."""
        return self.id

    @property
    def answer_end(self) -> int:
        return self.answer_start + len(self.answer)

    def answer_sentence(self) -> str:
        """The context from the start of the answer's sentence to the end of the answer: what a model that
        restates the fact says up to the answer."""
        start = 0
        for m in _SENTENCE_END.finditer(self.context[:self.answer_start]):
            start = m.end()
        return self.context[start:self.answer_end]


@dataclass(frozen=True)
class ContextSet:
    """A user's examples as read.

    Attributes
    ----------
    name
        What was read (a file or folder path, or a dataset name).
    fingerprint
        Hash of every row's context, question, answer and offset (``sha256:`` + 16 hex digits): the data,
        whatever file format held it.
    fields
        The field names read (each role's field as named, or the default the data has).
    rows
        Rows read.
    examples
        The examples whose answer is in their context, in the data's order.
    not_in_context
        Ids of the rows whose answer does not occur in their context (not profiled).
    """

    name: str
    fingerprint: str
    fields: ContextFields
    rows: int
    examples: tuple[ContextExample, ...]
    not_in_context: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """What trial logs and profiles record of the data (``settings.contexts``)."""
        return {"name": self.name, "fingerprint": self.fingerprint, "fields": self.fields.to_json(),
                "rows": self.rows, "used": len(self.examples), "answer_not_in_context": len(self.not_in_context),
                "not_in_context_ids": list(self.not_in_context[:20])}

    def describe(self) -> str:
        """One line: how many examples are used and how many were left out, and why."""
        line = f"{self.name}: {len(self.examples)} of {self.rows} examples used"
        if self.not_in_context:
            shown = ", ".join(self.not_in_context[:5]) + (", ..." if len(self.not_in_context) > 5 else "")
            line += f"; {len(self.not_in_context)} left out, their answer is not in their context ({shown})"
        return line


_CACHE: dict[tuple, ContextSet] = {}


def read_contexts(source: Any, fields: ContextFields | str | None = None, split: str | None = None,
                  limit: int | None = None, name: str | None = None) -> ContextSet:
    """Read a user's examples.

    Parameters
    ----------
    source
        A ``.jsonl``/``.json``/``.csv``/``.parquet`` file, a dataset folder ``datasets`` can load offline
        (``save_to_disk``, or a folder of data files), a ``datasets.Dataset``, or a hub name.
    fields
        Field names (:class:`ContextFields` or the ``--fields`` text).
    split
        The split of a folder holding several; ``None``: its only one
        (:mod:`~headprobe.haystack.qa_data`'s split rule).
    limit
        Read only the first ``limit`` rows.
    name
        How the data is named in files (default: ``source`` as given).

    Raises
    ------
    HeadprobeError
        One line naming ``contexts`` (and the row and field where it applies): whatever
        :func:`~headprobe.haystack.qa_data.read_rows` refuses (a missing or unreadable file, a text file
        that is not UTF-8, an empty file, a field the data lacks, an empty context, question or answer,
        ids that repeat, a folder of several splits and none named), an offset that does not point at the
        answer, or no row whose answer is in its context.
    """
    fields = ContextFields.parse(fields)
    recorded = name or str(source)
    key = None
    if isinstance(source, (str, Path)) and Path(source).is_file():
        stat = Path(source).stat()
        key = (str(Path(source).resolve()), stat.st_mtime_ns, stat.st_size, fields, split, limit, recorded)
        if key in _CACHE:
            return _CACHE[key]
    data = read_rows(source, fields, split, limit, what="contexts")
    digest = hashlib.sha256()
    used: list[ContextExample] = []
    skipped: list[str] = []
    for row in data.rows:
        example = _locate(row, data.fields, data.where)
        digest.update(json.dumps([row.id, row.context, row.question, list(row.answers), list(row.offsets)]).encode())
        if example is None:
            skipped.append(row.id)
        else:
            used.append(example)
    if not used:
        raise HeadprobeError(f"{data.where}: no example's answer occurs in its context "
                             f"({len(skipped)} rows); the probes score the answer's place in the context")
    result = ContextSet(recorded, "sha256:" + digest.hexdigest()[:16], data.fields, len(data.rows), tuple(used),
                        tuple(skipped))
    if key is not None:
        _CACHE.clear()          # one set kept: the passes of one run read the same file
        _CACHE[key] = result
    return result


def _locate(row: QARow, fields: ContextFields, where: str) -> ContextExample | None:
    """The example with its first answer found in the context (at its offset when given), or ``None``."""
    context = row.context
    for answer, offset in zip(row.answers, row.offsets, strict=True):
        if not answer.strip():
            continue
        if offset is not None:
            if context[offset:offset + len(answer)] != answer:
                field = fields.answer_offset or fields.answer
                raise HeadprobeError(f"{where}: row {row.index}: field {field!r}: offset {offset} does not point "
                                     f"at the answer {answer[:40]!r} (the context there reads "
                                     f"{context[offset:offset + len(answer)][:40]!r})")
            return ContextExample(row.id, context, row.question, answer, offset)
        start = context.find(answer)
        if start >= 0:
            return ContextExample(row.id, context, row.question, answer, start)
    return None


# ---- the prompt -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DocumentPrompt:
    """An example rendered and tokenised as the model's prompt.

    Attributes
    ----------
    context
        The prompt as the needle probes describe theirs (:class:`~headprobe.haystack.context.TrialContext`):
        ``answer_span`` is the answer's place in the user's context, ``needle_span`` the same span,
        ``question_span`` the question's tokens.
    query_start
        First token after the document: the question, the answer instruction and the template's end,
        which QRHead's score attends from.
    """

    context: TrialContext
    query_start: int

    @property
    def input_ids(self) -> list[int]:
        return self.context.input_ids


def document_prompt(tokenizer: Any, example: ContextExample, chat_template: bool = True,
                    question: str | None = None) -> DocumentPrompt:
    """Render ``example`` as a prompt: its context as the document, then the question (``question`` in its
    place when given: QRHead's null query), as :func:`~headprobe.haystack.context.build_context` renders a
    needle-free haystack, so a change to the probes' prompt form reaches these prompts too.

    Raises
    ------
    HeadprobeError
        When the chat template changes the text (the answer could not be located).
    """
    asked = example.question if question is None else question
    form = prompt_format_of(tokenizer, chat_template)
    qtext = question_prompt(None, asked, form)
    user_text = f"{example.context}\n\n{qtext}"
    text, offset, add_special = render_prompt(tokenizer, user_text, chat_template)
    prefix = response_prefix(None, form)
    text += prefix
    enc = tokenizer(text, add_special_tokens=add_special, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    answer_chars = (offset + example.answer_start, offset + example.answer_end)
    answer_span = chars_to_tokens(offsets, *answer_chars)
    after = offset + len(example.context) + 2          # user_text = context + "\n\n" + qtext
    query_start = chars_to_tokens(offsets, after, len(text))[0]
    q_start = after + qtext.index(asked)
    question_span = chars_to_tokens(offsets, q_start, q_start + len(asked))
    trial = TrialContext(ids, text, answer_span, answer_span, answer_chars, len(ids), 0.0, 0.0, prefix,
                         question_span, form)
    return DocumentPrompt(trial, query_start)
