"""DuoAttention head patterns: a folder with ``full_attention_heads.tsv`` and ``config.json``.

The TSV has one row per layer and one tab-separated float per KV head, in [0, 1]: how much the head
needs the full cache (1) rather than a sink + recent window (0). DuoAttention, kvpress'
``DuoAttentionPress`` and their forks binarise it by a threshold or a sparsity. Published files have
many ties at 1.0, so by default headprobe writes scores that rank without ties: the order of the scores
is kept, ties broken by (layer, head) (lower first ranks higher), and values move by at most ``1e-6``.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from ..budget_map import BudgetMap
from ..errors import FileFormatError, HeadprobeError, param
from ..files.jsonio import (
    atomic_write_json,
    atomic_write_text,
    file_fingerprint,
    make_output_dir,
    read_json,
    read_text,
)
from ..files.overwrite import check_overwrite
from ..head_ranking import rank_order
from ..limits import check_count
from ..models.identity import ModelIdentity
from ..profile import Profile
from .known import check_import_index, import_identity

TSV_NAME = "full_attention_heads.tsv"
CONFIG_NAME = "config.json"
TIE_EPS = 1e-6


def read_tsv(path: str | Path) -> np.ndarray:
    """Read a ``full_attention_heads.tsv`` into ``float64 [layers][kv_heads]`` (rows must be equal length)."""
    path = Path(path)
    text = read_text(path, "DuoAttention pattern file")
    rows = [line for line in text.splitlines() if line.strip()]
    if not rows:
        raise FileFormatError(path, None, "empty; expected one tab-separated row of scores per layer")
    out = []
    for i, line in enumerate(rows):
        cells = line.strip().split("\t")
        check_import_index(path, f"row {i}", i, len(cells) - 1)
        try:
            out.append([float(x) for x in cells])
        except ValueError:
            raise FileFormatError(path, f"row {i}", "expected tab-separated numbers") from None
        if len(out[-1]) != len(out[0]):
            raise FileFormatError(path, f"row {i}", f"has {len(out[-1])} values but row 0 has {len(out[0])} "
                                  "(ragged rows: every layer needs one value per KV head)")
    arr = np.array(out, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise FileFormatError(path, None, "scores must be finite")
    return arr


def read_duoattention(folder: str | Path, model: str | ModelIdentity | None = None) -> Profile:
    """Import a DuoAttention pattern folder as a ``retrieval``-kind profile (``probe.source`` says so).

    The TSV values become the KV-head scores exactly; each query head gets its KV head's value. The
    model comes from ``model`` or the folder name; ``config.json`` is kept in ``probe.config``.
    """
    folder = Path(folder)
    tsv = folder / TSV_NAME if folder.is_dir() else folder
    if folder.is_dir():
        cfg_path = folder / CONFIG_NAME
    else:
        folder, cfg_path = tsv.parent, tsv.parent / CONFIG_NAME
    if not tsv.is_file():
        raise HeadprobeError(f"{folder}: no {TSV_NAME} (expected a DuoAttention pattern folder)")
    kv = read_tsv(tsv)
    config: dict[str, Any] = {}
    if cfg_path.is_file():
        config = read_json(cfg_path)
        if not isinstance(config, dict):
            raise FileFormatError(cfg_path, None, "expected a JSON object")
    stem = folder.name
    if model is None and isinstance(config.get("model_name"), str):
        stem = Path(config["model_name"]).name if stem not in _names() else stem
    ident = import_identity(tsv, stem, model, kv.shape[0], kv.shape[1], "kv")
    g = ident.group_size
    q = np.repeat(kv, g, axis=1)
    probe = {"kind": "retrieval", "source": "duoattention", "path": str(folder),
             "file_sha256": file_fingerprint(tsv), "config": config,
             "sink_size": config.get("sink_size"), "recent_size": config.get("recent_size"),
             "threshold": config.get("threshold"), "sparsity": config.get("sparsity")}
    return Profile(kind="retrieval", model=ident, probe=probe, trials={"total": 0, "passed": 0},
                   query_heads=q.tolist(), kv_heads=kv.tolist(), group_reduction="max")


def _names() -> set[str]:
    from .known import FILE_NAMES
    return set(FILE_NAMES)


def untie(scores: np.ndarray, eps: float = TIE_EPS) -> np.ndarray:
    """Scores in [0, 1] with no two equal, in the same order as ``scores``.

    ``v' = v·(1 − eps) + eps·rank/(n − 1)``, rank by value with ties broken by (layer, head), the lower
    index ranking higher. Distinct values keep their order; each value moves by at most ``eps``.
    """
    s = np.clip(np.asarray(scores, dtype=np.float64), 0.0, 1.0)
    flat = s.ravel()
    n = flat.size
    if n == 1:
        return s.copy()
    rank = np.empty(n, dtype=np.float64)
    rank[rank_order(flat)[::-1]] = np.arange(n)        # 0 for the lowest, n - 1 for the highest
    return (flat * (1 - eps) + eps * rank / (n - 1)).reshape(s.shape)


def normalise(scores: np.ndarray) -> np.ndarray:
    """Map scores to [0, 1]: unchanged if already there, else divided by the max after shifting negatives."""
    s = np.asarray(scores, dtype=np.float64)
    if s.min() >= 0 and s.max() <= 1:
        return s.copy()
    lo = min(0.0, float(s.min()))
    span = float(s.max()) - lo
    return (s - lo) / span if span > 0 else np.zeros_like(s)


def binarise(scores: np.ndarray, threshold: float | None = None, full_share: float | None = None) -> np.ndarray:
    """0/1 pattern: heads with score ≥ ``threshold``, or the top ``full_share`` of heads (ties by (layer, head))."""
    s = np.asarray(scores, dtype=np.float64)
    if (threshold is None) == (full_share is None):
        raise HeadprobeError(f"binarise by {param('threshold')} or by {param('full_share')}, not both or neither")
    if threshold is not None:
        if not 0 <= threshold <= 1:
            raise HeadprobeError(f"{param('threshold', threshold)}: expected a score in [0, 1]")
        return (s >= threshold).astype(np.float64)
    if not 0 <= full_share <= 1:
        raise HeadprobeError(f"{param('full_share', full_share)}: expected a share of heads in [0, 1]")
    k = int(np.floor(full_share * s.size + 0.5))
    out = np.zeros(s.size)
    out[rank_order(s)[:k]] = 1.0
    return out.reshape(s.shape)


def duo_scores(source: Profile | BudgetMap, reduction: str | None = None) -> np.ndarray:
    """KV-head scores to export: a profile's ``kv_heads`` (or re-reduced with ``reduction``), or a budget
    map's shares (KV-head maps only)."""
    if isinstance(source, BudgetMap):
        if source.granularity != "kv_head":
            raise HeadprobeError("DuoAttention patterns are per KV head; this budget map is per query head")
        return np.asarray(source.shares, dtype=np.float64)
    from ..allocation.common import kv_head_scores
    return np.asarray(kv_head_scores(source, reduction), dtype=np.float64)


def tsv_text(values: np.ndarray) -> str:
    buf = io.StringIO()
    np.savetxt(buf, np.asarray(values, dtype=np.float64), fmt="%.18e", delimiter="\t")
    return buf.getvalue()


def write_duoattention(source: Profile | BudgetMap, folder: str | Path, *, sink_size: int | None = None,
                       recent_size: int | None = None, threshold: float | None = None,
                       full_share: float | None = None, exact: bool = False, reduction: str | None = None,
                       force: bool = False) -> Path:
    """Export a DuoAttention pattern folder.

    Parameters
    ----------
    source
        A profile (its KV-head scores) or a KV-head budget map (its shares).
    sink_size, recent_size
        Written to ``config.json``; default: the imported config's values, else 128 and 256.
    threshold, full_share
        Binarise: heads at or above ``threshold`` (on the [0, 1] scores), or the top ``full_share`` of
        heads, become 1, the rest 0. ``config.json`` records the choice.
    exact
        Write the scores as stored (no rescaling, no tie-breaking): for round trips of imported files.
    force
        Replace an existing non-empty folder's files.
    """
    for name, value in (("sink_size", sink_size), ("recent_size", recent_size)):
        if value is not None:
            check_count(name, value, minimum=0)
    folder = check_overwrite(folder, force)
    values = duo_scores(source, reduction)
    prior = source.probe.get("config", {}) if isinstance(source, Profile) else {}
    config: dict[str, Any] = dict(prior) if isinstance(prior, dict) else {}
    if not exact:
        values = normalise(values)
        if threshold is not None or full_share is not None:
            values = binarise(values, threshold, full_share)
        else:
            values = untie(values)
    elif threshold is not None or full_share is not None:
        raise HeadprobeError("exact export writes scores as stored; it cannot binarise too")
    config["sink_size"] = sink_size if sink_size is not None else config.get("sink_size", 128)
    config["recent_size"] = recent_size if recent_size is not None else config.get("recent_size", 256)
    if threshold is not None or full_share is not None:
        config["threshold"] = threshold if threshold is not None else 0.5
        config["sparsity"] = None if full_share is None else 1 - full_share
    config.setdefault("model_name", source.model.name)
    make_output_dir(folder)
    atomic_write_text(folder / TSV_NAME, tsv_text(values))
    atomic_write_json(folder / CONFIG_NAME, config, indent=None)
    return folder


__all__ = ("binarise", "duo_scores", "normalise", "read_duoattention", "read_tsv", "untie", "write_duoattention")

