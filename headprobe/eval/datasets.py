"""Outside datasets (LongBench-style): any local or hub dataset with context / question / answers fields,
answered under each setting and scored by LongBench's QA token-F1."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError, param
from ..haystack.prompt_format import ANSWER_CUE, plain_question, prompt_format_of
from .answer_scores import answer_text, score_answer
from .cell_log import CellLog, cell_id, cell_record
from .result import EvalResult
from .setting_run import run_setting
from .settings import EvalSetting


@dataclass(frozen=True)
class QAExample:
    """One dataset row: ``context``, ``question``, gold ``answers`` (any one counts)."""

    id: str
    context: str
    question: str
    answers: tuple[str, ...]


def load_qa_dataset(source: Any, split: str = "test", context_field: str = "context",
                    question_field: str = "input", answers_field: str = "answers",
                    limit: int | None = None) -> list[QAExample]:
    """Read a dataset through ``datasets``.

    Parameters
    ----------
    source
        A ``datasets.Dataset``, a local ``.json``/``.jsonl``/``.csv``/``.parquet`` file, a local dataset
        folder, or a hub name.
    split
        The split of a folder or hub dataset (files have one split).
    context_field, question_field, answers_field
        Field names (LongBench: ``context``, ``input``, ``answers``); ``answers`` is a string or a list.
    limit
        Keep the first ``limit`` rows.

    Raises
    ------
    HeadprobeError
        The dataset cannot be read, lacks a field, or has a row with an empty answer list; or the optional
        ``datasets`` package is not installed.
    """
    ds, name = open_dataset(source, split)
    fields = {"context_field": context_field, "question_field": question_field, "answers_field": answers_field}
    missing = {p: f for p, f in fields.items() if f not in ds.column_names}
    if missing:
        spelled = dict.fromkeys(param(p) for p in missing)        # the CLI names all three with one flag
        raise HeadprobeError(f"{param('source', name)}: no field {', '.join(repr(m) for m in missing.values())} "
                             f"(fields: {', '.join(ds.column_names)}); name them with {', '.join(spelled)}")
    rows = ds if limit is None else ds.select(range(min(limit, len(ds))))
    out = []
    for i, row in enumerate(rows):
        ans = row[answers_field]
        answers = (ans,) if isinstance(ans, str) else tuple(str(a) for a in (ans or []))
        if not answers or not any(a.strip() for a in answers):
            raise HeadprobeError(f"{param('source', name)}: row {i}: field {answers_field!r} has no answer")
        out.append(QAExample(str(row.get("_id", row.get("id", i))), str(row[context_field]),
                             str(row[question_field]), answers))
    if not out:
        raise HeadprobeError(f"{param('source', name)}: no rows")
    return out


def open_dataset(source: Any, split: str = "test", what: str = "source") -> tuple[Any, str]:
    """Open a dataset through ``datasets``, offline for local files and folders: ``(dataset, name)``.

    Parameters
    ----------
    source
        A ``datasets.Dataset``, a local ``.json``/``.jsonl``/``.csv``/``.parquet`` file, a local dataset
        folder (``save_to_disk``), or a hub name.
    split
        The split of a folder or hub dataset (files have one split).
    what
        The parameter that named ``source``, for messages.

    Raises
    ------
    HeadprobeError
        The dataset cannot be read (one line), or the optional ``datasets`` package is not installed.
    """
    try:
        import datasets
    except ImportError:
        raise HeadprobeError("reading a dataset (eval --task dataset, tune --task dataset, profile --contexts) "
                             "needs the 'datasets' package, an optional dependency: pip install 'headprobe[eval]'"
                             ) from None

    if isinstance(source, datasets.Dataset):
        return source, "<dataset>"
    path = Path(str(source))
    try:
        if path.is_file():
            kind = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}.get(path.suffix)
            if kind is None:
                raise HeadprobeError(f"{param(what, str(source))}: expected a .json, .jsonl, .csv or "
                                     ".parquet file")
            ds = datasets.load_dataset(kind, data_files=str(path), split="train")
        elif path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise HeadprobeError(f"{param(what, str(source))}: no split {split!r} (splits: "
                                         f"{', '.join(ds)})")
                ds = ds[split]
        else:
            ds = datasets.load_dataset(str(source), split=split)
    except (OSError, ValueError, KeyError, datasets.exceptions.DatasetsError) as exc:
        # datasets raises many kinds; the user needs one line
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HeadprobeError(f"{param(what, str(source))}: cannot load ({msg})") from None
    return ds, str(source)


def qa_prompt_ids(tokenizer: Any, ex: QAExample, max_length: int, chat_template: bool = True) -> list[int]:
    """Prompt token ids; a context too long for ``max_length`` is cut in the middle (LongBench's way).

    Under the chat template the question comes before the answer instruction; the plain form
    (:mod:`headprobe.haystack.prompt_format`) puts the instruction first and ends with the answer cue.
    """
    head = "Read the text below and answer the question.\n\n"
    instruction = "Answer in a short phrase, based on the text above."
    if prompt_format_of(tokenizer, chat_template) == "plain":
        tail = f"\n\n{plain_question(instruction, ex.question)}{ANSWER_CUE}"
    else:
        tail = f"\n\nQuestion: {ex.question}\n{instruction}"

    def render(context: str) -> list[int]:
        text = head + context + tail
        if chat_template and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
            return tokenizer(text, add_special_tokens=False)["input_ids"]
        return tokenizer(text)["input_ids"]

    ids = render(ex.context)
    if len(ids) <= max_length:
        return ids
    ctx = tokenizer(ex.context, add_special_tokens=False)["input_ids"]
    keep = len(ctx) - (len(ids) - max_length) - 2
    while True:     # decoding and re-tokenising the cut may add a token or two: cut more, never the question
        if keep <= 0:
            raise HeadprobeError(f"{param('max_length', max_length)}: too short for the question of row {ex.id}")
        cut = tokenizer.decode(ctx[:keep // 2]) + " ... " + tokenizer.decode(ctx[len(ctx) - keep // 2:])
        ids = render(cut)
        if len(ids) <= max_length:
            return ids
        keep -= len(ids) - max_length


def run_dataset_eval(lm: Any, examples: list[QAExample], settings: list[EvalSetting], out: str | Path,
                     max_length: int = 4000, max_new_tokens: int = 32, dataset_name: str = "<dataset>",
                     chat_template: bool = True, resume: bool = False, force: bool = False,
                     progress: Callable[[int], None] | None = None,
                     figures: Sequence[str | Path] = (), share_prefill: bool = True) -> EvalResult:
    """Answer every example under every setting; one cell per setting (``depth`` null), token-F1 scores.

    The plain prompt form scores the response's first line (:func:`~headprobe.eval.answer_scores.answer_text`;
    the result's task records ``"scored": "first line"``), the chat form the whole response.

    Each answer is generated and measured like a grid trial (:func:`~headprobe.eval.setting_run.run_setting`),
    and the cells are logged the grid's way (:class:`~headprobe.eval.cell_log.CellLog`); a resumed run skips
    the settings already logged. When more than one setting left to run prefills with plain attention (and
    ``share_prefill``), examples are outer and settings inner, and one recorded prompt forward per example
    serves them all (:mod:`headprobe.runtime.shared_prefill`: the same answers and bytes); their cells are
    logged together once every example is answered. Otherwise settings are outer and each cell is logged as
    soon as its setting has answered every example.

    Outputs are handled as in :func:`~headprobe.eval.runner.run_eval` (``figures``: the figures the
    caller draws from the result).

    Raises
    ------
    HeadprobeError
        A setting that does not fit the model or has a question window, a ``max_length`` too short for a
        question, an existing log without ``resume``/``force``, an existing result or figure the run may
        not replace, a log made with other settings, or a log another run writes to.
    """
    from ..limits import check_count
    from .runner import resolve_budgets, shares_prefill

    check_count("max_new_tokens", max_new_tokens)
    check_count("max_length", max_length)
    for s in settings:
        if s.question_window:
            raise HeadprobeError(f"setting {s.label}: window=question needs a prompt whose question the harness "
                                 "placed (the needle, babi or longgen task); give a window in tokens")
    budgets = resolve_budgets(lm, settings)
    prompts = [qa_prompt_ids(lm.tokenizer, ex, max_length, chat_template) for ex in examples]
    form = prompt_format_of(lm.tokenizer, chat_template)
    task = {"kind": "dataset", "dataset": dataset_name, "scorer": "f1", "examples": len(examples),
            "max_length": max_length}
    if form == "plain":     # the answer is the line after the cue (answer_text); the record says so
        task["scored"] = "first line"
    cells = CellLog(lm, out, task, {"lengths": [max_length], "depths": [None]}, settings,
                    {"items": [e.id for e in examples], "max_new_tokens": max_new_tokens, "prompt_format": form},
                    resume=resume, force=force, figures=figures)
    cells.result.extra["prompt_format"] = form
    with cells:
        pending = [s for s in settings if not cells.resumed(cell_id(s, max_length, None))]
        if progress and len(pending) < len(settings):
            progress(len(examples) * (len(settings) - len(pending)))
        if share_prefill and sum(shares_prefill(s) for s in pending) > 1:
            cells.add(_answer_sharing_prefill(lm, examples, prompts, pending, budgets, max_length, max_new_tokens,
                                              form, progress))
        else:
            for s in pending:
                trials = []
                for ex, ids in zip(examples, prompts, strict=True):
                    trials.append(_trial(ex, ids, run_setting(lm, ids, s, budgets[s.label], max_new_tokens), form))
                    if progress:
                        progress(1)
                cells.add([cell_record(s, max_length, None, trials)])
        return cells.finish()


def _trial(ex: QAExample, ids: list[int], run: Any, form: str) -> dict[str, Any]:
    """One example's trial record: the response, its token-F1 against the gold answers, the measurements."""
    return {"item": ex.id, "prompt_len": len(ids), "response": run.text, "gold": list(ex.answers),
            "score": score_answer(answer_text(run.text, form), list(ex.answers), "f1"), **run.measurements()}


def _answer_sharing_prefill(lm: Any, examples: list[QAExample], prompts: list[list[int]],
                            settings: list[EvalSetting], budgets: dict[str, Any], max_length: int,
                            max_new_tokens: int, form: str,
                            progress: Callable[[int], None] | None) -> list[dict[str, Any]]:
    """Every example under every setting, examples outer: one recorded prompt forward per example serves
    the settings that prefill with plain attention. Returns one cell record per setting, in their order."""
    import torch

    from ..runtime import record_prefill
    from .runner import shares_prefill

    trials: dict[str, list[dict[str, Any]]] = {s.label: [] for s in settings}
    for ex, ids in zip(examples, prompts, strict=True):
        prefill = record_prefill(lm, input_ids=torch.tensor([ids]))
        for s in settings:
            run = run_setting(lm, ids, s, budgets[s.label], max_new_tokens,
                              prefill=prefill if shares_prefill(s) else None)
            trials[s.label].append(_trial(ex, ids, run, form))
            if progress:
                progress(1)
        del prefill
    return [cell_record(s, max_length, None, trials[s.label]) for s in settings]
