"""Errors that reach a user as one clear line, and how those lines name parameters.

The library names its parameters the way a Python caller passes them (``lengths=20``); the command line
names the same parameters as flags (``--lengths 20``). Messages spell a parameter with :func:`param`,
which follows the spelling active where the error is raised: the library's by default, the flags' inside
:func:`flag_spelling` (which the CLI enters once, with its table of parameter → flag names).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping

_UNSET = object()
_FLAGS: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("headprobe_flags", default=None)


def param(name: str, value: object = _UNSET) -> str:
    """How an error message names the parameter ``name`` (with ``value`` when given).

    Examples
    --------
    >>> param("lengths", 20), param("force", True), param("prompt_len")
    ('lengths=20', 'force=True', 'prompt_len')
    >>> with flag_spelling({"prompt_len": "--prompt-len"}):
    ...     param("lengths", 20), param("force", True), param("prompt_len"), param("chat_template", False)
    ('--lengths 20', '--force', '--prompt-len', '--no-chat-template')

    A ``False`` switch is spelled as its ``--no-`` flag on the command line.
    """
    flags = _FLAGS.get()
    if flags is None:
        return name if value is _UNSET else f"{name}={value!r}" if isinstance(value, str) else f"{name}={value}"
    flag = flags.get(name, "--" + name.replace("_", "-"))
    if value is _UNSET or value is True:
        return flag
    if value is False:
        return flags.get(f"{name}=False", "--no-" + flag.removeprefix("--"))
    return f"{flag} {value}"


@contextlib.contextmanager
def flag_spelling(flags: Mapping[str, str]) -> Iterator[None]:
    """Inside the block, :func:`param` spells parameters as command-line flags.

    Parameters
    ----------
    flags
        Parameter name → flag, for the parameters whose flag is not ``--`` + the name with dashes.
    """
    token = _FLAGS.set(dict(flags))
    try:
        yield
    finally:
        _FLAGS.reset(token)


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
