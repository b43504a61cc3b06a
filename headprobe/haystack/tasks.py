"""Task prompts for the layer-retention analysis (single/multi-document QA, summarisation, ...)."""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ..errors import FileFormatError, HeadprobeError, param
from ..files.jsonio import iter_jsonl_objects
from ..paths import haystacks_dir


@dataclass(frozen=True)
class TaskSample:
    """One prompt of a task type.

    Attributes
    ----------
    id
        Unique id, e.g. ``"code-03"``.
    task
        Task type (the file's name): ``single_doc_qa``, ``multi_doc_qa``, ``summarization``,
        ``synthetic_retrieval``, ``code``.
    context
        The long context (code read from the standard library when the file names a source).
    instruction
        Question or instruction placed after the context.
    """

    id: str
    task: str
    context: str
    instruction: str


def tasks_dir() -> Path:
    return haystacks_dir() / "tasks"


def available_tasks(folder: str | Path | None = None) -> list[str]:
    folder = Path(folder) if folder else tasks_dir()
    return sorted(p.stem for p in folder.glob("*.jsonl"))


def load_tasks(tasks: list[str] | None = None, folder: str | Path | None = None,
               samples_per_task: int | None = None) -> dict[str, list[TaskSample]]:
    """Read the task prompt sets, ``{task: [samples]}``.

    Code samples may carry ``"context_source": {"stdlib": "json/decoder.py", "max_chars": 6000}``;
    the context is then read from this Python's standard library at run time.
    """
    folder = Path(folder) if folder else tasks_dir()
    names = tasks or available_tasks(folder)
    out: dict[str, list[TaskSample]] = {}
    for name in names:
        path = folder / f"{name}.jsonl"
        if not path.exists():
            raise HeadprobeError(f"{param('tasks', name)}: no task file {path} "
                                 f"(available: {', '.join(available_tasks(folder))})")
        samples = []
        for where, obj in iter_jsonl_objects(path):
            for key in ("id", "instruction"):
                if not isinstance(obj.get(key), str) or not obj[key]:
                    raise FileFormatError(where, key, "missing or not a non-empty string")
            context = obj.get("context") or ""
            source = obj.get("context_source")
            if source:
                context = _stdlib_source(source, where)
            if not context:
                raise FileFormatError(where, "context", "expected context text or a context_source")
            samples.append(TaskSample(obj["id"], name, context, obj["instruction"]))
            if samples_per_task and len(samples) >= samples_per_task:
                break
        out[name] = samples
    return out


def _stdlib_source(source: dict, where: str) -> str:
    if not isinstance(source, dict) or not isinstance(source.get("stdlib"), str):
        raise FileFormatError(where, "context_source", "expected {\"stdlib\": \"<module path>\"}")
    root = Path(sysconfig.get_paths()["stdlib"])
    path = (root / source["stdlib"]).resolve()
    if root.resolve() not in path.parents or not path.exists():
        raise FileFormatError(where, "context_source.stdlib", f"no standard-library file {source['stdlib']}")
    text = path.read_text(encoding="utf-8")
    limit = source.get("max_chars")
    return text[: int(limit)] if limit else text
