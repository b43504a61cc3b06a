"""How a forced tune replaces an earlier one: the old outputs stay until the new run's first eval run is logged.

A ``force`` run whose run folder (``<stem>.runs/``) holds an earlier run's eval runs writes its own into a
staging folder beside it, ``<stem>.runs.forced/``. Once its first eval run is logged, the staging folder
takes the run folder's name (the old folder is moved aside and removed) and the old report, budget maps and
figure (the files the old report lists) are removed. Until then the old run is whole (it still resumes), and
an interrupted forced run resumes from the staging folder with ``resume``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError
from ..files.jsonio import read_json

STAGING_SUFFIX = ".forced"


def staging_dir(folder: Path) -> Path:
    """``<stem>.runs.forced``: where a forced run's eval runs go until its first one is logged."""
    return folder.with_name(folder.name + STAGING_SUFFIX)


def _holds_runs(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def start_folder(folder: Path, resume: bool, force: bool, is_main: bool) -> tuple[Path, bool]:
    """The folder a run writes its eval runs to, and whether it is the staging folder.

    With ``force`` and a run folder holding runs: the staging folder (with ``force``, the staging folder of
    an earlier forced run, which never took over, is started over by the main process). With ``resume`` and a staging folder: the
    staging folder (an interrupted forced run goes on). Otherwise the run folder.
    """
    staging = staging_dir(folder)
    if force:
        if is_main and staging.exists():
            shutil.rmtree(staging)
        return (staging, True) if _holds_runs(folder) else (folder, False)
    if resume and staging.is_dir():
        return staging, True
    return folder, False


def _listed_outputs(out: Path) -> list[Path]:
    """The report ``out`` and the files it lists (what the replaced run wrote), when it is a tune report."""
    try:
        report = read_json(out)
    except (HeadprobeError, OSError, ValueError):      # no report, or not one: nothing of the old run to remove
        return []
    if not isinstance(report, dict) or report.get("format") != "headprobe.tune":
        return []
    files = report.get("files") or {}
    names = [n for n in files.values() if isinstance(n, str)] if isinstance(files, dict) else []
    return [out, *(out.parent / n for n in names if not n.endswith(".runs"))]


def take_over(out: str | Path, folder: Path) -> Path:
    """Put the staging folder in place of the run folder ``folder`` and remove the replaced run's report,
    budget maps and figure; returns ``folder``. Called by the main process once the first eval run is logged."""
    staging, aside = staging_dir(folder), folder.with_name(folder.name + ".replaced")
    old = _listed_outputs(Path(out))
    if aside.exists():
        shutil.rmtree(aside)
    if folder.exists():
        os.rename(folder, aside)
    os.rename(staging, folder)
    shutil.rmtree(aside, ignore_errors=True)
    for path in old:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            path.unlink()
    return folder


def finish_staging(ranks: Any, out: str | Path, folder: Path, staged: bool) -> tuple[Path, bool]:
    """After an eval run: the folder the next runs go to, and whether it is still the staging folder (the
    main process takes over; every rank then writes to the run folder)."""
    if not staged:
        return folder, False
    final = folder.with_name(folder.name.removesuffix(STAGING_SUFFIX))
    if ranks.is_main:
        take_over(out, final)
    return final, False


__all__ = ("STAGING_SUFFIX", "finish_staging", "staging_dir", "start_folder", "take_over")
