"""A question-answering set on the shipped corpus, as a user's own data: contexts, questions, answers.

``benchmarks/data/corpus_qa.jsonl`` holds 90 questions written about the 14 documents of
``haystacks/corpus`` (not the needle sets): each names its document, and its answer is a span of that
document (``answer_start`` is its character offset; a question's answer may occur elsewhere too). This
script turns them into the files ``headprobe profile --contexts`` and ``headprobe eval --task dataset``
read, split by document so that no context is in both halves: the odd-numbered documents make the
calibration half (profiles are made on it), the even ones the held-out half (budgets are evaluated on it).

    python benchmarks/corpus_qa.py --out corpus_qa/      # calibration.jsonl, heldout.jsonl

Each row: ``id``, ``context`` (the whole document), ``question``, ``answer`` (one string),
``answers`` (a list, for eval's dataset task) and ``answer_start``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ROOT / "benchmarks" / "data" / "corpus_qa.jsonl"
CORPUS = ROOT / "haystacks" / "corpus"


def rows() -> list[dict]:
    """Every question with its document as the context; the answer span is checked against the text."""
    out = []
    for line in QUESTIONS.read_text(encoding="utf-8").splitlines():
        q = json.loads(line)
        context = (CORPUS / q["doc"]).read_text(encoding="utf-8")
        start = q["answer_start"]
        if context[start:start + len(q["answer"])] != q["answer"]:
            raise SystemExit(f"{QUESTIONS}: {q['id']}: the answer is not at answer_start in {q['doc']}")
        out.append({"id": q["id"], "context": context, "question": q["question"], "answer": q["answer"],
                    "answers": [q["answer"]], "answer_start": start})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    split = {"calibration": [], "heldout": []}
    for row in rows():
        doc_number = int(row["id"][1:3])
        split["calibration" if doc_number % 2 else "heldout"].append(row)
    for name, part in split.items():
        path = args.out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
        print(f"wrote {path} ({len(part)} questions)")


if __name__ == "__main__":
    main()
