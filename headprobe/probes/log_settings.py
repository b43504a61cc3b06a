"""How trial logs (and so profiles) record what a run read: files named portably, the shard."""

from __future__ import annotations

import os
from pathlib import Path

from ..paths import haystacks_dir


def portable_file_name(path: str | Path) -> tuple[str, bool]:
    """How files record a file they read: ``(name, shipped)``.

    A file headprobe ships is named by its place among the shipped haystacks (``needles/retrieval.jsonl``);
    a user's file by its path relative to the working directory of the run, so that a profile made on
    one machine names nothing of that machine's folders. Files record the file's fingerprint next to it.
    """
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(haystacks_dir().resolve()).as_posix(), True
    except ValueError:
        pass
    try:
        return Path(os.path.relpath(resolved, Path.cwd().resolve())).as_posix(), False
    except ValueError:   # another drive (Windows)
        return resolved.name, False


def shard_setting(shard: tuple[int, int] | None) -> list[int] | None:
    """A shard as logs record it: ``[i, n]``, or ``None`` for the whole grid."""
    return list(shard) if shard else None
