"""Import any supported file, telling the format from the path."""

from __future__ import annotations

from pathlib import Path

from ..errors import HeadprobeError
from ..models.identity import ModelIdentity
from ..profile import Profile
from .duoattention import TSV_NAME, read_duoattention
from .headkv_json import read_headkv_json

IMPORT_FORMATS = ("headkv", "retrieval_head", "duoattention")


def import_file(path: str | Path, fmt: str | None = None, model: str | ModelIdentity | None = None,
                kind: str | None = None) -> Profile:
    """Import a HeadKV / Retrieval_Head JSON file or a DuoAttention folder (or its TSV) as a profile.

    ``fmt`` is one of :data:`IMPORT_FORMATS`; default: a folder or ``.tsv`` is DuoAttention, a ``.json``
    file HeadKV / Retrieval_Head.
    """
    path = Path(path)
    if not path.exists():
        raise HeadprobeError(f"{path}: no such file or folder")
    if fmt is None:
        fmt = "duoattention" if path.is_dir() or path.suffix == ".tsv" else "headkv"
    if fmt not in IMPORT_FORMATS:
        raise HeadprobeError(f"unknown import format {fmt!r}; choose one of {', '.join(IMPORT_FORMATS)}")
    if fmt == "duoattention":
        if kind not in (None, "retrieval"):
            raise HeadprobeError("a DuoAttention pattern imports as kind retrieval")
        return read_duoattention(path if path.is_dir() or path.name != TSV_NAME else path.parent, model)
    return read_headkv_json(path, model, kind, source=fmt if fmt == "retrieval_head" else None)


__all__ = ("IMPORT_FORMATS", "import_file")
