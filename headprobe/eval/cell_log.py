"""The cell log of an eval run and the result JSON kept up to date with it.

A cell is one setting at one (length, depth) of a grid, or one setting over a whole dataset. Finished
cells go to a JSONL cell log beside the result (``<out>.cells.jsonl``, the trial-log format of
:mod:`headprobe.files.trial_log`, one cell a line) and the result JSON is rewritten atomically after
each batch of cells. An interrupted run resumes from its log and never redoes a finished cell.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..files.trial_log import TrialLog
from .result import EvalResult
from .settings import EvalSetting


def cell_log_path(out: str | Path) -> Path:
    """``<dir>/<stem>.cells.jsonl`` beside the result JSON ``out``."""
    out = Path(out)
    return out.with_name(out.stem + ".cells.jsonl")


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
        Continue an existing log with the same settings, or start over.

    Raises
    ------
    HeadprobeError
        A log exists and neither ``resume`` nor ``force`` is given, or it was made with other settings.
    """

    def __init__(self, lm: Any, out: str | Path, task: dict[str, Any], grid: dict[str, Any],
                 settings: list[EvalSetting], log_settings: dict[str, Any], resume: bool = False,
                 force: bool = False) -> None:
        from .. import __version__

        self.out = Path(out)
        header = {"model": lm.identity.fingerprint, "task": task, "settings": [s.to_json() for s in settings],
                  **log_settings, "headprobe_version": __version__}
        self.log = TrialLog(cell_log_path(out), header, resume=resume, force=force)
        self.result = EvalResult(model=lm.identity.to_json(), task=task, grid=grid,
                                 settings=[s.to_json() for s in settings], cells=[],
                                 created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                 headprobe_version=__version__)

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
        self.result.save(self.out)

    def finish(self) -> EvalResult:
        """Mark the result complete and write it."""
        self.result.complete = True
        self.result.save(self.out)
        return self.result
