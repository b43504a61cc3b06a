"""Haystack text: the shipped corpus or a user's text file or folder of ``.txt`` files."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import HeadprobeError, param
from ..files.jsonio import read_text
from ..paths import haystacks_dir


@dataclass(frozen=True)
class Haystack:
    """The text needles are hidden in.

    Attributes
    ----------
    name
        ``"headprobe-corpus"`` for the shipped corpus, else the path given.
    text
        The whole text; documents separated by blank lines.
    """

    name: str
    text: str

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:16]


def load_haystack(path: str | Path | None = None) -> Haystack:
    """Read the shipped corpus (``path=None``), a text file, or every ``.txt`` of a folder in name order."""
    if path is None:
        folder = haystacks_dir() / "corpus"
        name = "headprobe-corpus"
    else:
        folder = Path(path)
        name = str(path)
        if folder.is_file():
            return Haystack(name, _read(folder))
        if not folder.exists():
            raise HeadprobeError(f"{param('haystack', str(path))}: no such file or folder")
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise HeadprobeError(f"{folder}: no .txt files to build a haystack from")
    text = "\n\n".join(_read(f).strip() for f in files)
    return Haystack(name, text)


def _read(path: Path) -> str:
    return read_text(path, "haystack text file")
