"""Build a question-answering set from the shipped corpus (haystacks/corpus/*.txt, not the needle sets).

Each example is one corpus document as the context, a question that quotes a sentence of it up to its last
words, and those last words as the answer: a span of the real text, found verbatim in the context
(``answer_start`` gives its offset). Sentences are taken evenly from the start to the end of each document
(so the evidence lies at every depth), only where the answer and the quoted beginning each occur once in
the document. Deterministic: no randomness; the same files give the same set.

Documents with an odd number (01, 03, ...) make the calibration split (profiles are made on it), the
even ones the held-out split (budgets are evaluated on it), so no context is in both.

    python benchmarks/build_corpus_qa.py --out /tmp/corpus_qa          # calibration.jsonl, heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "haystacks" / "corpus"
SENTENCE = re.compile(r"[^.!?\n]+[.!?]")
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


def build(per_doc: int = 6, answer_words: int = 2) -> dict[str, list[dict]]:
    """``{"calibration": [...], "heldout": [...]}`` from every corpus document."""
    splits: dict[str, list[dict]] = {"calibration": [], "heldout": []}
    for path in sorted(CORPUS.glob("*.txt")):
        number = int(path.name.split("_", 1)[0])
        text = path.read_text(encoding="utf-8").strip()
        split = "calibration" if number % 2 == 1 else "heldout"
        splits[split] += questions_of(path.stem, text, per_doc, answer_words)
    return splits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for calibration.jsonl and heldout.jsonl")
    parser.add_argument("--per-doc", type=int, default=6, help="questions per document")
    parser.add_argument("--answer-words", type=int, default=2, help="words in each answer")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in build(args.per_doc, args.answer_words).items():
        path = out / f"{split}.jsonl"
        if path.exists():
            raise SystemExit(f"{path}: exists; choose another --out")
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        print(f"wrote {path}: {len(rows)} examples from {len({r['doc'] for r in rows})} documents")


if __name__ == "__main__":
    main()
