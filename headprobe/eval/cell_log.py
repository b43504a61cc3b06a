"""The cell log of an eval run and the result JSON kept up to date with it.

A cell is one setting at one (length, depth) of a grid, or one setting over a whole dataset. Finished
cells go to a JSONL cell log beside the result (``<out>.cells.jsonl``, the trial-log format of
:mod:`headprobe.files.trial_log`, one cell a line) and the result JSON is rewritten atomically after
each batch of cells. An interrupted run resumes from its log and never redoes a finished cell.

Nothing an earlier run left is replaced by accident (:func:`check_eval_outputs`): an existing log
needs ``resume`` or ``force``; an existing result or figure needs ``force``, except that a resumed run
rewrites the result its own log made and the figures that result lists. With ``force`` the old log and
result stay as they are until the new run's first cells are logged.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..errors import HeadprobeError
from ..files.jsonio import check_writable_dir
from ..files.overwrite import check_rerun_outputs
from ..files.trial_log import TrialLog, read_log_records
from .result import EvalResult
from .settings import EvalSetting

if TYPE_CHECKING:
    from ..models.loading import LoadedModel


def cell_log_path(out: str | Path) -> Path:
    """``<dir>/<stem>.cells.jsonl`` beside the result JSON ``out``."""
    out = Path(out)
    return out.with_name(out.stem + ".cells.jsonl")


def result_made_by_log(out: str | Path, log: str | Path) -> EvalResult | None:
    """The result at ``out`` when the cell log at ``log`` made it (same model, task and settings), else
    ``None``."""
    out, log = Path(out), Path(log)
    if not (out.is_file() and log.is_file()):
        return None
    try:
        header, _ = read_log_records(log)
        result = EvalResult.load(out)
    except (HeadprobeError, OSError):
        return None
    same = (result.model.get("fingerprint") == header.get("model") and result.task == header.get("task")
            and result.settings == header.get("settings"))
    return result if same else None


def figure_names(out: str | Path, figures: Sequence[str | Path]) -> list[str]:
    """``figures`` as a result records them: relative to the result's folder."""
    folder = Path(out).parent.resolve()
    return [Path(os.path.relpath(Path(f).resolve(), folder)).as_posix() for f in figures]


def check_eval_outputs(out: str | Path, figures: Sequence[str | Path] = (), resume: bool = False,
                       force: bool = False) -> None:
    """Refuse, before any model loads, a run that would replace what an earlier run left.

    Parameters
    ----------
    out
        The result JSON; its cell log is :func:`cell_log_path` of it.
    figures
        The figures the run will write after the grid.
    resume, force
        An existing cell log needs one of them. An existing result or figure needs ``force``, except
        that with ``resume`` the result the log made, and the figures that result lists, are rewritten.

    Raises
    ------
    HeadprobeError
        Naming the file, and the parameter that would allow it.
    """
    out = Path(out)
    check_writable_dir(out.parent if str(out.parent) else Path("."))

    def figures_of_own_result(out: Path, log: Path) -> list[Any] | None:
        own = result_made_by_log(out, log)
        return None if own is None else list(own.extra.get("figures") or [])

    check_rerun_outputs(out, cell_log_path(out), figures, resume, force, figures_of_own_result, "cell log")


def cell_id(setting: EvalSetting, length: int, depth: float | None) -> str:
    """``"<label>|<length>|<depth>"`` (``-`` for no depth): a cell's id in the log."""
    return f"{setting.label}|{length}|{depth:g}" if depth is not None else f"{setting.label}|{length}|-"


def cell_record(setting: EvalSetting, length: int, depth: float | None,
                trials: list[dict[str, Any]]) -> dict[str, Any]:
    """A finished cell: mean score and bytes over its trials, and ms per generated token.

    ``ms_per_token`` is the cell's total wall time over its total ``new_tokens``
    (:func:`headprobe.eval.setting_run.count_new_tokens`).
    """
    n = len(trials)
    tokens = sum(t["new_tokens"] for t in trials)
    return {
        "trial": cell_id(setting, length, depth), "setting": setting.label, "length": length, "depth": depth,
        "accuracy": sum(t["score"] for t in trials) / n, "n": n,
        "cache_bytes": sum(t["cache_bytes"] for t in trials) / n,
        "used_bytes": sum(t["used_bytes"] for t in trials) / n,
        "full_cache_bytes": sum(t["full_cache_bytes"] for t in trials) / n,
        "ms_per_token": 1000.0 * sum(t["seconds"] for t in trials) / max(tokens, 1),
        "trials": trials,
    }


class CellLog:
    """Open (or resume) the cell log beside ``out`` and keep the result JSON ``out`` in step with it.

    Parameters
    ----------
    lm
        The :class:`~headprobe.LoadedModel` (its identity goes into the result, its fingerprint into the log).
    out
        The result JSON path.
    task, grid
        The result's ``task`` and ``grid`` (``{"lengths": [...], "depths": [...]}``).
    settings
        The settings, in run order.
    log_settings
        What a resumed run must share with the one that wrote the log (items, grid, generation options);
        the model fingerprint, the task, the settings and the headprobe version are added here.
    resume, force
        Continue an existing log with the same settings, or start over (the old log and result stay
        until the first new cells are logged).
    figures
        The figures the caller writes from the result; the result lists them (``figures``), so that a
        resumed run may rewrite them.

    Raises
    ------
    HeadprobeError
        An existing output the run may not replace (:func:`check_eval_outputs`), a log made with other
        settings, or a log another run writes to.

    Notes
    -----
    :meth:`finish` closes the log; a run that stops early closes it with :meth:`close` (or uses the
    object as a context manager).
    """

    def __init__(self, lm: LoadedModel, out: str | Path, task: dict[str, Any], grid: dict[str, Any],
                 settings: list[EvalSetting], log_settings: dict[str, Any], resume: bool = False,
                 force: bool = False, figures: Sequence[str | Path] = ()) -> None:
        self.out = Path(out)
        check_eval_outputs(out, figures, resume=resume, force=force)
        #: Whether the next write may replace a result at ``out``: with force, the one its log made when
        #: resumed, and this run's own after its first write (another run's result is refused).
        self._replace = force or (resume and result_made_by_log(out, cell_log_path(out)) is not None)
        header = {"model": lm.identity.fingerprint, "task": task, "settings": [s.to_json() for s in settings],
                  **log_settings, "headprobe_version": __version__}
        self.log = TrialLog(cell_log_path(out), header, resume=resume, force=force)
        extra = {"figures": figure_names(out, figures)} if figures else {}
        self.result = EvalResult(model=lm.identity.to_json(), task=task, grid=grid,
                                 settings=[s.to_json() for s in settings], cells=[],
                                 created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                 headprobe_version=__version__, extra=extra)

    def resumed(self, cell: str) -> bool:
        """Whether the cell ``cell`` (a :func:`cell_id`) is finished in the log; if so it joins the result."""
        if cell not in self.log:
            return False
        self.result.cells.append(self.log.done[cell])
        return True

    def add(self, records: list[dict[str, Any]]) -> None:
        """Append finished cells (:func:`cell_record`) to the log, then rewrite the result JSON."""
        for record in records:
            self.log.append(record)
            self.result.cells.append(record)
        self._save()

    def _save(self) -> None:
        self.result.save(self.out, force=self._replace)
        self._replace = True

    def finish(self) -> EvalResult:
        """Mark the result complete, write it and close the log."""
        self.result.complete = True
        self._save()
        self.log.close()
        return self.result

    def close(self, finished: bool = False) -> None:
        """Close the log (release its lock); see :meth:`TrialLog.close`."""
        self.log.close(finished=finished)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(finished=exc_type is None)
