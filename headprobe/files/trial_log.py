"""Trial logs: JSONL, one finished trial a line, appended and flushed as each trial completes.

The first line is a header ``{"format": "headprobe.trials", "version": 1, "settings": {...}}``. A run
that is interrupted (Ctrl-C, a crash, a killed machine) leaves every finished trial on disk; resuming
reads the log, drops a torn last line, checks that the settings match and skips the finished trials.

Nothing is written before the first trial finishes: a run that fails before then leaves no log (or, when
it was to replace one, the old log as it was). The new log's header and first trial then replace the
old log in one rename. While a log is open, :class:`~headprobe.files.log_lock.LogLock` keeps every other
run from writing to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import FileFormatError, HeadprobeError, param
from .atomic import write_file_atomically
from .jsonio import check_log_header, read_text
from .log_lock import LogLock

LOG_FORMAT = "headprobe.trials"
LOG_VERSION = 1

#: Settings that may change between an interrupted run and its resumption (and between shards).
_RESUME_FREE = {"batch_size", "shard", "device", "headprobe_version"}
#: Keys of a file reference (``{"path", "fingerprint", ...}``) that say where the file was, not what it held.
_LOCATION_KEYS = {"path", "name", "shipped"}


def read_log_records(path: str | Path) -> tuple[dict[str, Any], list[tuple[int, dict[str, Any]]]]:
    """Read a trial log: ``(settings, [(line number, trial), ...])``. A torn last line is ignored.

    Raises
    ------
    HeadprobeError
        No such file.
    FileFormatError
        No header, a newer format version, a line that is not JSON (other than a torn last one), or a
        trial without an id, naming the file and line.
    """
    path = Path(path)
    lines = read_text(path, "trial log").split("\n")
    records: list[tuple[int, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            if number >= len(lines) - 1:  # torn last line of an interrupted write
                break
            raise FileFormatError(f"{path}:{number}", None, f"not valid JSON ({exc.msg})") from exc
        except RecursionError:
            raise FileFormatError(f"{path}:{number}", None, "JSON nested too deeply to read") from None
    settings = check_log_header(path, records[0][1] if records else None, LOG_FORMAT, LOG_VERSION)
    for number, trial in records[1:]:
        if not isinstance(trial, dict):
            raise FileFormatError(f"{path}:{number}", None,
                                  f"expected a trial object, found {type(trial).__name__}")
        if not isinstance(trial.get("trial"), str):
            raise FileFormatError(f"{path}:{number}", "trial", "missing trial id (expected a string)")
    return settings, records[1:]


def read_log(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Read a trial log: ``(settings, trials)``. A torn (incomplete) last line is ignored."""
    settings, records = read_log_records(path)
    return settings, [r for _, r in records]


def settings_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The settings two runs must share but do not, sorted by name.

    Settings in ``_RESUME_FREE`` may differ; a file reference (an object with a ``fingerprint``) is
    compared by what the file held, not by where it lay, so a log made in another folder or on another
    machine with the same needle file still matches.
    """
    def comparable(value: Any) -> Any:
        if isinstance(value, dict):
            located = "fingerprint" in value
            return {k: comparable(v) for k, v in value.items() if not (located and k in _LOCATION_KEYS)}
        if isinstance(value, list):
            return [comparable(v) for v in value]
        return value

    return sorted(k for k in set(old) | set(new)
                  if k not in _RESUME_FREE and comparable(old.get(k)) != comparable(new.get(k)))


class TrialLog:
    """Append-only trial log, locked against other writers while open.

    Parameters
    ----------
    path
        The JSONL file.
    settings
        The run's settings; written in the header, compared on resume.
    resume
        Continue an existing log (its settings must match) instead of refusing to overwrite it.
    force
        Start over, replacing an existing log. The old log stays as it is until the first trial of the
        new run is appended.

    Raises
    ------
    HeadprobeError
        An existing log without ``resume`` or ``force``, a log made with other settings, or a log that
        another run holds open.

    Notes
    -----
    Close the log (:meth:`close`, or use it as a context manager) when the run ends: that releases the
    lock and, for a run that finished without a single trial, writes the header alone.
    """

    def __init__(self, path: str | Path, settings: dict[str, Any], resume: bool = False, force: bool = False):
        self.path = Path(path)
        self.settings = settings
        self.done: dict[str, dict[str, Any]] = {}
        #: ``"file:line"`` of each trial read from an existing log (for messages about it).
        self.where: dict[str, str] = {}
        continuing = self.path.exists() and not force
        if continuing:
            if not resume:
                raise HeadprobeError(
                    f"{self.path}: a trial log already exists; pass {param('resume', True)} to continue it or "
                    f"{param('force', True)} to start over"
                )
            self._check_settings(read_log_records(self.path)[0])
        self._lock = LogLock(self.path)
        try:
            self._on_disk = False
            if continuing:
                old_settings, numbered = read_log_records(self.path)   # again, now that no one else writes
                self._check_settings(old_settings)
                kept = self._dedupe(numbered)
                trials = [t for _, t in kept]
                if self._rewrite_clean(old_settings, trials):
                    kept = [(i, t) for i, t in enumerate(trials, start=2)]
                self.done = {t["trial"]: t for t in trials}
                self.where = {t["trial"]: f"{self.path}:{number}" for number, t in kept}
                self._on_disk = True
        except BaseException:
            self._lock.release()
            raise

    def _check_settings(self, old_settings: dict[str, Any]) -> None:
        diff = settings_diff(old_settings, self.settings)
        if diff:
            raise HeadprobeError(
                f"{self.path}: cannot resume, the log was made with other settings ({', '.join(diff)}); "
                f"write the log elsewhere or pass {param('force', True)} to start over"
            )

    def _dedupe(self, numbered: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, dict[str, Any]]]:
        """The first record of each trial id; a log written by two runs at once held some twice."""
        first: dict[str, tuple[int, dict[str, Any]]] = {}
        for number, t in numbered:
            first.setdefault(t["trial"], (number, t))
        dropped = len(numbered) - len(first)
        if dropped:
            warnings.warn(f"{self.path}: {dropped} duplicate trial record(s) dropped (the first record of each "
                          "trial is kept)", RuntimeWarning, stacklevel=4)
        return list(first.values())

    def _replace_with(self, lines: list[str]) -> None:
        """Write ``lines`` to a new file beside the log and rename it onto the log (the old log stays as it
        was if that fails: ``LOG: cannot write (No space left on device)``)."""
        data = "".join(lines).encode("utf-8")
        write_file_atomically(self.path, lambda handle: handle.write(data), overwrite=True)

    def _header_line(self, settings: dict[str, Any]) -> str:
        return _line({"format": LOG_FORMAT, "version": LOG_VERSION, "settings": settings})

    def _rewrite_clean(self, settings: dict[str, Any], trials: list[dict[str, Any]]) -> bool:
        """Drop a torn last line (and duplicate records) so appends start on a fresh line; whether it did."""
        text = self.path.read_text(encoding="utf-8")
        if text and not text.endswith("\n") or text.count("\n") != len(trials) + 1:
            self._replace_with([self._header_line(settings)] + [_line(t) for t in trials])
            return True
        return False

    def append(self, record: dict[str, Any]) -> None:
        """Append one finished trial and flush it to disk (the first one also writes the header)."""
        if not self._lock.held:
            raise HeadprobeError(f"{self.path}: the log is closed")
        if not self._on_disk:
            self._replace_with([self._header_line(self.settings), _line(record)])
            self._on_disk = True
        else:
            _append_whole(self.path, _line(record).encode("utf-8"))
        self.done[record["trial"]] = record

    def close(self, finished: bool = True) -> None:
        """Release the lock. ``finished``: the run ended normally, so a log still without a trial is
        written with its header alone (a run that failed leaves no log, or the old one)."""
        if not self._lock.held:
            return
        try:
            if finished and not self._on_disk:
                self._replace_with([self._header_line(self.settings)])
                self._on_disk = True
        finally:
            self._lock.release()

    def __enter__(self):  # -> Self (typing.Self needs Python 3.11)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(finished=exc_type is None)

    def __contains__(self, trial_id: str) -> bool:
        return trial_id in self.done

    def records(self) -> Iterator[dict[str, Any]]:
        return iter(self.done.values())


def _append_whole(path: Path, data: bytes) -> None:
    """Append ``data`` (one line) to ``path`` and flush it to disk, or leave the file as it was.

    A write that fails part-way (a full disk) is cut back to the file's previous end, so no torn line is
    left for a resumed run to drop.

    Raises
    ------
    HeadprobeError
        ``LOG: cannot write (No space left on device)``.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError as exc:
        raise HeadprobeError(f"{path}: cannot write ({exc.strerror})") from exc
    try:
        end = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException as exc:      # a full disk, or Ctrl-C between two writes of the line
            with contextlib.suppress(OSError):
                os.ftruncate(fd, end)
            if isinstance(exc, OSError):
                raise HeadprobeError(f"{path}: cannot write ({exc.strerror})") from exc
            raise
    finally:
        os.close(fd)


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"
