"""Where headprobe finds the data it ships (haystacks, profiles), where a user's profiles go, and where it
caches converted models."""

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


def data_dir() -> Path:
    """The user's headprobe data: ``$HEADPROBE_DATA``, else ``$XDG_DATA_HOME/headprobe``, else
    ``~/.local/share/headprobe``."""
    root = os.environ.get("HEADPROBE_DATA")
    if root:
        return Path(root)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "headprobe"


def user_profiles_dir() -> Path:
    """Where the user's profiles and trial logs go by default: ``data_dir()/profiles``.

    Never the shipped profiles' folder, so a run cannot replace a shipped profile by default, and the
    same from any working directory, so ``allocate`` finds what ``profile`` wrote wherever it runs.
    """
    return data_dir() / "profiles"


def cache_dir() -> Path:
    """User cache (converted models): ``$HEADPROBE_CACHE`` or ``~/.cache/headprobe``."""
    root = os.environ.get("HEADPROBE_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "headprobe"
