"""Overwrite protection: an existing output is replaced only when the caller says so."""

from __future__ import annotations

from pathlib import Path

from ..errors import HeadprobeError, param


def check_overwrite(path: str | Path, force: bool) -> Path:
    """Refuse to replace an existing file (or non-empty folder) unless ``force``."""
    path = Path(path)
    if path.exists() and not force and (not path.is_dir() or any(path.iterdir())):
        raise HeadprobeError(f"{path} exists; pass {param('force', True)} to overwrite it")
    return path
