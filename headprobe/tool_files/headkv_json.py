"""HeadKV / Retrieval_Head score files: one-line JSON ``{"<layer>-<queryhead>": [score, ...], ...}``.

Every query head of every layer is present, in layer-major order; each value is the list of per-trial
scores and consumers take its mean (``np.mean``). Importing keeps that mean per head (the numbers HeadKV
allocates by); exporting writes each head's score as a one-element list, so the mean, and every
allocation made from it, is unchanged.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FileFormatError, HeadprobeError
from ..files.jsonio import atomic_write_text, file_fingerprint, read_json
from ..files.overwrite import check_overwrite
from ..models.identity import ModelIdentity
from ..profile import Profile, check_head_scores, reduce_groups
from ..profile_kinds import HEAD_SCORE_KINDS
from .known import check_import_index, check_import_shape, import_model_identity

_KEY = re.compile(r"^(\d+)-(\d+)$")


def read_headkv_json(path: str | Path, model: str | ModelIdentity | None = None, kind: str | None = None,
                     source: str | None = None) -> Profile:
    """Import a HeadKV or Retrieval_Head score file as a profile.

    Parameters
    ----------
    path
        The JSON file.
    model
        Alias, HF id or identity of the model; default: from the file name (see
        :data:`~headprobe.tool_files.known.FILE_NAMES`).
    kind
        Profile kind; default ``retrieval_reasoning`` when the file name says ``reasoning``, else
        ``retrieval``.
    source
        ``probe.source`` label; default ``"headkv"`` or ``"retrieval_head"`` from the file name.

    Raises
    ------
    FileFormatError
        Keys not ``"<layer>-<head>"``, an index beyond the model (or, before the model is known, of
        :data:`~headprobe.tool_files.known.MAX_IMPORT_INDEX` or more), missing heads, empty or non-numeric
        score lists.
    """
    path = Path(path)
    obj = read_json(path, "score file")
    if not isinstance(obj, dict) or not obj:
        raise FileFormatError(path, None, 'expected a JSON object {"<layer>-<head>": [scores]}')
    cells, trials = _mean_scores(path, obj)
    stem = path.stem
    for suffix in ("_retrieval_reasoning_heads", "_retrieval_heads"):
        stem = stem.removesuffix(suffix)
    ident = import_model_identity(path, stem, model)
    layers, heads = _check_every_head(path, cells, ident)
    check_import_shape(path, ident, layers, heads, "query")
    if kind is None:
        kind = "retrieval_reasoning" if "reasoning" in path.stem else "retrieval"
    if kind not in HEAD_SCORE_KINDS:
        raise FileFormatError(path, None, f"cannot import as kind {kind!r}")
    if source is None:
        source = "headkv" if path.stem.endswith(("_heads",)) else "retrieval_head"
    q = [[cells[(layer, h)] for h in range(heads)] for layer in range(layers)]
    n = max(trials)
    probe: dict[str, Any] = {"kind": kind, "source": source, "path": str(path),
                             "file_sha256": file_fingerprint(path), "trials_per_head": sorted(trials)}
    return Profile(kind=kind, model=ident, probe=probe, trials={"total": n, "passed": n}, query_heads=q,
                   kv_heads=reduce_groups(q, ident.group_size, "mean"), group_reduction="mean")


def _mean_scores(path: Path, obj: dict[str, Any]) -> tuple[dict[tuple[int, int], float], set[int]]:
    """Each ``(layer, query head)``'s mean score and the numbers of trials the lists hold.

    Raises
    ------
    FileFormatError
        A key not ``"<layer>-<head>"`` or beyond what any model has, a value that is not a non-empty list of
        finite numbers.
    """
    cells: dict[tuple[int, int], float] = {}
    trials = set()
    for key, value in obj.items():
        m = _KEY.match(key)
        if not m:
            raise FileFormatError(path, key, 'keys must look like "<layer>-<queryhead>", e.g. "12-7"')
        check_import_index(path, key, int(m.group(1)), int(m.group(2)))
        if not isinstance(value, list) or not value or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            found = ("an empty list" if value == [] else repr(value) if not isinstance(value, list)
                     else "a list with a value that is not a number")
            raise FileFormatError(path, key, f"expected a non-empty list of numbers (the per-trial scores), found "
                                  f"{found}")
        if not all(math.isfinite(v) for v in value):
            raise FileFormatError(path, key, f"scores must be finite, found {value!r}")
        cells[(int(m.group(1)), int(m.group(2)))] = _mean(value)
        trials.add(len(value))
    return cells, trials


def _check_every_head(path: Path, cells: dict[tuple[int, int], float], ident: ModelIdentity) -> tuple[int, int]:
    """The file's layers and query heads, each head of each layer present and within ``ident``.

    Raises
    ------
    FileFormatError
        A head beyond the model, or one missing.
    """
    for layer, h in cells:
        if layer >= ident.num_layers or h >= ident.num_query_heads:
            raise FileFormatError(path, f"{layer}-{h}", f"beyond {ident.name}, which has {ident.num_layers} layers "
                                  f"x {ident.num_query_heads} query heads")
    layers = 1 + max(layer for layer, _ in cells)
    heads = 1 + max(h for _, h in cells)
    absent = layers * heads - len(cells)
    if absent:
        first = next(f"{layer}-{h}" for layer in range(layers) for h in range(heads) if (layer, h) not in cells)
        raise FileFormatError(path, first, f"missing ({absent} of {layers * heads} heads absent; "
                              "every layer-head key must be present)")
    return layers, heads


def _mean(values: list[float]) -> float:
    """NumPy's mean (what HeadKV's consumers compute), also where the sum is beyond the float range.

    ``[1e308, 1e308]`` overflows ``np.mean``; such lists take the mean of the scaled values instead.
    """
    with np.errstate(over="ignore"):
        mean = float(np.mean(values))
    return mean if math.isfinite(mean) else math.fsum(v / len(values) for v in values)


def headkv_json_text(profile: Profile) -> str:
    """The one-line JSON text of a profile's query-head scores, layer-major.

    Raises
    ------
    HeadprobeError
        A profile without head scores, or with a negative one (below the noise of imported learned gates):
        HeadKV's and KVCache-Factory's allocation would give that head less than the floor every head
        keeps, and headprobe's own ``allocate`` refuses the file this would write.
    """
    if profile.query_heads is None:
        raise FileFormatError("<profile>", "scores", "a layer-retention profile has no head scores to export")
    try:
        check_head_scores(profile)
    except HeadprobeError as exc:
        raise HeadprobeError(f"{exc}; not exported: HeadKV splits its budget by these scores, and a negative one "
                             "gives its head less than the floor every head keeps (allocate refuses the profile "
                             "too)") from None
    out = {f"{layer}-{h}": [float(s)] for layer, row in enumerate(profile.query_heads) for h, s in enumerate(row)}
    return json.dumps(out, allow_nan=False)


def write_headkv_json(profile: Profile, path: str | Path, force: bool = False) -> Path:
    """Export a profile as a HeadKV / Retrieval_Head score file (one line, every head, layer-major)."""
    path = check_overwrite(path, force)
    return atomic_write_text(path, headkv_json_text(profile) + "\n", overwrite=force)


__all__ = ("headkv_json_text", "read_headkv_json", "write_headkv_json")

