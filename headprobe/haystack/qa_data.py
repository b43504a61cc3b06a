"""A user's examples file: the one reader of ``profile --contexts`` and ``eval``/``tune --task dataset``.

:func:`read_rows` opens a ``.jsonl``/``.json``/``.csv``/``.parquet`` file, a dataset folder or a hub name
through ``datasets`` (:func:`open_dataset`) and maps its fields to one set of roles (:class:`ContextFields`):
``context``, ``question``, ``answer`` (``answers`` is the same role), ``answer_offset`` and ``id``. What a
command then does with a row (locate the answer in the context, or score a response against the answers)
is the command's own; reading, the roles, the split rule and every refusal of the data are here, so both
commands read a file the same way.

Split rule: a file, or a folder holding one dataset, is one split; of a folder (or hub dataset) holding
several, ``split`` names one, else the only one is read, else the data is refused in one line listing its
splits.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FileFormatError, HeadprobeError, param

#: The roles a field can be named for, in their order in messages and records.
ROLES = ("context", "question", "answer", "answer_offset", "id")
#: Other names of a role (kept for ``eval --fields answers=NAME``): other name → the role.
ALIASES = {"answers": "answer"}
#: The fields a role reads when ``--fields`` does not name it, the first the data has (SQuAD's names, then
#: LongBench's); ``id`` falls back to ``id``, ``_id``, then the row number.
DEFAULT_NAMES = {"context": ("context",), "question": ("question", "input"), "answer": ("answer", "answers")}
#: Data-file suffixes and the ``datasets`` builder that reads each.
FILE_KINDS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
_TEXT_KINDS = ("json", "csv")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ContextFields:
    """Which field of a row holds what (``--fields ROLE=NAME,...``); ``None``: the role's default.

    Attributes
    ----------
    context, question, answer
        Field names. Left out, the first of :data:`DEFAULT_NAMES` the data has (``question``, else
        ``input``; ``answer``, else ``answers``). The answer field holds a string, a list of strings or
        SQuAD's ``{"text": [...], "answer_start": [...]}``.
    answer_offset
        Field holding the answer's character offset in the context, or ``None``: the first occurrence.
    id
        Field holding the example's id, or ``None``: ``id`` or ``_id`` when the data has one, else the row
        number.
    """

    context: str | None = None
    question: str | None = None
    answer: str | None = None
    answer_offset: str | None = None
    id: str | None = None

    @classmethod
    def parse(cls, text: str | Mapping[str, str] | ContextFields | None) -> ContextFields:
        """``"context=doc,question=q,answer=a"`` (the ``--fields`` flag; roles left out keep their default).

        Raises
        ------
        HeadprobeError
            A part that is not ``ROLE=NAME``, an unknown role, or a role given twice (``answers`` and
            ``answer`` are one role).
        """
        if text is None or isinstance(text, ContextFields):
            return text or cls()
        if isinstance(text, str):
            pairs = []
            for part in (p for p in text.split(",") if p.strip()):
                role, sep, name = part.partition("=")
                if not sep or not name.strip():
                    raise HeadprobeError(f"{param('fields', text)}: expected ROLE=NAME,... with roles "
                                         f"{', '.join(ROLES)} (answers: another name of answer)")
                pairs.append((role.strip(), name.strip()))
        else:
            pairs = list(dict(text).items())
        named: dict[str, str] = {}
        for role, name in pairs:
            canonical = ALIASES.get(role, role)
            if canonical not in ROLES:
                raise HeadprobeError(f"{param('fields', text)}: unknown role {role!r}; expected {', '.join(ROLES)}")
            if canonical in named:
                raise HeadprobeError(f"{param('fields', text)}: role {canonical!r} given twice, as field "
                                     f"{named[canonical]!r} and as field {name!r}; give each role once")
            named[canonical] = name
        return cls(**named)

    def resolve(self, columns: list[str], where: str) -> ContextFields:
        """The field names this data is read with: each role named, or its default found in ``columns``.

        Raises
        ------
        HeadprobeError
            A role whose field the data lacks (naming the fields it has); ``where`` begins the message.
        """
        chosen: dict[str, str] = {}
        missing: dict[str, str] = {}
        for role in ROLES:
            given = getattr(self, role)
            if given is not None:
                (chosen if given in columns else missing)[role] = given
            elif role in DEFAULT_NAMES:
                found = next((n for n in DEFAULT_NAMES[role] if n in columns), None)
                if found is None:
                    missing[role] = DEFAULT_NAMES[role][0]
                else:
                    chosen[role] = found
        if missing:
            named = ", ".join(f"{role}={f!r}" for role, f in missing.items())
            raise HeadprobeError(f"{where}: no field for {named} (fields: {', '.join(columns) or 'none'}); "
                                 f"name them with {param('fields')} context=NAME,question=NAME,answer=NAME")
        return ContextFields(**chosen)

    def to_json(self) -> dict[str, str | None]:
        return {role: getattr(self, role) for role in ROLES}


@dataclass(frozen=True)
class QARow:
    """One row as read: its id, its texts, and its candidate answers with their offsets where given.

    Attributes
    ----------
    index
        The row's number in the data (after ``limit``).
    answers
        The candidate answers, each a string (any one counts).
    offsets
        Per answer, its character offset in ``context`` where the data gives one, else ``None``.
    """

    index: int
    id: str
    context: str
    question: str
    answers: tuple[str, ...]
    offsets: tuple[int | None, ...]


@dataclass(frozen=True)
class QARows:
    """A user's examples as read.

    Attributes
    ----------
    name
        The data as given (a path, a hub name, or ``<dataset>``).
    where
        How messages name it (``--contexts qa.jsonl``, ``--dataset qa.jsonl``).
    fields
        The field names read (:meth:`ContextFields.resolve`).
    rows
        The rows, in the data's order.
    """

    name: str
    where: str
    fields: ContextFields
    rows: tuple[QARow, ...]


def read_rows(source: Any, fields: ContextFields | str | Mapping[str, str] | None = None, split: str | None = None,
              limit: int | None = None, what: str = "source") -> QARows:
    """Read a user's examples: every row's id, context, question and answers, checked.

    Parameters
    ----------
    source
        A data file, a dataset folder, a ``datasets.Dataset`` or a hub name (:func:`open_dataset`).
    fields
        Field names (:class:`ContextFields` or the ``--fields`` text).
    split
        The split of a folder holding several (the module's split rule).
    limit
        Read only the first ``limit`` rows.
    what
        The parameter that named ``source`` (``contexts``, ``source``), for messages.

    Raises
    ------
    HeadprobeError
        One line naming the data (and the row and field where it applies): anything :func:`open_dataset`
        refuses, a field the data lacks, no rows, a row whose context, question or answer is missing or
        empty, an offset that is not a character offset, or ids that repeat.
    """
    fields = ContextFields.parse(fields)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise HeadprobeError(f"{param('limit', limit)}: expected a positive number of rows")
    ds, name = open_dataset(source, split, what)
    where = param(what, name)
    resolved = fields.resolve(list(ds.column_names), where)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    if len(ds) == 0:
        raise HeadprobeError(f"{where}: no rows")
    rows: list[QARow] = []
    seen: set[str] = set()
    for i, row in enumerate(_iter_rows(ds, where)):
        read = _row(row, resolved, i, where)
        if read.id in seen:
            raise HeadprobeError(f"{where}: row {i}: id {read.id!r} repeats an earlier row's")
        seen.add(read.id)
        rows.append(read)
    return QARows(name, where, resolved, tuple(rows))


def _iter_rows(ds: Any, where: str) -> Iterator[dict]:
    """The rows of ``ds``; text ``datasets`` cannot decode is one line, not a traceback."""
    rows, i = iter(ds), 0
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except UnicodeDecodeError as exc:
            raise HeadprobeError(f"{where}: row {i}: expected UTF-8 text ({exc.reason})") from None
        yield row
        i += 1


# ---- one row --------------------------------------------------------------------------------------------

def _where(where: str, i: int, field: str) -> str:
    return f"{where}: row {i}: field {field!r}"


def _row(row: dict, fields: ContextFields, i: int, where: str) -> QARow:
    answers, offsets = _answers(row, fields, i, where)
    return QARow(i, _row_id(row, fields, i, where), _text(row, fields.context, i, where),
                 _text(row, fields.question, i, where), tuple(answers), tuple(offsets))


def _row_id(row: dict, fields: ContextFields, i: int, where: str) -> str:
    if fields.id is not None:
        value = row[fields.id]
        if value is None or (isinstance(value, str) and not value.strip()):
            raise HeadprobeError(f"{_where(where, i, fields.id)}: expected an id, found {value!r}")
        return str(value)
    for key in ("id", "_id"):
        if row.get(key) is not None:
            return str(row[key])
    return str(i)


def _text(row: dict, field: str, i: int, where: str) -> str:
    value = row[field]
    if not isinstance(value, str) or not value.strip():
        raise HeadprobeError(f"{_where(where, i, field)}: expected non-empty text, found {str(value)[:40]!r}")
    return value


def _answers(row: dict, fields: ContextFields, i: int, where: str) -> tuple[list[str], list[int | None]]:
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
        raise HeadprobeError(f"{_where(where, i, fields.answer)}: expected an answer (text or a list of texts), "
                             f"found {str(value)[:40]!r}")
    if fields.answer_offset is not None:
        given = row[fields.answer_offset]
        given = given if isinstance(given, list) else [given]
        for k, offset in enumerate(given[:len(answers)]):
            if offset is None:              # no offset for this row: the first occurrence
                continue
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise HeadprobeError(f"{_where(where, i, fields.answer_offset)}: expected a character offset "
                                     f"(an integer >= 0), found {offset!r}")
            offsets[k] = offset
    return answers, offsets


# ---- opening the data -----------------------------------------------------------------------------------

def open_dataset(source: Any, split: str | None = None, what: str = "source") -> tuple[Any, str]:
    """Open a dataset through ``datasets``, offline for local files and folders: ``(dataset, name)``.

    Parameters
    ----------
    source
        A ``datasets.Dataset`` or ``DatasetDict``, a local ``.json``/``.jsonl``/``.csv``/``.parquet`` file, a
        local dataset folder (``save_to_disk``, or a folder of data files), or a hub name.
    split
        The split of a folder or hub dataset holding several (a file is one split); ``None``: the only one.
    what
        The parameter that named ``source``, for messages.

    Raises
    ------
    HeadprobeError
        One line: no such file or folder, a file of another type, a text file that is not UTF-8
        (``FILE: expected UTF-8 text; byte N (0x..) is not valid UTF-8``), an empty file (no rows), data
        ``datasets`` cannot load, ``split`` given for a file, a split the data lacks or several splits and
        none named; or the optional
        ``datasets`` package is not installed.
    """
    datasets = _datasets_module()
    if isinstance(source, datasets.Dataset):
        return source, "<dataset>"
    name = "<dataset>" if isinstance(source, datasets.DatasetDict) else str(source)
    where = param(what, name)
    if isinstance(source, datasets.DatasetDict):
        return _one_split(source, split, where), name
    path = Path(name)
    kind = _check_local(path, name, where)
    if kind is not None and split is not None:
        raise HeadprobeError(f"{param('split', split)}: chooses a split of a dataset folder or hub dataset; {where} "
                             "is one file, read whole")
    try:
        data = _load(datasets, path, name, kind, split)
    except (OSError, ValueError, KeyError, StopIteration, datasets.exceptions.DatasetsError) as exc:
        raise HeadprobeError(f"{where}: {_load_failure(exc, datasets)}") from None
    return _one_split(data, split, where), name


def _load_failure(exc: BaseException, datasets: Any) -> str:
    """What ``datasets`` failed on, in one line: ``no rows``, or ``cannot load (the first cause's words)``."""
    if "corresponds to no data" in str(exc):        # an empty JSON list, a CSV of a header alone
        return "no rows"
    if isinstance(exc, datasets.exceptions.DatasetGenerationError) and exc.__cause__ is not None:
        exc = exc.__cause__                        # "An error occurred while generating the dataset" says little
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"cannot load ({msg})"



def _datasets_module() -> Any:
    try:
        import datasets
    except ImportError:
        raise HeadprobeError("reading a dataset (eval --task dataset, tune --task dataset, profile --contexts) "
                             "needs the 'datasets' package, an optional dependency: pip install 'headprobe[eval]'"
                             ) from None
    return datasets


def _check_local(path: Path, name: str, where: str) -> str | None:
    """What can be refused before ``datasets`` reads a local path; the builder of a data file (else ``None``)."""
    if path.is_file():
        kind = FILE_KINDS.get(path.suffix.lower())
        if kind is None:
            raise HeadprobeError(f"{where}: expected a .json, .jsonl, .csv or .parquet file")
        try:
            empty = path.stat().st_size == 0 or (kind in _TEXT_KINDS and not utf8_text_has_content(path))
        except OSError as exc:
            raise HeadprobeError(f"{where}: cannot read ({exc.strerror})") from None
        if empty:
            raise HeadprobeError(f"{where}: no rows")
        return kind
    if path.is_dir():
        if not _saved_folder(path):
            for data_file in sorted(path.rglob("*")):
                hidden = any(p.startswith((".", "_")) for p in data_file.relative_to(path).parts)
                if not hidden and FILE_KINDS.get(data_file.suffix.lower()) in _TEXT_KINDS and data_file.is_file():
                    utf8_text_has_content(data_file)
        return None
    if path.suffix or path.is_absolute() or name.startswith("."):
        raise HeadprobeError(f"{where}: no such file or folder")
    return None


def _saved_folder(path: Path) -> bool:
    return (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()


def utf8_text_has_content(path: Path) -> bool:
    """Whether the file holds anything but white space, read in chunks.

    Raises
    ------
    FileFormatError
        The file is not UTF-8: ``FILE: expected UTF-8 text; byte N (0x..) is not valid UTF-8``, N counted
        from the file's start.
    """
    offset, carry, content = 0, b"", False
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            data = carry + chunk
            try:
                data.decode("utf-8")
                carry = b""
            except UnicodeDecodeError as exc:
                if chunk and exc.end == len(data) and exc.start >= len(data) - 3:
                    carry = data[exc.start:]            # a character cut by the chunk's end: read on
                    data = data[:exc.start]
                else:
                    raise FileFormatError(path, None, f"expected UTF-8 text; byte {offset + exc.start} "
                                                      f"(0x{data[exc.start]:02x}) is not valid UTF-8") from None
            content = content or bool(data.strip())
            offset += len(data)
            if not chunk:
                return content


def _load(datasets: Any, path: Path, name: str, kind: str | None, split: str | None) -> Any:
    if kind is not None:
        return datasets.load_dataset(kind, data_files=str(path), split="train")
    if path.is_dir() and _saved_folder(path):
        return datasets.load_from_disk(str(path))
    if path.is_dir() or split is None:
        return datasets.load_dataset(str(path) if path.is_dir() else name)
    return datasets.load_dataset(name, split=split)


def _one_split(data: Any, split: str | None, where: str) -> Any:
    """The split rule: a dataset is its own split; of several, ``split`` or the only one."""
    if not isinstance(data, dict):              # a DatasetDict is a dict of splits
        return data
    names = list(data.keys())
    if split is not None:
        if split not in names:
            raise HeadprobeError(f"{where}: no split {split!r} (splits: {', '.join(names) or 'none'})")
        return data[split]
    if len(names) == 1:
        return data[names[0]]
    raise HeadprobeError(f"{where}: holds {len(names)} splits ({', '.join(names) or 'none'}); pick one with "
                         f"{param('split', 'NAME')}")
