"""Gemma 3 270M, a base model, answers a short needle through the plain prompt's answer cue, in a haystack
headprobe does not ship and nothing was tuned on: docstrings of this Python's standard library.

Without the cue the model goes on writing the document (another ``Question:``, another heading) instead of
answering; with it, the full cache finds these needles.
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path

import pytest

import headprobe
from headprobe.eval.runner import EvalRequest, run_eval
from headprobe.eval.settings import expand_settings
from headprobe.haystack.corpus import Haystack
from headprobe.haystack.needles import Needle

pytestmark = pytest.mark.slow

MODULES = ("functools", "random", "shutil", "tempfile", "threading", "fnmatch", "bisect", "copy", "pprint", "glob")

NEEDLES = [
    Needle("t1", "retrieval", "The combination of the blue locker in the gym is 4172.",
           "What is the combination of the blue locker in the gym?", "4172"),
    Needle("t2", "retrieval", "The parrot in the harbour office is called Captain Biscuit.",
           "What is the parrot in the harbour office called?", "Captain Biscuit"),
    Needle("t3", "retrieval", "The oldest clock in the town museum was made by Elsbeth Varga.",
           "Who made the oldest clock in the town museum?", "Elsbeth Varga"),
]


def _docstring_haystack() -> Haystack:
    root = Path(sysconfig.get_paths()["stdlib"])
    paragraphs = []
    for name in MODULES:
        tree = ast.parse((root / f"{name}.py").read_text(encoding="utf-8"))
        for node in [tree, *ast.walk(tree)]:
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc.split()) >= 8:
                    paragraphs.append(" ".join(doc.split()))
    return Haystack("stdlib-docstrings", "\n\n".join(dict.fromkeys(paragraphs)))


def test_gemma3s_full_cache_answers_short_needles_after_the_cue(gemma3, tmp_path, one_thread):
    hay = _docstring_haystack()
    assert not any(n.answer.lower() in hay.text.lower() for n in NEEDLES)
    items = headprobe.items_from_needles(NEEDLES)
    request = EvalRequest(expand_settings(["full"], [64]), items, [1000], [0.25, 0.75], hay, {"kind": "needle"},
                          max_new_tokens=12)
    result = run_eval(gemma3, request, tmp_path / "e.json")
    assert result.extra["prompt_format"] == "plain"
    trials = [t for c in result.cells for t in c["trials"]]
    found = [t for t in trials if t["score"] > 0.5]
    assert len(trials) == 6
    assert len(found) >= 5, [(t["item"], t["response"]) for t in trials]
    assert {t["item"] for t in found} == {"t1", "t2", "t3"}       # every needle, at one depth at least
