"""What ``headprobe explain`` reads: a budget map, profiles, a DuoAttention folder, a HeadKV score file,
or nothing but a kvpress press name and ratio.

:func:`read_input` tells the kind from the path (a folder or ``.tsv`` is a DuoAttention pattern; a JSON
file is a headprobe file by its ``format``, else a HeadKV / Retrieval_Head score file; a layer-split file
is read as the budget map ``allocate --method layer_split`` writes for it) and reads it with
headprobe's own readers, so every file is validated as ``headprobe import`` and ``allocate`` validate it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..allocation.api import load_profile
from ..allocation.layer_split_choice import split_budget_map
from ..budget_map import BUDGET_FORMAT, BudgetMap
from ..errors import FileFormatError, HeadprobeError, param
from ..files.jsonio import file_fingerprint, read_json
from ..layer_split import SPLIT_FORMAT, LayerSplit
from ..models.identity import ModelIdentity
from ..profile import PROFILE_FORMAT, Profile
from ..tool_files.duoattention import TSV_NAME, read_duoattention
from ..tool_files.headkv_json import read_headkv_json

#: The kinds of input, in the order the documentation lists them.
INPUT_KINDS = ("budget_map", "profile", "duoattention", "headkv", "kvpress")

#: How each kind is named in messages.
KIND_NAMES = {"budget_map": "a budget map", "profile": "a profile", "duoattention": "a DuoAttention folder",
              "headkv": "a HeadKV / Retrieval_Head score file", "kvpress": "a kvpress press"}


@dataclass(frozen=True)
class DuoPattern:
    """A DuoAttention pattern folder as DuoAttention reads it.

    Attributes
    ----------
    values
        ``float64 [layers][kv_heads]`` the TSV values as stored (readers clip them to [0, 1]).
    sink_size, recent_size
        What a streaming head keeps: the first ``sink_size`` and the last ``recent_size`` tokens.
    config
        The folder's ``config.json``.
    """

    values: np.ndarray
    sink_size: int
    recent_size: int
    config: dict[str, Any]

    @property
    def clipped(self) -> np.ndarray:
        """The values clipped to [0, 1], as ``load_attn_pattern`` and kvpress read them."""
        return np.clip(self.values, 0.0, 1.0)


@dataclass(frozen=True)
class PressSetting:
    """A kvpress press by name, its ratio and its options (``window_size``, ``beta``, ...)."""

    name: str
    ratio: float | None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExplainInput:
    """One input, read and checked.

    Attributes
    ----------
    kind
        One of :data:`INPUT_KINDS`.
    model
        The model the input is explained for.
    paths
        The files read (none for a kvpress press).
    fingerprint
        sha256 prefix of the (first) file read, ``None`` for a kvpress press.
    budget_map, profiles, duo, scores, press
        What the kind holds: the budget map; the profiles; the DuoAttention pattern; the HeadKV mean score
        per query head ``[layers][query_heads]``; the kvpress press.
    score_source
        ``"headkv"`` or ``"retrieval_head"`` for a score file.
    label
        What the file is, when its kind does not say it (``"layer split"``).
    """

    kind: str
    model: ModelIdentity
    paths: list[Path] = field(default_factory=list)
    fingerprint: str | None = None
    budget_map: BudgetMap | None = None
    profiles: list[Profile] = field(default_factory=list)
    duo: DuoPattern | None = None
    scores: np.ndarray | None = None
    score_source: str | None = None
    press: PressSetting | None = None
    label: str | None = None

    def describe(self) -> str:
        """What was read, in a few words: ``"budget map budgets/x.json"``."""
        if self.kind == "kvpress":
            ratio = "" if self.press.ratio is None else f" at ratio {self.press.ratio:g}"
            return f"kvpress {self.press.name}{ratio}"
        what = self.label or KIND_NAMES[self.kind].removeprefix("a ")
        return f"{what} " + " + ".join(str(p) for p in self.paths)


def input_kind(path: Path) -> str:
    """The kind of input at ``path`` (see the module docs)."""
    if not path.exists():
        raise HeadprobeError(f"{path}: no such file or folder")
    if path.is_dir() or path.suffix == ".tsv":
        return "duoattention"
    obj = read_json(path, "input file")
    fmt = obj.get("format") if isinstance(obj, dict) else None
    if fmt in (BUDGET_FORMAT, SPLIT_FORMAT):
        return "budget_map"
    if fmt == PROFILE_FORMAT:
        return "profile"
    if isinstance(obj, dict) and fmt is None and obj:
        return "headkv"
    raise FileFormatError(path, "format" if fmt is not None else None,
                          f"expected a headprobe budget map, layer split or profile, a HeadKV / Retrieval_Head score file "
                          f"{{\"<layer>-<head>\": [scores]}} or a DuoAttention folder; found "
                          f"{fmt or type(obj).__name__!r}")


def read_input(paths: list[str | Path], model: ModelIdentity | None, press: PressSetting | None = None,
               sink_size: int | None = None, recent_size: int | None = None) -> ExplainInput:
    """Read the input of an explanation.

    Parameters
    ----------
    paths
        The files given (several only for profiles: a head-score and a layer-retention profile).
    model
        The model to explain for, if one was named; files that record their model must fit it.
    press
        A kvpress press, read when no file is given.
    sink_size, recent_size
        Override a DuoAttention folder's own (as DuoAttention's ``--sink_size`` / ``--recent_size`` do).

    Raises
    ------
    HeadprobeError
        No input, two kinds at once, a file that is none of the kinds, or one made for another model.
    """
    if not paths:
        if press is None:
            raise HeadprobeError("give a budget map, a profile, a DuoAttention folder or a HeadKV score file, or "
                                 f"{param('press')} with {param('ratio')}")
        if model is None:
            raise HeadprobeError(f"{param('press')} needs {param('model')}: a ratio carries no model shape")
        return ExplainInput("kvpress", model, press=press)
    paths = [Path(p) for p in paths]
    kinds = [input_kind(p) for p in paths]
    if len(paths) > 1 and set(kinds) != {"profile"}:
        raise HeadprobeError(f"give one input ({', '.join(str(p) for p in paths)} are "
                             f"{', '.join(KIND_NAMES[k] for k in kinds)}); several files only as profiles")
    kind = kinds[0]
    if kind == "budget_map":
        return _budget_map(paths[0], model)
    if kind == "profile":
        return _profiles(paths, model)
    if kind == "duoattention":
        return _duoattention(paths[0], model, sink_size, recent_size)
    return _headkv(paths[0], model)


def _fits(found: ModelIdentity, model: ModelIdentity | None, what: str) -> ModelIdentity:
    if model is None:
        return found
    found.check_fits(model, what=what)
    return model


def _budget_map(path: Path, model: ModelIdentity | None) -> ExplainInput:
    obj = read_json(path, "input file")
    if obj.get("format") == SPLIT_FORMAT:
        split = LayerSplit.load(path)
        ident = _fits(split.model, model, f"layer split {path}")
        return ExplainInput("budget_map", ident, [path], file_fingerprint(path), budget_map=split_budget_map(split),
                            label="layer split")
    bm = BudgetMap.load(path)
    if bm.granularity != "kv_head":
        raise HeadprobeError(f"{path}: a query-head budget map (allocated with {param('compat', 'headkv')}) holds "
                             "HeadKV's budgets at its reference capacity only; explain the profile or the HeadKV "
                             "score file it was allocated from instead")
    ident = _fits(bm.model, model, f"budget map {path}")
    return ExplainInput("budget_map", ident, [path], file_fingerprint(path), budget_map=bm)


def _profiles(paths: list[Path], model: ModelIdentity | None) -> ExplainInput:
    profiles = [load_profile(p) for p in paths]
    ident = _fits(profiles[0].model, model, f"profile {paths[0]}")
    for p, path in zip(profiles[1:], paths[1:], strict=True):
        p.model.check_fits(ident, what=f"profile {path}")
    return ExplainInput("profile", ident, paths, file_fingerprint(paths[0]), profiles=profiles)


def _duoattention(path: Path, model: ModelIdentity | None, sink_size: int | None,
                  recent_size: int | None) -> ExplainInput:
    folder = path if path.is_dir() else path.parent
    profile = read_duoattention(folder, model)
    config = profile.probe.get("config") or {}
    window = {}
    for key, given in (("sink_size", sink_size), ("recent_size", recent_size)):
        value = given if given is not None else config.get(key)
        least = 1 if key == "recent_size" else 0
        if value is None:
            raise HeadprobeError(f"{folder}: config.json gives no {key}; pass {param(key)}")
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            where = param(key, value) if given is not None else f"{folder / 'config.json'}: field '{key}'"
            raise HeadprobeError(f"{where}: expected an integer of at least {least}"
                                 + (" (DuoAttention and kvpress keep tokens [-recent_size:], and -0 keeps them all)"
                                    if key == "recent_size" else ""))
        window[key] = int(value)
    duo = DuoPattern(np.asarray(profile.kv_heads, dtype=np.float64), window["sink_size"], window["recent_size"],
                     dict(config))
    return ExplainInput("duoattention", profile.model, [folder], file_fingerprint(folder / TSV_NAME), duo=duo)


def _headkv(path: Path, model: ModelIdentity | None) -> ExplainInput:
    profile = read_headkv_json(path, model)
    return ExplainInput("headkv", profile.model, [path], file_fingerprint(path),
                        scores=np.asarray(profile.query_heads, dtype=np.float64),
                        score_source=str(profile.probe.get("source")))


__all__ = ("INPUT_KINDS", "KIND_NAMES", "DuoPattern", "ExplainInput", "PressSetting", "input_kind", "read_input")
