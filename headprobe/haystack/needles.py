"""Needle sets: one needle a line, validated on read."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FileFormatError, HeadprobeError
from ..files.jsonio import file_fingerprint, iter_jsonl_objects
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
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise HeadprobeError(f"{path}: no such needle file") from exc
    needles: list[Needle] = []
    seen: set[str] = set()
    for where, obj in iter_jsonl_objects(path, "\n".join(lines)):
        for key in ("id", "kind", "needle", "question", "answer"):
            if not isinstance(obj.get(key), str) or not obj[key].strip():
                raise FileFormatError(where, key, "missing or not a non-empty string")
        if obj["kind"] not in NEEDLE_KINDS:
            raise FileFormatError(where, "kind", f"expected 'retrieval' or 'reasoning', found {obj['kind']!r}")
        if obj["answer"] not in obj["needle"]:
            raise FileFormatError(where, "answer", f"{obj['answer']!r} does not occur inside the needle text")
        if obj["id"] in seen:
            raise FileFormatError(where, "id", f"duplicate id {obj['id']!r}")
        seen.add(obj["id"])
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
        needles.append(Needle(id=obj["id"], kind=obj["kind"], needle=obj["needle"], question=obj["question"],
                              answer=obj["answer"], candidates=candidates, facts=tuple(facts)))
    if not needles:
        raise FileFormatError(path, None, "expected at least one needle")
    if ids:
        by_id = {n.id: n for n in needles}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise HeadprobeError(f"{path}: no needle with id {', '.join(missing)} (ids: {', '.join(by_id)})")
        needles = [by_id[i] for i in ids]
    return needles


def needle_set_fingerprint(path: str | Path) -> str:
    return file_fingerprint(path)
