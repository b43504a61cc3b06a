"""RULER's files as its ``prepare.py`` writes them, read and split into context, question and answer prefix.

``prepare.py --save_dir DIR --task TASK`` writes ``DIR/TASK/validation.jsonl``, one sample a line:
``index`` (int), ``input`` (the whole prompt: RULER's task template with the context, the question and the
answer prefix, in the ``base`` model template), ``outputs`` (the gold strings) and ``length`` (tokens of
``input`` plus the task's tokens to generate, counted with the tokenizer it was made for). RULER's own
scripts lay several lengths out as ``DIR/LENGTH/TASK/validation.jsonl``; both layouts are read.

The split is kvpress's (NVIDIA/kvpress ``evaluation/benchmarks/ruler/create_huggingface_dataset.py``): the
context ends where the *last* match of the task family's question pattern starts (the QA and CWE templates
state their instruction twice, before and after the documents), and the answer prefix starts at the first
match of the answer pattern after it, so ``context + question + answer_prefix == input``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import HeadprobeError

#: RULER's 13 tasks and their families (``synthetic.yaml`` of RULER's prepare.py).
TASK_FAMILY = {
    "niah_single_1": "niah", "niah_single_2": "niah", "niah_single_3": "niah", "niah_multikey_1": "niah",
    "niah_multikey_2": "niah", "niah_multikey_3": "niah", "niah_multivalue": "niah", "niah_multiquery": "niah",
    "vt": "variable_tracking", "cwe": "common_words_extraction", "fwe": "freq_words_extraction",
    "qa_1": "qa", "qa_2": "qa",
}

#: Tokens RULER generates per task family (``tokens_to_generate`` of RULER's ``data/synthetic/constants.py``).
TOKENS_TO_GENERATE = {"niah": 128, "variable_tracking": 30, "common_words_extraction": 120,
                      "freq_words_extraction": 50, "qa": 32}

# kvpress's anchors, keyed by RULER family instead of the task name's first word
_QUESTION = {
    "niah": re.compile(r"What (?:is|are all) the special magic"),
    "variable_tracking": re.compile(r"Question: Find all variables that are assigned the value"),
    "common_words_extraction": re.compile(r"Question: What are the 10 most common words in the above list\?"),
    "freq_words_extraction": re.compile(r"Question: Do not provide any explanation\."),
    "qa": re.compile(r"Answer the question based on the given documents\."),
}
_ANSWER = {"niah": re.compile(r"The special magic"), "variable_tracking": re.compile(r"Answer:"),
           "common_words_extraction": re.compile(r"Answer:"), "freq_words_extraction": re.compile(r"Answer:"),
           "qa": re.compile(r"Answer:")}


@dataclass(frozen=True)
class RulerExample:
    """One RULER sample, split.

    Attributes
    ----------
    id
        ``TASK/LENGTH/INDEX`` (LENGTH ``-`` when the file's layout does not give it).
    task, length
        RULER task name; the length the sample was made for (the layout's folder, else ``None``).
    context, question, answer_prefix
        The split ``input`` (see the module docstring).
    outputs
        The gold strings.
    """

    id: str
    task: str
    length: int | None
    context: str
    question: str
    answer_prefix: str
    outputs: tuple[str, ...]

    @property
    def family(self) -> str:
        return TASK_FAMILY[self.task]

    @property
    def tokens_to_generate(self) -> int:
        return TOKENS_TO_GENERATE[self.family]


def split_input(text: str, task: str, where: str = "input") -> tuple[str, str, str]:
    """``(context, question, answer_prefix)`` of a RULER ``input``; they concatenate back to ``text``.

    Raises
    ------
    HeadprobeError
        An unknown task, or an input without the family's question or answer anchor (naming ``where``).
    """
    if task not in TASK_FAMILY:
        raise HeadprobeError(f"{where}: unknown RULER task {task!r}; expected one of {', '.join(TASK_FAMILY)}")
    family = TASK_FAMILY[task]
    questions = list(_QUESTION[family].finditer(text))
    if not questions:
        raise HeadprobeError(f"{where}: no {task} question ({_QUESTION[family].pattern!r}) in the input")
    cut = questions[-1].start()
    answer = _ANSWER[family].search(text, cut)
    if answer is None:
        raise HeadprobeError(f"{where}: no {task} answer prefix ({_ANSWER[family].pattern!r}) after the question")
    return text[:cut], text[cut:answer.start()], text[answer.start():]


def read_task_file(path: Path, task: str, length: int | None, limit: int | None = None) -> list[RulerExample]:
    """The samples of one ``validation.jsonl`` (the first ``limit``); errors name the file, line and field."""
    out: list[RulerExample] = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            if limit is not None and len(out) >= limit:
                break
            where = f"{path}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise HeadprobeError(f"{where}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("input"), str):
                raise HeadprobeError(f"{where}: field 'input': expected a string")
            outputs = row.get("outputs")
            if not isinstance(outputs, list) or not outputs or not all(isinstance(o, str) for o in outputs):
                raise HeadprobeError(f"{where}: field 'outputs': expected a non-empty list of strings")
            context, question, prefix = split_input(row["input"], task, where)
            index = row.get("index", len(out))
            out.append(RulerExample(f"{task}/{length if length is not None else '-'}/{index}", task, length,
                                    context, question, prefix, tuple(outputs)))
    return out


def task_files(folder: Path, tasks: list[str] | None = None) -> list[tuple[str, int | None, Path]]:
    """``(task, length, file)`` of every RULER file under ``folder``: ``TASK/validation.jsonl`` and
    ``LENGTH/TASK/validation.jsonl``, lengths ascending, tasks in RULER's order; only ``tasks`` when given."""
    found = []
    # the two layouts by name, not "**": a recursive glob does not enter linked folders
    for path in (*folder.glob("*/validation.jsonl"), *folder.glob("*/*/validation.jsonl")):
        rel = path.relative_to(folder).parts
        length = int(rel[0]) if len(rel) == 3 and rel[0].isdigit() else None
        if len(rel) in (2, 3) and rel[-2] in TASK_FAMILY and (len(rel) == 2 or length is not None):
            found.append((rel[-2], length, path))
    order = list(TASK_FAMILY)
    found.sort(key=lambda f: (f[1] or 0, order.index(f[0])))
    return [f for f in found if tasks is None or f[0] in tasks]


def load_ruler_dir(folder: str | Path, tasks: list[str] | None = None,
                   limit: int | None = None) -> list[RulerExample]:
    """Every sample of the RULER files under ``folder`` (see :func:`task_files`), split.

    Parameters
    ----------
    tasks
        Read only these tasks; each must have a file.
    limit
        The first ``limit`` samples of each file.

    Raises
    ------
    HeadprobeError
        A folder that does not exist or holds no RULER file, a task asked for without a file, a malformed
        line (file, line and field named).
    """
    root = Path(folder)
    if not root.is_dir():
        raise HeadprobeError(f"--dataset {folder}: expected a folder holding TASK/validation.jsonl (RULER's "
                             "prepare.py output)")
    for t in tasks or []:
        if t not in TASK_FAMILY:
            raise HeadprobeError(f"--ruler-tasks {t}: unknown RULER task; expected one of {', '.join(TASK_FAMILY)}")
    files = task_files(root, tasks)
    missing = sorted(set(tasks or []) - {f[0] for f in files})
    if missing or not files:
        what = ", ".join(missing) if missing else "any task"
        raise HeadprobeError(f"--dataset {folder}: no validation.jsonl for {what} (expected TASK/validation.jsonl "
                             "or LENGTH/TASK/validation.jsonl)")
    examples = [ex for task, length, path in files for ex in read_task_file(path, task, length, limit)]
    if not examples:
        raise HeadprobeError(f"--dataset {folder}: the RULER files hold no sample")
    return examples
