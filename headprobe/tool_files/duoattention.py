"""DuoAttention head patterns: a folder with ``full_attention_heads.tsv`` and ``config.json``.

The TSV has one row per layer and one tab-separated float per KV head, in [0, 1]: how much the head
needs the full cache (1) rather than a sink + recent window (0). DuoAttention's own code reads it in two
ways (mit-han-lab/duo-attention, ``duo_attn/utils.py`` and ``duo_attn/patch``):

- raw: ``load_attn_pattern`` clips the values to [0, 1] and the eval patch makes a KV head full when
  its value is above 0.5;
- ranked: ``sparsify_attention_heads(sparsity=s)`` adds uniform noise below 1e-6, cuts at the
  ``s``-quantile and makes the heads at or above it full. kvpress' ``DuoAttentionPress`` makes the
  ``round(n · head_compression_ratio)`` lowest heads streaming.

The eval patch casts each row to the model's dtype before it compares (``torch.tensor(row,
dtype=model.dtype) > 0.5``), so a value just above 0.5 becomes 0.5 in float16 or bfloat16 and its head
streams. headprobe's scores are on another scale (a SmolLM2 profile's largest KV-head score is 0.06), so
an export places the chosen split on DuoAttention's 0.5 cut with a margin the half-precision types
resolve: the full heads take values in [0.5 + :data:`DUO_MARGIN`, 1], the streaming heads
[0, 0.5 − :data:`DUO_MARGIN`], every head in its score order with neighbours at least
:data:`EXPORT_GAP` apart (ten times DuoAttention's tie noise), and ``config.json`` records the exact
share of streaming heads as ``sparsity``. Both readings then give the heads headprobe chose in float32,
float16 and bfloat16 alike, and any other sparsity gives the top heads in headprobe's order.
"""

from __future__ import annotations

import io
import json
import warnings
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from ..budget_map import BudgetMap
from ..errors import FileFormatError, HeadprobeError, param
from ..files.atomic import write_folder_atomically
from ..files.jsonio import file_fingerprint, read_json, read_text
from ..files.overwrite import check_overwrite
from ..head_ranking import rank_order
from ..limits import check_count
from ..models.identity import ModelIdentity
from ..models.registry import MODELS
from ..profile import Profile, kv_head_scores
from .known import FILE_NAMES, check_import_index, check_import_shape, import_model_identity
from .layer_list import check_budgets_keep_window

TSV_NAME = "full_attention_heads.tsv"
CONFIG_NAME = "config.json"
#: DuoAttention's eval patch makes a KV head full when its value is above this.
DUO_CUT = 0.5
#: ``sparsify_attention_heads`` adds uniform noise in [0, DUO_NOISE) to every value to break ties.
DUO_NOISE = 1e-6
#: Smallest distance between any two values headprobe exports: ten times DuoAttention's noise.
EXPORT_GAP = 1e-5
#: Distance of every exported value from the 0.5 cut: twice bfloat16's spacing just above 0.5 (2**-8), so
#: casting to bfloat16 or float16 (DuoAttention's eval patch casts to the model's dtype) keeps each value
#: on its side of the cut.
DUO_MARGIN = 2.0 ** -7
#: Share of full heads when neither a threshold nor a share is given (DuoAttention's example sparsity).
DEFAULT_FULL_SHARE = 0.5
#: sink_size / recent_size for a profile without its own (the values of DuoAttention's published patterns).
DEFAULT_SINK, DEFAULT_RECENT = 128, 256
#: ``config.model_type`` values DuoAttention's patch accepts (it refuses every other model).
DUO_MODEL_TYPES = ("llama", "mistral", "mixtral")


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
    if model is None and isinstance(config.get("model_name"), str) and stem not in FILE_NAMES:
        model = _known_model(config["model_name"])
        stem = Path(config["model_name"]).name
    ident = import_model_identity(tsv, stem, model)
    check_import_shape(tsv, ident, kv.shape[0], kv.shape[1], "kv")
    g = ident.group_size
    q = np.repeat(kv, g, axis=1)
    probe = {"kind": "retrieval", "source": "duoattention", "path": str(folder),
             "file_sha256": file_fingerprint(tsv), "config": config,
             "sink_size": config.get("sink_size"), "recent_size": config.get("recent_size"),
             "threshold": config.get("threshold"), "sparsity": config.get("sparsity")}
    return Profile(kind="retrieval", model=ident, probe=probe, trials={"total": 0, "passed": 0},
                   query_heads=q.tolist(), kv_heads=kv.tolist(), group_reduction="max")


def _known_model(name: str) -> str | None:
    """The alias of a headprobe model whose id (or alias) is ``name`` (``config.json``'s ``model_name``, as
    headprobe's own export writes it), else ``None`` (the name is then read as a published file name)."""
    if name in MODELS:
        return name
    return next((alias for alias, spec in MODELS.items() if spec.hf_id == name), None)


@dataclass(frozen=True)
class DuoSplit:
    """Which KV heads a DuoAttention export makes full.

    Attributes
    ----------
    full
        ``bool [layers][kv_heads]``: the heads that keep the whole cache.
    rule
        ``"threshold"`` (score at or above ``value``), ``"full_share"`` (the top ``value`` of the heads,
        rounded half up) or ``"duoattention"`` (an imported pattern's own cut: value above 0.5).
    value
        The threshold or the share; ``None`` for ``"duoattention"``.
    tie
        ``(score, heads tied at it, of them full)`` when the split runs through equal scores (the tied
        heads are then split by (layer, head), the lower full), else ``None``.
    """

    full: np.ndarray
    rule: str
    value: float | None
    tie: tuple[float, int, int] | None = None

    @property
    def streaming(self) -> int:
        """Number of streaming heads."""
        return int(self.full.size - self.full.sum())

    @property
    def sparsity(self) -> float:
        """Exact share of streaming heads (DuoAttention's ``sparsity``, kvpress' ``head_compression_ratio``)."""
        return float(Fraction(self.streaming, self.full.size))


def export_scores(source: Profile | BudgetMap, reduction: str | None = None) -> np.ndarray:
    """``float64 [layers][kv_heads]`` scores to export: a profile's KV-head scores (``reduction``
    re-reduces its query heads) or a KV-head budget map's shares, as stored."""
    if isinstance(source, BudgetMap):
        if source.granularity != "kv_head":
            raise HeadprobeError("DuoAttention patterns are per KV head; this budget map is per query head "
                                 f"(made with {param('compat', 'headkv')})")
        return np.asarray(source.shares, dtype=np.float64)
    return np.asarray(kv_head_scores(source, reduction), dtype=np.float64)


def choose_split(scores: np.ndarray, threshold: float | None = None, full_share: float | None = None,
                 native: bool = False) -> DuoSplit:
    """The full heads of an export.

    Parameters
    ----------
    scores
        ``[layers][kv_heads]``, negatives already clipped to 0.
    threshold
        Heads whose score is at or above it are full. A threshold that makes no head full, or every
        head, is refused: DuoAttention would then choose by its random tie noise.
    full_share
        The top ``floor(full_share · n + 0.5)`` heads are full (equal scores: the lower (layer, head)
        first).
    native
        Neither given, ``scores`` are an imported DuoAttention pattern: keep its own cut (above 0.5).
        Otherwise the default is :data:`DEFAULT_FULL_SHARE`.
    """
    s = np.asarray(scores, dtype=np.float64)
    if threshold is not None and full_share is not None:
        raise HeadprobeError(f"give {param('threshold')} or {param('full_share')}, not both")
    if threshold is not None:
        if not np.isfinite(threshold):
            raise HeadprobeError(f"{param('threshold', threshold)}: expected a finite number")
        full = s >= threshold
        if not full.any() or full.all():
            which = "no KV head" if not full.any() else "every KV head"
            raise HeadprobeError(
                f"{param('threshold', threshold)} makes {which} full: the scores run from {s.min():.4g} to "
                f"{s.max():.4g}; choose a threshold above the lowest and at most the highest, or a "
                f"{param('full_share')}")
        return DuoSplit(full, "threshold", float(threshold))
    if full_share is None and native:
        return DuoSplit(s > DUO_CUT, "duoattention", None)
    share = DEFAULT_FULL_SHARE if full_share is None else full_share
    if not 0 <= share <= 1:
        raise HeadprobeError(f"{param('full_share', share)}: expected a share of heads in [0, 1]")
    n = s.size
    k = int(np.floor(share * n + 0.5))
    order = rank_order(s)
    full = np.zeros(n, dtype=bool)
    full[order[:k]] = True
    tie = None
    if 0 < k < n:
        flat = s.ravel()
        edge = flat[order[k - 1]]
        if flat[order[k]] == edge:
            tied = flat == edge
            tie = (float(edge), int(tied.sum()), int((tied & full).sum()))
    return DuoSplit(full.reshape(s.shape), "full_share", float(share), tie)


def ranked_pattern(scores: np.ndarray, full: np.ndarray, gap: float = EXPORT_GAP,
                   margin: float = DUO_MARGIN) -> np.ndarray:
    """Values in [0, 1] that DuoAttention reads as ``full`` and that rank the heads as ``scores`` do.

    Full heads get values in ``[0.5 + margin, 1]``, the others ``[0, 0.5 − margin]`` (``margin`` keeps
    them on their side of 0.5 when DuoAttention casts them to float16 or bfloat16). Inside each side, the
    head of rank ``r`` (0 = lowest score; equal scores: the lower (layer, head) ranks higher) gets
    ``lo + gap·r + (hi − lo − gap·(m − 1))·(x − x_min)/(x_max − x_min)``: the order is the scores'
    order and neighbours are at least ``gap`` apart.

    Parameters
    ----------
    scores
        ``[layers][kv_heads]`` scores, negatives clipped.
    full
        ``bool [layers][kv_heads]``, the top heads of ``scores`` in that order.
    """
    s = np.asarray(scores, dtype=np.float64)
    flat, mask = s.ravel(), np.asarray(full, dtype=bool).ravel()
    ascending = rank_order(flat)[::-1]                      # lowest first; ties: higher (layer, head) first
    out = np.empty_like(flat)
    margin = max(margin, gap)
    for side, lo, hi in ((False, 0.0, DUO_CUT - margin), (True, DUO_CUT + margin, 1.0)):
        idx = ascending[mask[ascending] == side]
        m = idx.size
        if m == 0:
            continue
        room = (hi - lo) - gap * (m - 1)
        if room < 0:
            raise HeadprobeError(f"{m} heads on one side of the split do not fit between {lo} and {hi} "
                                 f"{gap} apart")
        x = flat[idx]
        span = x.max() - x.min()
        norm = (x - x.min()) / span if span > 0 else np.zeros(m)
        out[idx] = lo + gap * np.arange(m) + room * norm
    if mask.any() and (~mask).any():
        low_full = flat[mask].min()
        high_streaming = flat[~mask].max()
        if high_streaming > low_full:
            raise HeadprobeError("the full heads must be the top heads of the scores")
    return out.reshape(s.shape)


def binarise(scores: np.ndarray, threshold: float | None = None, full_share: float | None = None) -> np.ndarray:
    """0/1 pattern: heads with score ≥ ``threshold``, or the top ``full_share`` of heads (ties by (layer, head))."""
    if (threshold is None) == (full_share is None):
        raise HeadprobeError(f"binarise by {param('threshold')} or by {param('full_share')}, not both or neither")
    s = np.maximum(np.asarray(scores, dtype=np.float64), 0.0)
    return choose_split(s, threshold, full_share).full.astype(np.float64)


def binary_note(sparsity: float) -> str:
    """What a 1/0 export holds: DuoAttention's ``sparsify_attention_heads`` gives its heads at the exported
    ``sparsity`` only; at any other it cuts through tied values, which its noise orders at random."""
    return (f"1/0 values: DuoAttention's --sparsity (sparsify_attention_heads) gives these full heads at sparsity "
            f"{sparsity!r} only; at any other sparsity it picks among the tied 1s or 0s at random (export without "
            f"{param('binary', True)} for values that rank the heads at any sparsity)")


def tsv_text(values: np.ndarray) -> str:
    """One line per layer, one tab-separated value per KV head (a one-KV-head model: one value a line)."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"expected [layers][kv_heads] values, got shape {v.shape}")
    buf = io.StringIO()
    np.savetxt(buf, v, fmt="%.18e", delimiter="\t")
    return buf.getvalue()


def pattern_window(source: Profile | BudgetMap, sink_size: int | None, recent_size: int | None,
                   prior: dict[str, Any]) -> tuple[int, int]:
    """``(sink_size, recent_size)`` of an export.

    A budget map's own ``sink`` and ``window`` (what its heads always keep); other values are refused.
    A profile: the given values, else its imported config's, else 128 and 256.
    """
    if isinstance(source, BudgetMap):
        own = {"sink_size": source.method.get("sink"), "recent_size": source.method.get("window")}
        given = {"sink_size": sink_size, "recent_size": recent_size}
        for key, mine in own.items():
            what = "sink" if key == "sink_size" else "window"
            if mine is None and given[key] is None:
                raise HeadprobeError(f"the budget map records no {what}; pass {param(key)}")
            if mine is not None and given[key] is not None and given[key] != mine:
                raise HeadprobeError(
                    f"{param(key, given[key])} differs from the budget map's {what} ({mine}): a streaming "
                    f"head keeps what the map's heads always keep; leave {param(key)} out or allocate with "
                    f"that {what}")
        sink = own["sink_size"] if own["sink_size"] is not None else sink_size
        recent = own["recent_size"] if own["recent_size"] is not None else recent_size
    else:
        sink = sink_size if sink_size is not None else prior.get("sink_size", DEFAULT_SINK)
        recent = recent_size if recent_size is not None else prior.get("recent_size", DEFAULT_RECENT)
    for key, value, least in (("sink_size", sink, 0), ("recent_size", recent, 1)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least:
            why = (" (DuoAttention and kvpress keep tokens [-recent_size:], and -0 keeps them all)"
                   if key == "recent_size" else "")
            raise HeadprobeError(f"{param(key, value)}: expected an integer of at least {least}{why}")
    return int(sink), int(recent)


def consumer_warnings(model: ModelIdentity) -> list[str]:
    """What DuoAttention's own code cannot do with a pattern for ``model``."""
    out = []
    if not any(t in model.architecture for t in DUO_MODEL_TYPES):
        out.append(f"DuoAttention's patch supports Llama and Mistral models only; {model.name} is "
                   f"{model.architecture!r}, so only other readers (kvpress through "
                   "headprobe.library_bridges.kvpress) can use this pattern")
    if model.num_kv_heads == 1:
        out.append(f"{model.name} has one KV head: the TSV is one value a line, which np.loadtxt (DuoAttention's "
                   "load_attn_pattern, kvpress' DuoAttentionPress) reads as 1-D, so DuoAttention's patch fails and "
                   "DuoAttentionPress masks nothing; read it as [layers][1] (np.loadtxt(..., ndmin=2), "
                   "headprobe.tool_files.duoattention.read_tsv, headprobe.library_bridges.kvpress.DuoAttentionFolderPress)")
    return out


def write_duoattention(source: Profile | BudgetMap, folder: str | Path, *, sink_size: int | None = None,
                       recent_size: int | None = None, threshold: float | None = None,
                       full_share: float | None = None, binary: bool = False, exact: bool = False,
                       reduction: str | None = None, force: bool = False) -> Path:
    """Export a DuoAttention pattern folder that DuoAttention reads as headprobe means it.

    Parameters
    ----------
    source
        A profile (its KV-head scores) or a KV-head budget map (its shares).
    sink_size, recent_size
        What a streaming head keeps. A budget map's ``sink`` and ``window``; for a profile these values,
        else the imported config's, else 128 and 256.
    threshold, full_share
        The split: heads whose score (negatives read as 0) is at or above ``threshold``, or the top
        ``full_share`` of the heads. Neither: an imported DuoAttention pattern keeps its own cut (above
        0.5), anything else the top :data:`DEFAULT_FULL_SHARE`.
    binary
        Write 1 for full heads and 0 for the others instead of ranked values. DuoAttention's
        ``sparsify_attention_heads`` then gives these heads at the exported sparsity only: at another it
        cuts through tied values and picks among them at random (``config.json``'s ``headprobe.note``).
    exact
        Write the scores as stored (no split, no rescaling): for round trips of imported files.
    reduction
        Query → KV head reduction of a profile (default: its own).
    force
        Replace an existing non-empty folder's files.

    Returns
    -------
    Path
        The folder. ``config.json`` holds ``sink_size``, ``recent_size``, ``threshold`` (0.5, the cut
        in the written values), ``sparsity`` (the exact share of streaming heads) and a ``headprobe``
        block saying how the split was made.

    Warns
    -----
    UserWarning
        When the split runs through equal scores, for models DuoAttention's patch does not support, and
        for models with one KV head (see :func:`consumer_warnings`).
    """
    for name, value in (("sink_size", sink_size), ("recent_size", recent_size)):
        if value is not None:
            check_count(name, value, minimum=0)
    folder = check_overwrite(folder, force)
    if isinstance(source, BudgetMap):
        check_budgets_keep_window(source)
    raw = export_scores(source, reduction)
    prior = source.probe.get("config", {}) if isinstance(source, Profile) else {}
    config: dict[str, Any] = dict(prior) if isinstance(prior, dict) else {}
    config["sink_size"], config["recent_size"] = pattern_window(source, sink_size, recent_size, config)
    config.setdefault("model_name", source.model.name)
    if exact and (threshold is not None or full_share is not None or binary):
        raise HeadprobeError(f"{param('exact', True)} writes the scores as stored; it cannot split or binarise")
    values = raw if exact else _split_values(source, raw, threshold, full_share, binary, config)
    for message in consumer_warnings(source.model):
        warnings.warn(message, UserWarning, stacklevel=2)
    config_text = json.dumps(config, ensure_ascii=False, allow_nan=False) + "\n"
    return write_folder_atomically(folder, {TSV_NAME: tsv_text(values), CONFIG_NAME: config_text}, overwrite=force)


def _split_values(source: Profile | BudgetMap, raw: np.ndarray, threshold: float | None, full_share: float | None,
                  binary: bool, config: dict[str, Any]) -> np.ndarray:
    """The pattern's values for the split of ``raw`` (ranked, or 1 and 0 with ``binary``); ``config`` gets
    the cut, the sparsity and the ``headprobe`` block saying how the split was made.

    Raises
    ------
    HeadprobeError
        All-zero scores (nothing to choose the full heads by), except in an imported DuoAttention pattern.

    Warns
    -----
    UserWarning
        When the split runs through equal scores (attributed to :func:`write_duoattention`'s caller).
    """
    scores = np.maximum(raw, 0.0)               # DuoAttention clips to [0, 1]: below 0 is 0
    native = isinstance(source, Profile) and source.probe.get("source") == "duoattention"
    if not native and not np.any(scores > 0):
        raise HeadprobeError(f"{_what(source)} has all-zero scores: nothing to choose the full heads by "
                             "(allocate refuses it too); profile with more trials or other needles")
    split = choose_split(scores, threshold, full_share, native=native)
    if split.tie is not None:
        score, tied, full = split.tie
        warnings.warn(f"the split runs through {tied} KV heads of equal score {score:.4g}: {full} of them "
                      "are full, the lower (layer, head) first", UserWarning, stacklevel=3)
    values = split.full.astype(np.float64) if binary else ranked_pattern(scores, split.full)
    config["threshold"] = DUO_CUT
    config["sparsity"] = split.sparsity
    config["headprobe"] = {
        "split": split.rule, "value": split.value, "full_heads": int(split.full.sum()),
        "streaming_heads": split.streaming, "values": "binary" if binary else "ranked",
        "gap": None if binary else EXPORT_GAP, "margin": None if binary else DUO_MARGIN,
        "sparsities": [split.sparsity] if binary else "any",
        **({"note": binary_note(split.sparsity)} if binary else {}),
        "source": ({"kind": "budget_map", "allocator": source.method.get("allocator"),
                    "sources": source.method.get("sources", [])} if isinstance(source, BudgetMap)
                   else {"kind": source.kind, "fingerprint": source.fingerprint}),
    }
    return values


def _what(source: Profile | BudgetMap) -> str:
    return "the budget map" if isinstance(source, BudgetMap) else f"the {source.kind} profile"


__all__ = ("DEFAULT_FULL_SHARE", "DUO_CUT", "DUO_MARGIN", "DUO_NOISE", "EXPORT_GAP", "DuoSplit", "binarise",
           "binary_note", "choose_split", "consumer_warnings", "export_scores", "pattern_window",
           "ranked_pattern", "read_duoattention", "read_tsv", "write_duoattention")
