"""Build a question-answering set from the shipped corpus (haystacks/corpus/*.txt, not the needle sets).

Each example is one corpus document as the context, a question about one of its sentences and an answer
that is a span of the real text, found verbatim in the context (``answer_start`` gives its offset). Two
forms (``--form``):

- ``copula`` (default): every sentence of the form "The/A/Her... SUBJECT is/was/are/were COMPLEMENT." gives
  "According to the text, what VERB SUBJECT?" with the complement as the answer ("The island was small
  enough to walk around in an hour." -> "According to the text, what was the island?" / "small enough to
  walk around in an hour"): about two per document.
- ``cloze``: a sentence quoted up to its last two words, which are the answer; sentences taken evenly from
  the start to the end of each document, where the answer and the quoted beginning each occur once.
  SmolLM2-135M-Instruct answers none of these with the full cache (it restates the sentence's start), so
  they make no accuracy benchmark for it.

Deterministic: no randomness; the same files give the same set.

Cloze: documents with an odd number (01, 03, ...) make the calibration split (profiles are made on it), the
even ones the held-out split (budgets are evaluated on it), so no context is in both. Copula: the examples,
in document order, alternate between the splits (too few per document to split by document evenly), so
a document may be the context of a calibration and a held-out question, never of the same one.

    python benchmarks/build_corpus_qa.py --out /tmp/corpus_qa          # calibration.jsonl, heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "haystacks" / "corpus"
SENTENCE = re.compile(r"[^.!?\n]+[.!?]")
COPULA = re.compile(r"(?:^|(?<=[.!?]\s))((?:The|A|An|Her|His|Their|Our|My) [A-Za-z' -]{3,60}?) (is|was|are|were) "
                    r"([^.;:!?\"]{3,60})\.", re.MULTILINE)
#: Words an answer may not end on (a "short phrase" answer should carry content).
STOP = {"a", "an", "the", "of", "to", "in", "on", "at", "and", "or", "but", "it", "is", "was", "be", "as", "for",
        "by", "with", "that", "this", "he", "she", "they", "we", "you", "i", "his", "her", "their", "its", "them",
        "him", "me", "us", "not", "so", "then", "there", "all", "one", "up", "out", "do", "did", "had", "has"}


def questions_of(doc_id: str, text: str, per_doc: int, answer_words: int) -> list[dict]:
    """Up to ``per_doc`` examples of one document, their sentences spread evenly over it."""
    candidates = []
    for m in SENTENCE.finditer(text):
        sentence = m.group(0).strip()
        words = sentence.rstrip(".!?").split()
        if len(words) < 12 or '"' in sentence:
            continue
        answer = " ".join(words[-answer_words:]).strip(",;:")
        if answer.split()[-1].lower() in STOP or answer.split()[0].lower() in STOP:
            continue
        start = m.start() + m.group(0).index(sentence)
        answer_start = text.index(answer, start)
        quoted = text[start:answer_start].strip()
        if text.count(answer) != 1 or text.count(quoted) != 1 or len(quoted.split()) < 8:
            continue
        candidates.append({"answer": answer, "answer_start": answer_start, "quoted": quoted})
    if not candidates:
        return []
    step = max(1, len(candidates) / per_doc)
    chosen = [candidates[int(i * step)] for i in range(min(per_doc, len(candidates)))]
    return [{"id": f"{doc_id}-{k}", "doc": doc_id, "context": text,
             "question": f'How does this sentence of the text end: "{c["quoted"]} ..."?',
             "answer": c["answer"], "answer_start": c["answer_start"]} for k, c in enumerate(chosen)]


def copula_questions_of(doc_id: str, text: str) -> list[dict]:
    """Every "SUBJECT is COMPLEMENT." sentence of one document as a question about its subject."""
    out = []
    for m in COPULA.finditer(text):
        subject, verb, answer = m.group(1), m.group(2), m.group(3).strip()
        if text.count(answer) != 1:
            continue
        out.append({"id": f"{doc_id}-{len(out)}", "doc": doc_id, "context": text,
                    "question": f"According to the text, what {verb} {subject[0].lower() + subject[1:]}?",
                    "answer": answer, "answer_start": m.start(3) + m.group(3).index(answer)})
    return out


def build(per_doc: int = 6, answer_words: int = 2, form: str = "copula") -> dict[str, list[dict]]:
    """``{"calibration": [...], "heldout": [...]}`` from every corpus document."""
    splits: dict[str, list[dict]] = {"calibration": [], "heldout": []}
    for path in sorted(CORPUS.glob("*.txt")):
        number = int(path.name.split("_", 1)[0])
        text = path.read_text(encoding="utf-8").strip()
        split = "calibration" if number % 2 == 1 else "heldout"
        if form == "copula":
            for row in copula_questions_of(path.stem, text):
                n = len(splits["calibration"]) + len(splits["heldout"])
                splits["calibration" if n % 2 == 0 else "heldout"].append(row)
        else:
            splits[split] += questions_of(path.stem, text, per_doc, answer_words)
    return splits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for calibration.jsonl and heldout.jsonl")
    parser.add_argument("--per-doc", type=int, default=6, help="cloze: questions per document")
    parser.add_argument("--answer-words", type=int, default=2, help="cloze: words in each answer")
    parser.add_argument("--form", choices=["copula", "cloze"], default="copula")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in build(args.per_doc, args.answer_words, args.form).items():
        path = out / f"{split}.jsonl"
        if path.exists():
            raise SystemExit(f"{path}: exists; choose another --out")
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        print(f"wrote {path}: {len(rows)} examples from {len({r['doc'] for r in rows})} documents")


if __name__ == "__main__":
    main()
