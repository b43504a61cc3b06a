"""Profiles: head scores and layer retention of one model, the file that probes write, and the checks and
reductions of its head scores that allocation and the other tools' writers share.

A profile is ``{"format": "headprobe.profile", "version": 1, ...}``; see ``docs/formats.md``.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import FileFormatError, HeadprobeError
from .files.jsonio import atomic_write_json, fingerprint, read_headprobe_file, require, require_matrix
from .head_ranking import top_heads
from .models.identity import ModelIdentity
from .profile_kinds import PROFILE_KINDS

PROFILE_FORMAT = "headprobe.profile"
PROFILE_VERSION = 1

GROUP_REDUCTIONS = ("mean", "max", "sum")


@dataclass
class LayerRetention:
    """Per-layer retention of one task type (DynamicKV §3).

    Attributes
    ----------
    mean, std
        ``[layers]``: each layer's share of the globally top-ranked tokens, mean and standard deviation
        over the samples. ``mean`` sums to 1.
    samples
        Number of prompts averaged.
    """

    mean: list[float]
    std: list[float]
    samples: int


@dataclass
class Profile:
    """Head and/or layer importance of one model.

    Attributes
    ----------
    kind
        One of :data:`~headprobe.profile_kinds.PROFILE_KINDS` (the registered probe passes' kinds).
    model
        The model the scores belong to.
    probe
        Settings of the run that produced it (kind, mode, lengths, depths, needle-set and haystack
        fingerprints, seed, chat template, gate, headprobe version) or, for imports, the source file.
    trials
        ``{"total": int, "passed": int, "per_needle": {id: {"total": int, "passed": int}}}``.
    query_heads
        ``[layers][query_heads]`` mean score per query head over passing trials, or ``None``
        (layer-retention profiles).
    kv_heads
        ``[layers][kv_heads]`` the same reduced over each GQA group with ``group_reduction``.
    group_reduction
        How query-head scores were reduced to KV heads: ``"mean"``, ``"max"`` or ``"sum"``.
    retention
        Per task type, the :class:`LayerRetention` (layer-retention profiles only).
    retention_settings
        How retention was measured (window, pooling kernel, top-k rule, capacity).
    created
        ISO-8601 UTC time.
    intervals
        Needle profiles: bootstrap intervals over the passing trials, ``{"method": "bootstrap",
        "resamples", "level", "seed", "trials", "low": [layers][query_heads], "high": [layers][query_heads],
        "top_k_jaccard": {k: mean Jaccard index of the resamples' top-k heads with the profile's}}``, or
        ``None`` (profiles written before intervals existed, imports, layer retention).
    """

    kind: str
    model: ModelIdentity
    probe: dict[str, Any]
    trials: dict[str, Any]
    query_heads: list[list[float]] | None = None
    kv_heads: list[list[float]] | None = None
    group_reduction: str = "mean"
    retention: dict[str, LayerRetention] | None = None
    retention_settings: dict[str, Any] | None = None
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    intervals: dict[str, Any] | None = None

    # ---- derived ---------------------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        """Hash of the model, kind, scores and retention: what a budget file cites as its source."""
        return fingerprint({
            "model": self.model.fingerprint, "kind": self.kind, "query_heads": self.query_heads,
            "retention": {k: v.mean for k, v in (self.retention or {}).items()},
        })

    def top_heads(self, k: int = 10, granularity: str = "query") -> list[tuple[int, int, float]]:
        """The ``k`` highest-scoring heads as ``(layer, head, score)``, ties broken by (layer, head)."""
        scores = self.query_heads if granularity == "query" else self.kv_heads
        if scores is None:
            return []
        return [(l, h, scores[l][h]) for l, h in top_heads(scores, k)]

    # ---- JSON ------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": PROFILE_FORMAT,
            "version": PROFILE_VERSION,
            "kind": self.kind,
            "model": self.model.to_json(),
            "probe": self.probe,
            "trials": self.trials,
            "scores": None,
            "retention": None,
            "created": self.created,
            "fingerprint": self.fingerprint,
        }
        if self.query_heads is not None:
            out["scores"] = {
                "query_heads": self.query_heads,
                "kv_heads": self.kv_heads,
                "group_reduction": self.group_reduction,
            }
        if self.intervals is not None:
            out["intervals"] = self.intervals
        if self.retention is not None:
            out["retention"] = {
                "settings": self.retention_settings or {},
                "tasks": {k: {"mean": v.mean, "std": v.std, "samples": v.samples}
                          for k, v in self.retention.items()},
            }
        return out

    def save(self, path: str | Path, force: bool = False) -> Path:
        """Write the profile whole; an existing file is replaced only with ``force``.

        The check is the write itself (:func:`~headprobe.files.atomic.put_in_place`): of two runs writing
        the same profile, the second is refused even when both started before either wrote.

        Raises
        ------
        HeadprobeError
            ``path`` exists (without ``force``), or cannot be written.
        """
        return atomic_write_json(path, self.to_json(), overwrite=force)

    @classmethod
    def from_json(cls, obj: dict, path: object = "<profile>") -> Profile:
        kind = require(obj, "kind", str, path)
        if kind not in PROFILE_KINDS:
            raise FileFormatError(path, "kind", f"expected one of {', '.join(PROFILE_KINDS)}, found {kind!r}")
        model = ModelIdentity.from_json(require(obj, "model", dict, path), path)
        probe = require(obj, "probe", dict, path)
        trials = require(obj, "trials", dict, path)
        for key in ("total", "passed"):
            require(trials, key, int, path, prefix="trials.")
        _check_trial_counts(trials, path)
        query_heads = kv_heads = None
        reduction = "mean"
        scores = obj.get("scores")
        if scores is not None:
            if not isinstance(scores, dict):
                raise FileFormatError(path, "scores", "expected an object with query_heads and kv_heads")
            query_heads = require_matrix(require(scores, "query_heads", list, path, "scores."),
                                         model.num_layers, model.num_query_heads, path, "scores.query_heads")
            kv_heads = require_matrix(require(scores, "kv_heads", list, path, "scores."),
                                      model.num_layers, model.num_kv_heads, path, "scores.kv_heads")
            reduction = require(scores, "group_reduction", str, path, "scores.")
            if reduction not in GROUP_REDUCTIONS:
                raise FileFormatError(path, "scores.group_reduction",
                                      f"expected one of {', '.join(GROUP_REDUCTIONS)}, found {reduction!r}")
        retention = settings = None
        ret = obj.get("retention")
        if ret is not None:
            if not isinstance(ret, dict) or not isinstance(ret.get("tasks"), dict) or not ret["tasks"]:
                raise FileFormatError(path, "retention.tasks", "expected an object of task types")
            settings = ret.get("settings") or {}
            retention = {}
            for task, entry in ret["tasks"].items():
                name = f"retention.tasks.{task}"
                if not isinstance(entry, dict):
                    raise FileFormatError(path, name, "expected an object with mean, std and samples")
                mean = require_matrix([require(entry, "mean", list, path, name + ".")], 1, model.num_layers,
                                      path, name + ".mean")[0]
                std = require_matrix([require(entry, "std", list, path, name + ".")], 1, model.num_layers,
                                     path, name + ".std")[0]
                retention[task] = LayerRetention(mean=mean, std=std,
                                                 samples=require(entry, "samples", int, path, name + "."))
        if query_heads is None and retention is None:
            raise FileFormatError(path, "scores", "a profile needs head scores or layer retention; found neither")
        intervals = _intervals_from_json(obj.get("intervals"), model, query_heads is not None, path)
        return cls(kind=kind, model=model, probe=probe, trials=trials, query_heads=query_heads,
                   kv_heads=kv_heads, group_reduction=reduction, retention=retention,
                   retention_settings=settings, created=str(obj.get("created", "")), intervals=intervals)

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        """Read and validate a profile file."""
        return cls.from_json(read_headprobe_file(path, PROFILE_FORMAT, PROFILE_VERSION), path)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_trial_counts(trials: dict, path: object) -> None:
    """The optional count tables of ``trials``: ``per_needle`` ``{id: {total, passed}}``, ``per_task``
    ``{task: count}`` and ``passed_by_gate`` ``{gate: count}``, counts being non-negative integers."""
    per_needle = trials.get("per_needle")
    if per_needle is not None:
        if not isinstance(per_needle, dict):
            raise FileFormatError(path, "trials.per_needle", "expected an object {needle id: {total, passed}}, "
                                  f"found {type(per_needle).__name__}")
        for needle, entry in per_needle.items():
            if not (isinstance(entry, dict) and _count(entry.get("total")) and _count(entry.get("passed"))):
                raise FileFormatError(path, f"trials.per_needle.{needle}",
                                      "expected {\"total\": count, \"passed\": count}")
    for key, what in (("per_task", "task"), ("passed_by_gate", "gate")):
        table = trials.get(key)
        if table is None:
            continue
        if not isinstance(table, dict) or not all(_count(v) for v in table.values()):
            raise FileFormatError(path, f"trials.{key}", f"expected an object {{{what}: count}}")
def _intervals_from_json(block: Any, model: ModelIdentity, has_scores: bool, path: object) -> dict[str, Any] | None:
    """Validate a profile's optional ``intervals`` block (bootstrap intervals of the query-head scores)."""
    if block is None:
        return None
    if not isinstance(block, dict) or not has_scores:
        raise FileFormatError(path, "intervals", "expected an object with low and high, beside head scores")
    for key in ("low", "high"):
        require_matrix(require(block, key, list, path, "intervals."), model.num_layers, model.num_query_heads,
                       path, f"intervals.{key}")
    level = block.get("level")
    if not isinstance(level, (int, float)) or not 0 < level < 1:
        raise FileFormatError(path, "intervals.level", f"expected a coverage between 0 and 1, found {level!r}")
    resamples = block.get("resamples")
    if not isinstance(resamples, int) or resamples < 1:
        raise FileFormatError(path, "intervals.resamples", f"expected a positive integer, found {resamples!r}")
    return block


def reduce_groups(query_scores: list[list[float]], group_size: int, reduction: str = "mean") -> list[list[float]]:
    """Reduce ``[layers][query_heads]`` scores to ``[layers][kv_heads]`` over each GQA group.

    Query head ``h`` belongs to KV head ``h // group_size`` (transformers' ``repeat_kv`` layout).
    """
    if reduction not in GROUP_REDUCTIONS:
        raise ValueError(f"group reduction must be one of {GROUP_REDUCTIONS}, got {reduction!r}")
    out = []
    for row in query_scores:
        groups = [row[i:i + group_size] for i in range(0, len(row), group_size)]
        if reduction == "mean":
            out.append([_mean(g) for g in groups])
        elif reduction == "max":
            out.append([max(g) for g in groups])
        else:
            out.append([_sum(g) for g in groups])
    return out


def _sum(values: list[float]) -> float:
    """Exact float sum; ``±inf`` when it is beyond the float range (``math.fsum`` raises there)."""
    try:
        return math.fsum(values)
    except OverflowError:
        return math.copysign(math.inf, math.fsum(v / len(values) for v in values))


def _mean(values: list[float]) -> float:
    """Mean by an exact sum; for values whose sum is beyond the float range, the sum of ``v / n``."""
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        return math.fsum(v / len(values) for v in values)


#: Scores down to this far below zero are read as 0 (learned gates such as DuoAttention's end at -1e-4).
NEGATIVE_NOISE = 1e-3


def check_head_scores(profile: Profile) -> None:
    """Refuse head scores no probe produces: a negative score (every probe's scores are means of
    non-negative quantities; QRHead's negative means are written as 0; imported learned gates may end
    just below 0, down to ``-NEGATIVE_NOISE``), which would take budget from the heads an allocator splits
    it over. Checked on the query-head scores, whatever KV-head scores the file stores beside them.

    Raises
    ------
    HeadprobeError
        Naming the profile, the head and the score.
    """
    scores = np.asarray(profile.query_heads, dtype=np.float64)
    if scores.size and scores.min() < -NEGATIVE_NOISE:
        layer, head = (int(i) for i in np.unravel_index(int(np.argmin(scores)), scores.shape))
        raise HeadprobeError(f"{profile.kind} profile of {profile.model.name}: field 'scores.query_heads[{layer}]"
                             f"[{head}]': expected a score of at least 0, found {float(scores[layer, head])!r}")


def kv_head_scores(profile: Profile, reduction: str | None = None) -> list[list[float]]:
    """The profile's scores at KV-head granularity, reduced over each GQA group with ``reduction``.

    ``None`` uses the reduction the profile was written with (its stored ``kv_heads``).
    """
    if profile.query_heads is None:
        raise HeadprobeError(f"{profile.kind} profile of {profile.model.name} has no head scores "
                             "(a layer-retention profile cannot drive a head allocator)")
    check_head_scores(profile)
    if reduction is None or (reduction == profile.group_reduction and profile.kv_heads is not None):
        if profile.kv_heads is not None:
            return profile.kv_heads
        reduction = "mean"
    if reduction not in GROUP_REDUCTIONS:
        raise HeadprobeError(f"reduction must be one of {', '.join(GROUP_REDUCTIONS)}, got {reduction!r}")
    return reduce_groups(profile.query_heads, profile.model.group_size, reduction)
