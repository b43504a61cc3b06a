"""RULER samples shaped as RULER's prepare.py writes them (its task templates, ``base`` model template, answer
prefix appended), for tests that must not need RULER's generator."""

from __future__ import annotations

import json
from pathlib import Path

NIAH = ("A special magic number is hidden within the following text. Make sure to memorize it. I will quiz you "
        "about the number afterwards.\n{context}\nWhat is the special magic number for {key} mentioned in the "
        "provided text? The special magic number for {key} mentioned in the provided text is")
QA = ("Answer the question based on the given documents. Only give me the answer and do not output any other "
      "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
      "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query} Answer:")
CWE = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
       "that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list? "
       "Answer: The top 10 words that appear most often in the list are:")
VT = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
      "Question: Find all variables that are assigned the value {query} in the text above. Answer: According to "
      "the chain(s) of variable assignment in the text above, 2 variables are assgined the value {query}, they "
      "are: ")

HAY = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"


def niah_row(index: int, key: str, value: str, repeats: int = 6) -> dict:
    context = HAY * (repeats // 2) + f"One of the special magic numbers for {key} is: {value}.\n" + HAY * (repeats // 2)
    return {"index": index, "input": NIAH.format(context=context.rstrip("\n"), key=key), "outputs": [value],
            "length": 300}


def qa_row(index: int) -> dict:
    docs = "Document 1:\nThe Broncos won the game in Denver.\n\nDocument 2:\nThe sky over Santa Clara was blue."
    return {"index": index, "input": QA.format(context=docs, query="Who won the game?"),
            "outputs": ["Denver Broncos", "Broncos"], "length": 120}


def cwe_row(index: int) -> dict:
    words = " ".join(f"{i + 1}. {w}" for i, w in enumerate(["apple", "pear", "apple", "plum", "apple", "pear"]))
    return {"index": index, "input": CWE.format(context=words), "outputs": ["apple", "pear"], "length": 150}


def vt_row(index: int) -> dict:
    chain = "VAR QXKZP = 12345 ... VAR MLOPA = VAR QXKZP ... The grass is green."
    return {"index": index, "input": VT.format(context=chain, query="12345"), "outputs": ["QXKZP", "MLOPA"],
            "length": 140}


def write_task(folder: Path, task: str, rows: list[dict]) -> Path:
    """``folder/task/validation.jsonl`` holding ``rows`` (as RULER's write_manifest writes them)."""
    path = folder / task / "validation.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_ruler_dir(folder: Path) -> Path:
    """Two niah_single_1 samples, one qa_1, one cwe and one vt, as prepare.py lays them out."""
    write_task(folder, "niah_single_1", [niah_row(0, "flippant-twine", "2694522"),
                                         niah_row(1, "old-snowplow", "7120868")])
    write_task(folder, "qa_1", [qa_row(0)])
    write_task(folder, "cwe", [cwe_row(0)])
    write_task(folder, "vt", [vt_row(0)])
    return folder
