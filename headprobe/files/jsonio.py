"""Atomic JSON writing and validated reading of headprobe's self-describing files.

Every headprobe file is a JSON object with ``format`` (e.g. ``"headprobe.profile"``) and ``version``
(an integer). Files are written whole (:mod:`headprobe.files.atomic`): a temporary file in the same
folder, put in place in one step, so a reader never sees half a file and an interrupted write never
destroys the previous one.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import FileFormatError, HeadprobeError
from .atomic import (  # noqa: F401  (re-exported: the writers' historical home)
    atomic_write_text,
    blocking_file,
    create_temp_beside,
    make_output_dir,
    write_file_atomically,
    write_folder_atomically,
)


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1, overwrite: bool = True,
                      hint: str = "") -> Path:
    """Serialise ``obj`` as UTF-8 JSON (no NaN allowed) and write it whole (:func:`atomic_write_text`);
    ``overwrite=False`` refuses a file that exists when it is put in place."""
    text = json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=False)
    return atomic_write_text(path, text + "\n", overwrite=overwrite, hint=hint)


def check_writable_dir(path: str | os.PathLike) -> Path:
    """Check, before any work starts, that files can be written in the folder ``path``.

    A folder that does not exist yet is not created (it is made when its first file is written, so a
    run that fails before then leaves no empty folder behind): its nearest existing parent must be a
    folder in which one can be created.

    Raises
    ------
    HeadprobeError
        A part of the path is a file, or the folder (or the parent it would be made in) is not writable.
    """
    path = Path(path) if str(path) else Path(".")
    blocking = blocking_file(path)
    if blocking is not None:
        raise HeadprobeError(f"{path}: output directory is not writable ({blocking} is a file, not a folder)")
    for attempt in range(3):        # another process (a torchrun rank) may remove an empty folder meanwhile
        existing = next(p for p in (path, *path.parents, Path(".")) if p.exists())
        try:
            fd, tmp = tempfile.mkstemp(prefix=".headprobe-write-test.", dir=existing)
            os.close(fd)
            os.unlink(tmp)
            return path
        except FileNotFoundError:
            if attempt == 2:
                raise HeadprobeError(f"{path}: output directory is not writable (it keeps disappearing)") from None
        except OSError as exc:
            where = path if existing == path else f"{path} (in {existing})"
            raise HeadprobeError(f"{where}: output directory is not writable ({exc.strerror})") from exc
    return path


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """The text of a UTF-8 file, with a one-line error for a missing file, a folder, a file that cannot be
    read or one that is not UTF-8.

    Parameters
    ----------
    what
        What the file should be, for the messages (``"needle file"``, ``"trial log"``).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise HeadprobeError(f"{path}: no such {what}") from exc
    except IsADirectoryError as exc:
        raise HeadprobeError(f"{path}: is a folder; expected a {what}") from exc
    except OSError as exc:
        raise HeadprobeError(f"{path}: cannot read the {what} ({exc.strerror})") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileFormatError(path, None, f"expected UTF-8 text; byte {exc.start} (0x{data[exc.start]:02x}) "
                                          "is not valid UTF-8") from exc


def parse_json(text: str, where: object) -> Any:
    """``json.loads`` with one-line errors naming ``where``: a syntax error, or nesting too deep to read."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FileFormatError(where, None, f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") \
            from None
    except RecursionError:
        raise FileFormatError(where, None, "JSON nested too deeply to read (no headprobe file nests more than a "
                                           "few levels)") from None


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    """Read a JSON file, turning a missing, unreadable or non-UTF-8 file and a syntax error into one line."""
    return parse_json(read_text(path, what), Path(path))


def read_headprobe_file(path: str | os.PathLike, fmt: str, max_version: int) -> dict:
    """Read a headprobe JSON file and check its ``format`` and ``version``.

    Raises
    ------
    FileFormatError
        If the file is not an object of that format, or comes from a newer format version than this
        headprobe understands.
    """
    obj = read_json(path)
    if not isinstance(obj, dict):
        raise FileFormatError(path, None, f"expected a JSON object of format '{fmt}'")
    if obj.get("format") != fmt:
        raise FileFormatError(path, "format", f"expected '{fmt}', found {obj.get('format')!r}")
    version = obj.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise FileFormatError(path, "version", f"expected an integer, found {version!r}")
    if version > max_version:
        raise FileFormatError(
            path, "version",
            f"format version {version} is newer than this headprobe reads (up to {max_version}); upgrade headprobe",
        )
    return obj


def check_log_header(path: object, header: Any, fmt: str = "headprobe.trials", max_version: int = 1) -> dict:
    """Check the first line of a JSONL log: ``{"format": fmt, "version": int, "settings": {...}}``.

    Returns
    -------
    dict
        The header's ``settings``.

    Raises
    ------
    FileFormatError
        Naming the field that is missing or of the wrong type, or a version newer than ``max_version``.
    """
    if not isinstance(header, dict) or header.get("format") != fmt:
        raise FileFormatError(path, "format", f"expected a '{fmt}' header on the first line")
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FileFormatError(path, "version", f"expected a positive integer, found {version!r}")
    if version > max_version:
        raise FileFormatError(path, "version", f"newer than this headprobe reads (up to {max_version})")
    settings = header.get("settings")
    if not isinstance(settings, dict):
        raise FileFormatError(path, "settings", f"expected an object, found {type(settings).__name__}")
    return settings


def fingerprint(obj: Any, length: int = 16) -> str:
    """A short stable hash of a JSON-serialisable object (sorted keys), e.g. for model identities."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def file_fingerprint(path: str | os.PathLike, length: int = 16) -> str:
    """A short sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:length]


# ---- small validators shared by the file readers -------------------------------------------------

def require(obj: dict, key: str, kind: type | tuple, path: object, prefix: str = "") -> Any:
    """Return ``obj[key]``, raising a one-line :class:`FileFormatError` if missing or of the wrong type."""
    name = f"{prefix}{key}"
    if key not in obj:
        raise FileFormatError(path, name, "missing")
    value = obj[key]
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise FileFormatError(path, name, f"expected {_kind_name(kind)}, found a boolean")
    if not isinstance(value, kind):
        raise FileFormatError(path, name, f"expected {_kind_name(kind)}, found {type(value).__name__}")
    return value


def require_matrix(value: Any, rows: int, cols: int, path: object, name: str,
                   integer: bool = False, maximum: float | None = None) -> list[list[float]]:
    """Check that ``value`` is a ``rows × cols`` list of finite numbers (integers with ``integer``), each at
    most ``maximum`` when given."""
    if not isinstance(value, list) or len(value) != rows:
        found = len(value) if isinstance(value, list) else type(value).__name__
        raise FileFormatError(path, name, f"expected {rows} rows (one per layer), found {found}")
    for i, row in enumerate(value):
        if not isinstance(row, list) or len(row) != cols:
            found = len(row) if isinstance(row, list) else type(row).__name__
            raise FileFormatError(path, f"{name}[{i}]", f"expected {cols} values, found {found}")
        for j, x in enumerate(row):
            ok = isinstance(x, int) if integer else isinstance(x, (int, float))
            if isinstance(x, bool) or not ok or (isinstance(x, float) and not math.isfinite(x)):
                what = "an integer" if integer else "a finite number"
                raise FileFormatError(path, f"{name}[{i}][{j}]", f"expected {what}, found {x!r}")
            if maximum is not None and x > maximum:
                raise FileFormatError(path, f"{name}[{i}][{j}]", f"expected at most {maximum}, found {x!r}")
    return value


def _kind_name(kind: type | tuple) -> str:
    names = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number"}
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, k.__name__) for k in kind)
    return names.get(kind, kind.__name__)


def iter_jsonl_objects(path: str | os.PathLike, text: str | None = None):
    """Yield ``(where, obj)`` for each non-blank line of a JSONL file, ``where`` being ``"file:line"``.

    Raises
    ------
    FileFormatError
        Naming the line, for a line that is not JSON or not a JSON object.
    """
    if text is None:
        text = read_text(path)
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise FileFormatError(where, None, f"not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise FileFormatError(where, None, "JSON nested too deeply to read") from None
        if not isinstance(obj, dict):
            raise FileFormatError(where, None, "expected one JSON object a line")
        yield where, obj
