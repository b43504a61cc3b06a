"""Outside datasets (LongBench-style): any local or hub dataset with context / question / answer fields,
read as ``profile --contexts`` reads its data (:mod:`headprobe.haystack.qa_data`), answered under each
setting and scored by LongBench's QA token-F1."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import HeadprobeError, param
from ..files.trial_log import TrialLog
from ..haystack.prompt_format import prompt_format_of
from ..haystack.qa_data import ContextFields, open_dataset, read_rows  # noqa: F401 (open_dataset: its earlier home)
from ..library_bridges.press_settings import KVPRESS
from ..limits import check_count
from ..runtime.shared_prefill import record_prefill
from .answer_tasks import LongBenchQA, qa_prompt_ids  # noqa: F401 (qa_prompt_ids: its earlier home)
from .cell_log import CellLog, cell_id, cell_record
from .result import EvalResult
from .runner import resolve_budgets, shares_prefill
from .setting_run import run_setting, run_settings
from .settings import EvalSetting

if TYPE_CHECKING:
    from ..models.loading import LoadedModel


@dataclass(frozen=True)
class QAExample:
    """One dataset row: ``context``, ``question``, gold ``answers`` (any one counts)."""

    id: str
    context: str
    question: str
    answers: tuple[str, ...]


def load_qa_dataset(source: Any, split: str | None = None, context_field: str | None = None,
                    question_field: str | None = None, answers_field: str | None = None,
                    limit: int | None = None, fields: ContextFields | str | Mapping[str, str] | None = None
                    ) -> list[QAExample]:
    """Read a dataset through the reader ``profile --contexts`` uses (:func:`~headprobe.haystack.qa_data.read_rows`).

    Parameters
    ----------
    source
        A ``datasets.Dataset``, a local ``.json``/``.jsonl``/``.csv``/``.parquet`` file, a local dataset
        folder, or a hub name.
    split
        The split of a folder or hub dataset holding several; ``None``: its only one (a file is one split).
    context_field, question_field, answers_field
        Field names, the older spelling of ``fields`` (give one or the other). Left out, each role reads
        its default fields, the first the data has: ``context``; ``question``, else ``input``; ``answer``,
        else ``answers`` (so LongBench's files read as they are).
    limit
        Keep the first ``limit`` rows.
    fields
        Field names by role (:class:`~headprobe.haystack.qa_data.ContextFields` or the ``--fields`` text,
        ``context=NAME,question=NAME,answer=NAME[,answer_offset=NAME][,id=NAME]``; ``answers`` is
        ``answer``'s other name).

    Raises
    ------
    HeadprobeError
        Whatever :func:`~headprobe.haystack.qa_data.read_rows` refuses (one line), field names given both
        ways, or the optional ``datasets`` package is not installed.
    """
    old = {"context": context_field, "question": question_field, "answer": answers_field}
    old = {role: name for role, name in old.items() if name is not None}
    if old and fields is not None:
        raise HeadprobeError(f"{param('fields', str(fields))}: give the field names either as fields or as "
                             "context_field, question_field, answers_field, not both")
    data = read_rows(source, old or fields, split, limit, what="source")
    return [QAExample(r.id, r.context, r.question, r.answers) for r in data.rows]


def run_dataset_eval(lm: LoadedModel, examples: list[QAExample], settings: list[EvalSetting], out: str | Path,
                     max_length: int = 4000, max_new_tokens: int = 32, dataset_name: str = "<dataset>",
                     chat_template: bool = True, resume: bool = False, force: bool = False,
                     progress: Callable[[int], None] | None = None,
                     figures: Sequence[str | Path] = (), share_prefill: bool = True,
                     answer_task: Any = None, budgets: Mapping[str, Any] | None = None) -> EvalResult:
    """Answer every example under every setting; one cell per setting (``depth`` null), token-F1 scores.

    ``answer_task`` (:class:`~headprobe.eval.answer_tasks.AnswerTask`) says how examples are prompted, how
    many tokens each may generate and how answers are scored; by default
    :class:`~headprobe.eval.answer_tasks.LongBenchQA` (what follows), RULER's is
    :class:`~headprobe.eval.ruler_task.RulerTask`.

    The plain prompt form scores the response's first line (the task records ``"scored": "first line"``), and
    an answer stops there; the chat form scores the whole response. Each answer is generated and measured like a grid trial (:func:`~headprobe.eval.setting_run.run_setting`),
    and the cells are logged the grid's way (:class:`~headprobe.eval.cell_log.CellLog`); a resumed run skips
    the settings already logged. When more than one setting left to run prefills with plain attention (and
    ``share_prefill``), examples are outer and settings inner, and one recorded prompt forward per example
    serves them all (:mod:`headprobe.runtime.shared_prefill`: the same answers and bytes); their cells are
    logged together once every example is answered. Otherwise settings are outer and each cell is logged as
    soon as its setting has answered every example. Either way each answer is also appended, as it comes,
    to an example log beside the result (:func:`example_log_path`): a run stopped half-way resumes from it
    without answering again what it answered, and the log is removed once every cell is in the cell log.

    Outputs are handled as in :func:`~headprobe.eval.runner.run_eval` (``figures``: the figures the
    caller draws from the result); ``budgets`` are budgets already resolved by setting label (the default
    profile folders), not resolved again.

    Raises
    ------
    HeadprobeError
        A setting that does not fit the model or has a question window, a ``max_length`` too short for a
        question, an existing log without ``resume``/``force``, an existing result or figure the run may
        not replace, a log made with other settings, or a log another run writes to.
    """
    answer_task = answer_task or LongBenchQA()
    _check_request(settings, max_length, max_new_tokens)
    budgets = resolve_budgets(lm, settings, known=budgets)
    prompts = [answer_task.prompt_ids(lm.tokenizer, ex, max_length, chat_template) for ex in examples]
    spans = _question_spans(lm, examples, prompts, settings, answer_task, chat_template)
    form = prompt_format_of(lm.tokenizer, chat_template)
    cells = _dataset_log(lm, out, examples, settings, dataset_name, max_length, max_new_tokens, form, answer_task,
                         resume, force, figures)
    with cells, TrialLog(example_log_path(out), cells.log.settings, resume=resume, force=force) as answered:
        pending = [s for s in settings if not cells.resumed(cell_id(s, max_length, None))]
        if progress and len(pending) < len(settings):
            progress(len(examples) * (len(settings) - len(pending)))
        stop_at_line = answer_task.task_record(form).get("scored") == "first line"
        if share_prefill and sum(shares_prefill(s) for s in pending) > 1:
            cells.add(_answer_sharing_prefill(lm, examples, prompts, pending, budgets, max_length, max_new_tokens,
                                              form, progress, answer_task, spans, answered))
        else:
            for s in pending:
                trials = list(_answers_of(lm, s, budgets[s.label], examples, prompts, spans, answer_task,
                                          max_new_tokens, stop_at_line, progress, form, answered))
                cells.add([cell_record(s, max_length, None, trials)])
        result = cells.finish()
    example_log_path(out).unlink(missing_ok=True)      # every answer is in the cell log now
    return result


def example_log_path(out: str | Path) -> Path:
    """``<dir>/<stem>.examples.jsonl`` beside the result JSON ``out``: the answers of a dataset run not yet
    logged as whole cells, one ``{"trial": "SETTING|EXAMPLE", "answer": TRIAL}`` a line."""
    out = Path(out)
    return out.with_name(out.stem + ".examples.jsonl")


def _answer_id(setting: EvalSetting, ex: QAExample) -> str:
    return f"{setting.label}|{ex.id}"


def _dataset_log(lm: LoadedModel, out: str | Path, examples: list[QAExample], settings: list[EvalSetting],
                 dataset_name: str, max_length: int, max_new_tokens: int, form: str, answer_task: Any,
                 resume: bool, force: bool, figures: Sequence[str | Path]) -> CellLog:
    """The run's :class:`~headprobe.eval.cell_log.CellLog`: the task block (dataset, scorer, what is scored)
    and what a resumed run must share."""
    task = {"kind": "dataset", "dataset": dataset_name, "scorer": "f1", "examples": len(examples),
            "max_length": max_length}
    task.update(answer_task.task_record(form))
    cells = CellLog(lm, out, task, {"lengths": [max_length], "depths": [None]}, settings,
                    {"items": [e.id for e in examples], "max_new_tokens": max_new_tokens, "prompt_format": form},
                    resume=resume, force=force, figures=figures)
    cells.result.extra["prompt_format"] = form
    return cells


def _check_request(settings: list[EvalSetting], max_length: int, max_new_tokens: int) -> None:
    """Refuse a count below one and a question window (a dataset's prompt does not say where its question
    is)."""
    check_count("max_new_tokens", max_new_tokens)
    check_count("max_length", max_length)
    for s in settings:
        if s.question_window:
            raise HeadprobeError(f"setting {s.label}: window=question needs a prompt whose question the harness "
                                 "placed (the needle, babi or longgen task); give a window in tokens")


def _answers_of(lm: LoadedModel, setting: EvalSetting, budget: Any, examples: list[QAExample], prompts: list[list[int]],
                spans: list[tuple[int, int] | None], answer_task: Any, max_new_tokens: int, stop_at_line: bool,
                progress: Callable[[int], None] | None, form: str, answered: TrialLog) -> Iterator[dict[str, Any]]:
    """Each example's trial under one setting alone (prompt forward included), taken from ``answered`` when
    it is there and appended to it when it is new."""
    for ex, ids, span in zip(examples, prompts, spans, strict=True):
        if _answer_id(setting, ex) not in answered:
            run = run_setting(lm, ids, setting, budget, answer_task.new_tokens(ex, max_new_tokens),
                              question_span=span, stop_at_line=stop_at_line)
            answered.append({"trial": _answer_id(setting, ex), "answer": _trial(ex, ids, run, form, answer_task)})
        if progress:
            progress(1)
        yield answered.done[_answer_id(setting, ex)]["answer"]


def _question_spans(lm: LoadedModel, examples: list[Any], prompts: list[list[int]], settings: list[EvalSetting],
                    answer_task: Any, chat_template: bool) -> list[tuple[int, int] | None]:
    """Per example, the ``(start, end)`` token positions of its question, when a kvpress setting needs them
    (kvpress compresses the context before the question); ``None`` otherwise.

    Raises
    ------
    HeadprobeError
        A kvpress setting under an answer task that does not say where its question starts.
    """
    press = next((s for s in settings if s.policy == KVPRESS), None)
    if press is None:
        return [None] * len(examples)
    if not hasattr(answer_task, "question_span"):
        raise HeadprobeError(f"setting {press.label}: kvpress settings run where the prompt's question is known "
                             "(--task ruler, needle, babi); this dataset's prompt does not mark it")
    return [answer_task.question_span(lm.tokenizer, ex, ids, chat_template)
            for ex, ids in zip(examples, prompts, strict=True)]


def _trial(ex: QAExample, ids: list[int], run: Any, form: str, answer_task: Any) -> dict[str, Any]:
    """One example's trial record: the response, its score against the gold answers (``answer_task``'s
    fields), the measurements."""
    return {"item": ex.id, "prompt_len": len(ids), **answer_task.trial(ex, run.text, form), **run.measurements()}


def _answer_sharing_prefill(lm: LoadedModel, examples: list[QAExample], prompts: list[list[int]],
                            settings: list[EvalSetting], budgets: dict[str, Any], max_length: int,
                            max_new_tokens: int, form: str,
                            progress: Callable[[int], None] | None, answer_task: Any,
                            spans: list[tuple[int, int] | None], answered: TrialLog) -> list[dict[str, Any]]:
    """Every example under every setting, examples outer: one recorded prompt forward per example serves
    the settings that prefill with plain attention; answers already in ``answered`` are taken from it, new
    ones appended to it. Returns one cell record per setting, in their order."""
    trials: dict[str, list[dict[str, Any]]] = {s.label: [] for s in settings}
    stop_at_line = answer_task.task_record(form).get("scored") == "first line"
    for ex, ids, span in zip(examples, prompts, spans, strict=True):
        todo = [s for s in settings if _answer_id(s, ex) not in answered]
        runs = {}
        if todo:
            prefill = record_prefill(lm, input_ids=torch.tensor([ids]))
            runs = dict(zip([s.label for s in todo], run_settings(
                lm, ids, [(s, budgets[s.label]) for s in todo], answer_task.new_tokens(ex, max_new_tokens), prefill,
                span, stop_at_line=stop_at_line), strict=True))
            del prefill
        for s in settings:
            if s.label in runs:
                answered.append({"trial": _answer_id(s, ex), "answer": _trial(ex, ids, runs[s.label], form,
                                                                             answer_task)})
            trials[s.label].append(answered.done[_answer_id(s, ex)]["answer"])
            if progress:
                progress(1)
    return [cell_record(s, max_length, None, trials[s.label]) for s in settings]
