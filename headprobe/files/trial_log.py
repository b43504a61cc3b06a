"""Trial logs: JSONL, one finished trial a line, appended and flushed as each trial completes.

The first line is a header ``{"format": "headprobe.trials", "version": 1, "settings": {...}}``. A run
that is interrupted (Ctrl-C, a crash, a killed machine) leaves every finished trial on disk; resuming
reads the log, drops a torn last line, checks that the settings match and skips the finished trials.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonlines

from ..errors import FileFormatError, HeadprobeError, param
from .jsonio import check_log_header, read_text

LOG_FORMAT = "headprobe.trials"
LOG_VERSION = 1


def read_log(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Read a trial log: ``(settings, trials)``. A torn (incomplete) last line is ignored."""
    path = Path(path)
    lines = read_text(path, "trial log").split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number >= len(lines) - 1:  # torn last line of an interrupted write
                break
            raise FileFormatError(f"{path}:{number}", None, f"not valid JSON ({exc.msg})") from exc
        except RecursionError:
            raise FileFormatError(f"{path}:{number}", None, "JSON nested too deeply to read") from None
    settings = check_log_header(path, records[0] if records else None, LOG_FORMAT, LOG_VERSION)
    trials = records[1:]
    for i, trial in enumerate(trials, start=2):
        if not isinstance(trial, dict):
            raise FileFormatError(f"{path}:{i}", None, f"expected a trial object, found {type(trial).__name__}")
        if not isinstance(trial.get("trial"), str):
            raise FileFormatError(f"{path}:{i}", "trial", "missing trial id (expected a string)")
    return settings, trials


class TrialLog:
    """Append-only trial log.

    Parameters
    ----------
    path
        The JSONL file.
    settings
        The run's settings; written in the header, compared on resume.
    resume
        Continue an existing log (its settings must match) instead of refusing to overwrite it.
    force
        Start over, replacing an existing log.
    """

    def __init__(self, path: str | Path, settings: dict[str, Any], resume: bool = False, force: bool = False):
        self.path = Path(path)
        self.settings = settings
        self.done: dict[str, dict[str, Any]] = {}
        if self.path.exists() and not force:
            if not resume:
                raise HeadprobeError(
                    f"{self.path}: a trial log already exists; pass {param('resume', True)} to continue it or "
                    f"{param('force', True)} to start over"
                )
            old_settings, trials = read_log(self.path)
            diff = sorted(k for k in set(old_settings) | set(settings)
                          if k not in _RESUME_FREE and old_settings.get(k) != settings.get(k))
            if diff:
                raise HeadprobeError(
                    f"{self.path}: cannot resume, the log was made with other settings ({', '.join(diff)}); "
                    f"write the log elsewhere or pass {param('force', True)} to start over"
                )
            self._rewrite_clean(old_settings, trials)
            self.done = {t["trial"]: t for t in trials}
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with jsonlines.open(self.path, mode="w") as writer:
                writer.write({"format": LOG_FORMAT, "version": LOG_VERSION, "settings": settings})

    def _rewrite_clean(self, settings: dict[str, Any], trials: list[dict[str, Any]]) -> None:
        """Drop a torn last line so appends start on a fresh line."""
        text = self.path.read_text(encoding="utf-8")
        if text and not text.endswith("\n") or text.count("\n") != len(trials) + 1:
            tmp = self.path.with_suffix(self.path.suffix + ".tmp")
            with jsonlines.open(tmp, mode="w") as writer:
                writer.write({"format": LOG_FORMAT, "version": LOG_VERSION, "settings": settings})
                writer.write_all(trials)
            os.replace(tmp, self.path)

    def append(self, record: dict[str, Any]) -> None:
        """Append one finished trial and flush it to disk."""
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.done[record["trial"]] = record

    def __contains__(self, trial_id: str) -> bool:
        return trial_id in self.done

    def records(self) -> Iterator[dict[str, Any]]:
        return iter(self.done.values())


#: Settings that may change between an interrupted run and its resumption.
_RESUME_FREE = {"batch_size", "shard", "device", "headprobe_version"}
