"""Errors that reach a user as one clear line."""

from __future__ import annotations


class HeadprobeError(Exception):
    """A user-facing error: its message is one line that names what is wrong and what was expected.

    The command line prints ``headprobe: error: <message>`` and exits with status 2 (no traceback
    unless ``--debug``). Library callers may catch it like any exception.
    """


class FileFormatError(HeadprobeError):
    """A headprobe file (or an imported file) does not have the expected structure.

    Parameters
    ----------
    path
        The file that was read.
    field
        The JSON field (dotted path) that is wrong, or ``None`` for the file as a whole.
    expected
        What was expected there, in words.
    """

    def __init__(self, path: object, field: str | None, expected: str) -> None:
        where = f"{path}" if field is None else f"{path}: field '{field}'"
        super().__init__(f"{where}: {expected}")
        self.path = str(path)
        self.field = field
        self.expected = expected


class ModelMismatchError(HeadprobeError):
    """A profile or budget file was made for another model than the one it is applied to."""


class NoPassingTrialsError(HeadprobeError):
    """A probe run in which no trial passed the success gate: there is nothing to average."""
