"""Overwrite protection: an existing output is replaced only when the caller says so."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError, param
from .atomic import dangling_link, dangling_message, exists_message
from .log_lock import LogLock


def check_overwrite(path: str | Path, force: bool, hint: str = "") -> Path:
    """Refuse to replace an existing file (or non-empty folder) unless ``force``.

    Parameters
    ----------
    hint
        Appended to the message, e.g. ``"or choose another out_dir"``.
    """
    path = Path(path)
    if not force and dangling_link(path):
        raise HeadprobeError(dangling_message(path, hint))
    if path.exists() and not force and (not path.is_dir() or any(path.iterdir())):
        raise HeadprobeError(exists_message(path, hint))
    return path


def check_rerun_outputs(out: str | Path, log: str | Path, figures: Iterable[str | Path], resume: bool, force: bool,
                        made_by_log: Callable[[Path, Path], list[Any] | None], log_kind: str = "log") -> None:
    """Refuse, before any model loads, a run that would replace what an earlier run of it left.

    An existing ``log`` needs ``resume`` or ``force``, and one that another run holds is refused. An
    existing result ``out`` or figure needs ``force``, except that with ``resume`` the result the log made
    and the figures it lists are rewritten: ``made_by_log(out, log)`` returns those figures (paths
    relative to the result's folder) when the log made the result, else ``None``.

    Raises
    ------
    HeadprobeError
        Naming the file, and the parameter that would allow it.
    """
    out, log = Path(out), Path(log)
    if log.exists() and not (resume or force):
        raise HeadprobeError(f"{log}: a {log_kind} already exists; pass {param('resume', True)} to continue it or "
                             f"{param('force', True)} to start over")
    LogLock(log).release()        # refused here if another run writes to the log
    if force:
        return
    listed = made_by_log(out, log) if resume else None
    if listed is None:
        check_overwrite(out, False, hint="or write elsewhere" + (f" (it was not made from {log})" if resume else ""))
    mine = {(out.parent / f).resolve() for f in listed or [] if isinstance(f, str)}
    for figure in figures:
        if Path(figure).resolve() not in mine:
            check_overwrite(figure, False, hint="or write the figure elsewhere")
