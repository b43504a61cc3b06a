"""Where headprobe finds the data it ships (haystacks, profiles) and where it caches converted models."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def _shipped(name: str) -> Path:
    """``headprobe/_data/<name>`` in an installed wheel, ``<checkout>/<name>`` in a source checkout."""
    installed = _PACKAGE_DIR / "_data" / name
    if installed.is_dir():
        return installed
    return _PACKAGE_DIR.parent / name


def haystacks_dir() -> Path:
    """The shipped haystacks folder (corpus, needle sets, task prompts)."""
    return _shipped("haystacks")


def shipped_profiles_dir() -> Path:
    """The profiles that ship with headprobe."""
    return _shipped("profiles")


def cache_dir() -> Path:
    """User cache (converted models): ``$HEADPROBE_CACHE`` or ``~/.cache/headprobe``."""
    root = os.environ.get("HEADPROBE_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "headprobe"
