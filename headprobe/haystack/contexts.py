"""A user's own examples for profiling: each a context, a question and an answer located in the context.

:func:`read_contexts` reads a JSONL/JSON/CSV/Parquet file or a dataset folder through ``datasets``
(:func:`~headprobe.eval.datasets.open_dataset`, the reader of ``eval --task dataset``) with configurable
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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError, param
from .context import TrialContext, chars_to_tokens, question_prompt, render_prompt, response_prefix
from .prompt_format import prompt_format_of

#: The roles a field name can be given for, and their defaults.
FIELD_ROLES = {"context": "context", "question": "question", "answer": "answer", "answer_offset": None, "id": None}

_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+|\n\s*\n")


@dataclass(frozen=True)
class ContextFields:
    """Which field of a row holds what.

    Attributes
    ----------
    context, question, answer
        Field names. The answer field holds a string, a list of strings (the first that occurs in the
        context is used) or SQuAD's ``{"text": [...], "answer_start": [...]}``.
    answer_offset
        Field holding the answer's character offset in the context (which occurrence is meant), or
        ``None``: the first occurrence.
    id
        Field holding the example's id, or ``None``: ``id`` or ``_id`` when the data has one, else the row
        number.
    """

    context: str = "context"
    question: str = "question"
    answer: str = "answer"
    answer_offset: str | None = None
    id: str | None = None

    @classmethod
    def parse(cls, text: str | Mapping[str, str] | ContextFields | None) -> ContextFields:
        """``"context=doc,question=q,answer=a"`` (the ``--fields`` flag; roles left out keep their default).

        Raises
        ------
        HeadprobeError
            A part that is not ``ROLE=NAME`` or names an unknown role.
        """
        if text is None or isinstance(text, ContextFields):
            return text or cls()
        pairs = dict(text) if isinstance(text, Mapping) else {}
        if isinstance(text, str):
            for part in (p for p in text.split(",") if p.strip()):
                role, sep, name = part.partition("=")
                if not sep or not name.strip():
                    raise HeadprobeError(f"{param('fields', text)}: expected ROLE=NAME,... with roles "
                                         f"{', '.join(FIELD_ROLES)}")
                pairs[role.strip()] = name.strip()
        for role in pairs:
            if role not in FIELD_ROLES:
                raise HeadprobeError(f"{param('fields', text)}: unknown role {role!r}; expected "
                                     f"{', '.join(FIELD_ROLES)}")
        return cls(**pairs)

    def to_json(self) -> dict[str, str | None]:
        return {role: getattr(self, role) for role in FIELD_ROLES}


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
        The field names used.
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


def read_contexts(source: Any, fields: ContextFields | str | None = None, split: str = "train",
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
        The split of a folder holding several.
    limit
        Read only the first ``limit`` rows.
    name
        How the data is named in files (default: ``source`` as given).

    Raises
    ------
    HeadprobeError
        One line naming ``contexts`` (and the row and field where it applies): a file that does not exist
        or cannot be read, a field the data lacks (naming the fields it has), a row whose context, question
        or answer is missing or empty, an offset that does not point at the answer, ids that repeat, no
        rows, or no row whose answer is in its context.
    """
    fields = ContextFields.parse(fields)
    recorded = name or str(source)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise HeadprobeError(f"{param('limit', limit)}: expected a positive number of rows")
    label = str(source)            # messages name the data as it was given
    key = None
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists() and (path.suffix or path.is_absolute() or str(source).startswith(".")):
            raise HeadprobeError(f"{param('contexts', str(source))}: no such file or folder")
        if path.is_file():
            stat = path.stat()
            if stat.st_size == 0 or (path.suffix in (".jsonl", ".json", ".csv") and not path.read_bytes().strip()):
                raise HeadprobeError(f"{param('contexts', label)}: no rows")
            key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size, fields, split, limit, recorded)
            if key in _CACHE:
                return _CACHE[key]
    from ..eval.datasets import open_dataset

    ds, _ = open_dataset(source, split, what="contexts")
    columns = list(ds.column_names)
    wanted = {role: getattr(fields, role) for role in FIELD_ROLES if getattr(fields, role) is not None}
    missing = {role: f for role, f in wanted.items() if f not in columns}
    if missing:
        named = ", ".join(f"{role}={f!r}" for role, f in missing.items())
        raise HeadprobeError(f"{param('contexts', label)}: no field for {named} (fields: {', '.join(columns) or 'none'}); "
                             f"name them with {param('fields')} context=NAME,question=NAME,answer=NAME")
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    if len(ds) == 0:
        raise HeadprobeError(f"{param('contexts', label)}: no rows")
    digest = hashlib.sha256()
    used: list[ContextExample] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for i, row in enumerate(ds):
        example_id = _row_id(row, fields, i, label)
        if example_id in seen:
            raise HeadprobeError(f"{param('contexts', label)}: row {i}: id {example_id!r} repeats an earlier row's")
        seen.add(example_id)
        context = _text(row, fields.context, i, label)
        question = _text(row, fields.question, i, label)
        answers, offsets = _answers(row, fields, i, label)
        example = _locate(example_id, context, question, answers, offsets, fields, i, label)
        digest.update(json.dumps([example_id, context, question, answers, offsets]).encode())
        if example is None:
            skipped.append(example_id)
        else:
            used.append(example)
    if not used:
        raise HeadprobeError(f"{param('contexts', label)}: no example's answer occurs in its context "
                             f"({len(skipped)} rows); the probes score the answer's place in the context")
    result = ContextSet(recorded, "sha256:" + digest.hexdigest()[:16], fields, len(ds), tuple(used), tuple(skipped))
    if key is not None:
        _CACHE.clear()          # one set kept: the passes of one run read the same file
        _CACHE[key] = result
    return result


def _where(label: str, i: int, field: str) -> str:
    return f"{param('contexts', label)}: row {i}: field {field!r}"


def _row_id(row: dict, fields: ContextFields, i: int, label: str) -> str:
    if fields.id is not None:
        value = row[fields.id]
        if value is None or (isinstance(value, str) and not value.strip()):
            raise HeadprobeError(f"{_where(label, i, fields.id)}: expected an id, found {value!r}")
        return str(value)
    for key in ("id", "_id"):
        if row.get(key) is not None:
            return str(row[key])
    return str(i)


def _text(row: dict, field: str, i: int, label: str) -> str:
    value = row[field]
    if not isinstance(value, str) or not value.strip():
        raise HeadprobeError(f"{_where(label, i, field)}: expected non-empty text, found {str(value)[:40]!r}")
    return value


def _answers(row: dict, fields: ContextFields, i: int, label: str) -> tuple[list[str], list[int | None]]:
    """The row's candidate answers and, where given, their offsets."""
    value = row[fields.answer]
    offsets: list[int | None]
    if isinstance(value, dict) and "text" in value:            # SQuAD: {"text": [...], "answer_start": [...]}
        texts = value["text"] if isinstance(value["text"], list) else [value["text"]]
        starts = value.get("answer_start")
        starts = starts if isinstance(starts, list) else [starts] * len(texts)
        answers, offsets = list(texts), list(starts) + [None] * (len(texts) - len(starts))
    elif isinstance(value, str):
        answers, offsets = [value], [None]
    elif isinstance(value, list):
        answers, offsets = list(value), [None] * len(value)
    else:
        answers, offsets = [], []
    if not answers or not all(isinstance(a, str) for a in answers) or not any(a.strip() for a in answers):
        raise HeadprobeError(f"{_where(label, i, fields.answer)}: expected an answer (text or a list of texts), "
                             f"found {str(value)[:40]!r}")
    if fields.answer_offset is not None:
        given = row[fields.answer_offset]
        given = given if isinstance(given, list) else [given]
        for k, offset in enumerate(given[:len(answers)]):
            if offset is None:              # no offset for this row: the first occurrence
                continue
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise HeadprobeError(f"{_where(label, i, fields.answer_offset)}: expected a character offset "
                                     f"(an integer >= 0), found {offset!r}")
            offsets[k] = offset
    return answers, offsets


def _locate(example_id: str, context: str, question: str, answers: list[str], offsets: list[int | None],
            fields: ContextFields, i: int, label: str) -> ContextExample | None:
    """The example with its first answer found in the context (at its offset when given), or ``None``."""
    for answer, offset in zip(answers, offsets, strict=True):
        if not answer.strip():
            continue
        if offset is not None:
            if context[offset:offset + len(answer)] != answer:
                field = fields.answer_offset or fields.answer
                raise HeadprobeError(f"{_where(label, i, field)}: offset {offset} does not point at the answer "
                                     f"{answer[:40]!r} (the context there reads "
                                     f"{context[offset:offset + len(answer)][:40]!r})")
            return ContextExample(example_id, context, question, answer, offset)
        start = context.find(answer)
        if start >= 0:
            return ContextExample(example_id, context, question, answer, start)
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
