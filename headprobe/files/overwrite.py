"""Overwrite protection: an existing output is replaced only when the caller says so."""

from __future__ import annotations

from pathlib import Path

from ..errors import HeadprobeError, param


def check_overwrite(path: str | Path, force: bool, hint: str = "") -> Path:
    """Refuse to replace an existing file (or non-empty folder) unless ``force``.

    Parameters
    ----------
    hint
        Appended to the message, e.g. ``"or choose another out_dir"``.
    """
    path = Path(path)
    if path.exists() and not force and (not path.is_dir() or any(path.iterdir())):
        raise HeadprobeError(f"{path} exists; pass {param('force', True)} to overwrite it{' ' + hint if hint else ''}")
    return path
