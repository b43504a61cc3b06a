"""A haystack headprobe does not ship, built from this Python's standard-library docstrings, and short-answer
needles for it.

Usage::

    python benchmarks/stdlib_haystack.py --out stdlib_bench/        # writes haystack.txt and needles.jsonl

The haystack is the module, class and function docstrings of a fixed list of pure-Python standard-library
modules, read from their source files with :mod:`ast` (nothing is imported), one docstring a paragraph,
each module's block headed by its name. The needles are eight one-sentence facts with a short answer
(a number, a colour and a noun, a name) and a question each, in the format of
``haystacks/needles/retrieval.jsonl``. The script refuses to write when a needle's answer already occurs
in the haystack, and prints both files' fingerprints (the same Python version gives the same text).
"""

from __future__ import annotations

import argparse
import ast
import json
import sysconfig
from pathlib import Path

#: Modules whose docstrings form the haystack, in this order (documented prose, no needle answer in them).
MODULES = ("argparse", "calendar", "csv", "difflib", "fractions", "heapq", "shlex", "statistics", "string",
           "textwrap", "uuid", "zipfile", "ipaddress", "configparser", "gettext", "imaplib", "smtplib",
           "tarfile", "pathlib", "datetime")

#: ``(id, needle, question, answer)``: short answers, none of them words the docstrings use.
NEEDLES = (
    ("s01", "The access code for the east storeroom is 5829.", "What is the access code for the east storeroom?",
     "5829"),
    ("s02", "The lighthouse on Varn Island is painted teal and saffron.",
     "What colours is the lighthouse on Varn Island painted?", "teal and saffron"),
    ("s03", "The night porter of the Kestrel Hotel is called Ambrose Tully.",
     "What is the name of the night porter of the Kestrel Hotel?", "Ambrose Tully"),
    ("s04", "The spare key to the boathouse is hidden under a clay tortoise.",
     "Where is the spare key to the boathouse hidden?", "under a clay tortoise"),
    ("s05", "The bakery on Quill Street sells rhubarb crumpets every Thursday.",
     "What does the bakery on Quill Street sell every Thursday?", "rhubarb crumpets"),
    ("s06", "The winning raffle ticket at the harvest fair was number 7316.",
     "What was the number of the winning raffle ticket at the harvest fair?", "7316"),
    ("s07", "The mascot of the Oakridge chess club is a stuffed badger named Pimm.",
     "What is the name of the Oakridge chess club's mascot?", "Pimm"),
    ("s08", "The ferry to Marrow Point leaves at twenty past six.", "When does the ferry to Marrow Point leave?",
     "twenty past six"),
)


def module_docstrings(name: str) -> list[str]:
    """The docstrings of a standard-library module's source file, in source order (module first)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    path = root / f"{name}.py"
    if not path.exists():                      # a package in some Python versions (zipfile from 3.12)
        path = root / name / "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = []
    for node in [tree, *ast.walk(tree)]:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc.split()) >= 8 and doc not in docs:
                docs.append(" ".join(doc.split()))
    return docs


def build_haystack() -> str:
    """The haystack text: one block per module, its name then its docstrings, blocks separated by blank lines."""
    blocks = []
    for name in MODULES:
        docs = module_docstrings(name)
        blocks.append(f"Python Library Documentation: {name}\n\n" + "\n\n".join(docs))
    return "\n\n".join(blocks) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for haystack.txt and needles.jsonl")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = build_haystack()
    lowered = text.lower()
    clashes = [i for i, _, _, answer in NEEDLES if answer.lower() in lowered]
    if clashes:
        raise SystemExit(f"needle answers occur in the haystack: {', '.join(clashes)}")
    (out / "haystack.txt").write_text(text, encoding="utf-8")
    with open(out / "needles.jsonl", "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps({"id": i, "kind": "retrieval", "needle": needle, "question": question,
                                     "answer": answer}) + "\n" for i, needle, question, answer in NEEDLES)
    import headprobe

    hay = headprobe.load_haystack(str(out / "haystack.txt"))
    needles = headprobe.load_needles(str(out / "needles.jsonl"))
    print(f"wrote {out / 'haystack.txt'} ({len(text.split()):,} words, fingerprint {hay.fingerprint}) and "
          f"{out / 'needles.jsonl'} ({len(needles)} needles)")


if __name__ == "__main__":
    main()
