"""Needle sets: one needle a line, validated on read."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FileFormatError, HeadprobeError, param
from ..files.jsonio import file_fingerprint, iter_jsonl_objects, read_text
from ..paths import haystacks_dir

NEEDLE_KINDS = ("retrieval", "reasoning")


@dataclass(frozen=True)
class Needle:
    """One needle.

    Attributes
    ----------
    id
        Unique within its file.
    kind
        ``"retrieval"`` or ``"reasoning"``.
    needle
        Text inserted into the haystack.
    question
        What the model is asked after the haystack.
    answer
        Gold answer: a substring of ``needle`` that the model must attend to and produce.
    candidates
        Reasoning needles: ``(c1, c2)`` distractor and correct answer (``answer == c2``).
    facts
        Reasoning needles: the fact sentences.
    """

    id: str
    kind: str
    needle: str
    question: str
    answer: str
    candidates: tuple[str, ...] = field(default_factory=tuple)
    facts: tuple[str, ...] = field(default_factory=tuple)

    @property
    def answer_offset(self) -> int:
        """Character offset of the answer inside ``needle`` (its first occurrence)."""
        return self.needle.index(self.answer)

    @property
    def distractor(self) -> str | None:
        """The wrong candidate of a reasoning needle."""
        return self.candidates[0] if len(self.candidates) == 2 else None


def shipped_needle_file(kind: str) -> Path:
    """The needle file headprobe ships for ``"retrieval"`` or ``"reasoning"`` needles."""
    return haystacks_dir() / "needles" / f"{kind}.jsonl"


def load_needles(path: str | Path, ids: list[str] | None = None) -> list[Needle]:
    """Read and validate a needle file (JSONL, DESIGN.md's format).

    Raises
    ------
    FileFormatError
        Naming the file, the line and the field for a missing field, an answer that is not inside its
        needle, a reasoning needle whose candidates do not fit, or a duplicate id.
    """
    path = Path(path)
    text = read_text(path, "needle file")
    needles: list[Needle] = []
    seen: set[str] = set()
    for where, obj in iter_jsonl_objects(path, text):
        needle = _needle_of(where, obj)
        if needle.id in seen:
            raise FileFormatError(where, "id", f"duplicate id {needle.id!r}")
        seen.add(needle.id)
        needles.append(needle)
    if not needles:
        raise FileFormatError(path, None, "expected at least one needle")
    if ids:
        by_id = {n.id: n for n in needles}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise HeadprobeError(f"{path}: no needle with id {', '.join(missing)} (ids: {', '.join(by_id)})")
        needles = [by_id[i] for i in ids]
    return needles


def _needle_of(where: str, obj: dict) -> Needle:
    """One line of a needle file as a :class:`Needle`, checked; ``where`` names the file and line."""
    for key in ("id", "kind", "needle", "question", "answer"):
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            raise FileFormatError(where, key, "missing or not a non-empty string")
    if obj["kind"] not in NEEDLE_KINDS:
        raise FileFormatError(where, "kind", f"expected 'retrieval' or 'reasoning', found {obj['kind']!r}")
    if obj["answer"] not in obj["needle"]:
        raise FileFormatError(where, "answer", f"{obj['answer']!r} does not occur inside the needle text")
    candidates: tuple[str, ...] = ()
    if obj["kind"] == "reasoning":
        cands = obj.get("candidates")
        if not (isinstance(cands, list) and len(cands) == 2 and all(isinstance(c, str) and c for c in cands)):
            raise FileFormatError(where, "candidates", "expected two strings [distractor, correct answer]")
        if cands[1] != obj["answer"]:
            raise FileFormatError(where, "candidates", "expected the second candidate to equal the answer")
        for c in cands:
            if c not in obj["needle"]:
                raise FileFormatError(where, "candidates", f"{c!r} does not occur inside the needle text")
        candidates = tuple(cands)
    facts = obj.get("facts") or []
    if not (isinstance(facts, list) and all(isinstance(f, str) for f in facts)):
        raise FileFormatError(where, "facts", "expected a list of fact sentences")
    return Needle(id=obj["id"], kind=obj["kind"], needle=obj["needle"], question=obj["question"],
                  answer=obj["answer"], candidates=candidates, facts=tuple(facts))


def needle_file_list(needle_files: Iterable[str | Path] | Mapping[str, str | Path] | None) -> list[Path]:
    """The needle files a run was given, in order: a list of paths, or (the older form) a
    ``{kind: path}`` mapping, read as its paths. Each needle's own ``kind`` decides which pass uses it."""
    if not needle_files:
        return []
    if isinstance(needle_files, (str, Path)):
        return [Path(needle_files)]
    paths = needle_files.values() if isinstance(needle_files, Mapping) else needle_files
    return [Path(p) for p in paths]


@dataclass(frozen=True)
class NeedleFiles:
    """The needle files of a run, each read once, with their needles in file order.

    Attributes
    ----------
    files
        ``(path, needles)`` per file, in the order given.
    """

    files: tuple[tuple[Path, tuple[Needle, ...]], ...]

    def of_kind(self, kind: str, ids: Iterable[str] | None = None) -> tuple[list[Path], list[Needle]]:
        """The needles of ``kind`` from every file that holds some, in file order; the shipped needle set of
        that kind when none does (read here).

        Parameters
        ----------
        kind
            ``"retrieval"`` or ``"reasoning"``.
        ids
            Keep only these needle ids (``None`` for all).

        Returns
        -------
        files, needles
            The files the needles came from and the needles.

        Raises
        ------
        HeadprobeError
            When none of ``ids`` is among the needles.
        """
        used: list[Path] = []
        needles: list[Needle] = []
        for path, held in self.files:
            mine = [n for n in held if n.kind == kind]
            if mine:
                used.append(path)
                needles.extend(mine)
        if not used:
            used = [shipped_needle_file(kind)]
            needles = [n for n in load_needles(used[0]) if n.kind == kind]
        if ids:
            wanted = set(ids)
            chosen = [n for n in needles if n.id in wanted]
            if not chosen:
                where = ", ".join(str(p) for p in used)
                raise HeadprobeError(f"{param('needle_ids')}: none of {', '.join(ids)} is among the {kind} needles "
                                     f"of {where}")
            needles = chosen
        return used, needles


def read_needle_files(files: list[Path], kinds: Iterable[str],
                      readers: Mapping[str, str] | None = None) -> NeedleFiles:
    """Read every needle file once, before a run starts, and refuse one that no requested pass would use.

    Parameters
    ----------
    files
        The needle files given (see :func:`needle_file_list`).
    kinds
        The needle kinds the requested probes read (``"retrieval"`` and/or ``"reasoning"``).
    readers
        Needle kind → the probes that read it, named in the refusal of a file no requested probe reads.

    Raises
    ------
    HeadprobeError
        A file given twice, a file none of whose needles is of a requested kind, or a needle id that two
        files of the same kind share (trial ids are made from needle ids).
    """
    wanted = set(kinds)
    read: list[tuple[Path, tuple[Needle, ...]]] = []
    owner: dict[tuple[str, str], Path] = {}
    for path in files:
        if any(path.resolve() == other.resolve() for other, _ in read):
            raise HeadprobeError(f"{param('needle_files', str(path))}: given twice")
        needles = tuple(load_needles(path))
        held = {n.kind for n in needles}
        if not held & wanted:
            have = " and ".join(sorted(held))
            used_by = [readers[k] for k in sorted(held) if readers and k in readers]
            hint = f" (the {' and '.join(used_by)} probe does)" if used_by else ""
            raise HeadprobeError(f"{param('needle_files', str(path))}: holds only {have} needles, which no requested "
                                 f"probe reads{hint}")
        for n in needles:
            if (n.kind, n.id) in owner:
                raise FileFormatError(path, "id", f"needle id {n.id!r} is also in {owner[(n.kind, n.id)]}; "
                                      "ids must be unique across the needle files of a run")
            owner[(n.kind, n.id)] = path
        read.append((path, needles))
    return NeedleFiles(tuple(read))


def needle_set_record(files: list[Path], needles: list[Needle],
                      namer: Callable[[Path], tuple[str, bool]] | None = None) -> dict[str, Any]:
    """What a trial log (and so a profile) records about the needles of a pass: each file with its
    fingerprint, and the needle ids. One file: ``{"path", "fingerprint", "ids"}``; several:
    ``{"files": [{"path", "fingerprint"}, ...], "ids"}``.

    ``namer`` maps a file to ``(name, shipped)`` (e.g. a portable name); the entries then carry ``shipped``
    too. Without it a file is named by its path as given.
    """
    def entry(p: Path) -> dict[str, Any]:
        if namer is None:
            return {"path": str(p), "fingerprint": file_fingerprint(p)}
        name, shipped = namer(p)
        return {"path": name, "shipped": shipped, "fingerprint": file_fingerprint(p)}

    entries = [entry(Path(p)) for p in files]
    ids = [n.id for n in needles]
    if len(entries) == 1:
        return {**entries[0], "ids": ids}
    return {"files": entries, "ids": ids}
