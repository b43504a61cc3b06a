"""Turning trial logs into profiles: mean scores over passing trials, per-needle pass rates, merging shards.

Every record read from a log is checked before it is averaged (:func:`check_trial_records`): a
hand-edited, truncated or foreign record is refused in one line naming its file, line and field, instead
of crashing the merge or yielding a profile that allocation refuses later.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FileFormatError, HeadprobeError, NoPassingTrialsError, param
from ..files.trial_log import read_log_records, settings_diff
from ..models.identity import ModelIdentity
from ..profile import LayerRetention, Profile, reduce_groups
from .bootstrap import BootstrapSettings, interval_block, top_k_jaccard
from .early_stop import StopRule
from .registry import get_pass, pass_of_kind, probe_passes


def gate_name(kind: str, settings: dict[str, Any]) -> str:
    """The gate a trial of this kind must pass: the log's gate (``"published"`` or ``"likelihood"``) when the
    kind's pass takes the request's gate (the reasoning pass), else ``"published"``."""
    return settings.get("gate", "published") if _takes_gate(kind) else "published"


def _takes_gate(kind: str) -> bool:
    return pass_of_kind(kind).implementation.takes_gate


def needle_profile(kind: str, identity: ModelIdentity, settings: dict[str, Any], records: list[dict[str, Any]],
                   group_reduction: str = "mean") -> Profile:
    """Profile of one head-score kind from needle trial records.

    Raises
    ------
    NoPassingTrialsError
        When no trial passed the gate: a profile of zeros would look like a result and is not written.
    """
    gate = gate_name(kind, settings)
    passed = [r for r in records if r["gates"].get(gate)]
    per_needle: dict[str, dict[str, int]] = {}
    for r in records:
        entry = per_needle.setdefault(r["needle"], {"total": 0, "passed": 0})
        entry["total"] += 1
        entry["passed"] += int(bool(r["gates"].get(gate)))
    if not passed:
        hint = f" or {param('gate', 'likelihood')}" if _takes_gate(kind) else ""
        raise NoPassingTrialsError(
            f"{kind}: none of the {len(records)} trials passed the {gate} gate, so there is nothing to average; "
            f"try shorter {param('lengths')}, other {param('needle_ids')}{hint} (see the responses in the trial log)"
        )
    layers, heads = identity.num_layers, identity.num_query_heads
    mean = exact_head_means([r["scores"][kind] for r in passed], layers, heads)
    by_gate: dict[str, int] = {}
    for r in records:
        for name in ("published", "likelihood"):
            if name in r["gates"]:
                by_gate[name] = by_gate.get(name, 0) + int(bool(r["gates"][name]))
    probe = {**{k: v for k, v in settings.items() if k not in ("probes",)}, "kind": kind}
    trials = {"total": len(records), "passed": len(passed), "gate": gate, "passed_by_gate": by_gate,
              "per_needle": dict(sorted(per_needle.items())),
              "mean_seconds": round(mean_of([r.get("seconds", 0.0) for r in records]), 3)}
    per_trial = np.array([r["scores"][kind] for r in passed], dtype=np.float64)   # [passed, layers, heads]
    if settings.get("until_stable"):
        trials["stopping"] = stopping_block(settings, len(records), grid_size(settings), per_trial)
    return Profile(kind=kind, model=identity, probe=probe, trials=trials, query_heads=mean,
                   kv_heads=reduce_groups(mean, identity.group_size, group_reduction),
                   group_reduction=group_reduction, intervals=interval_block(per_trial, BootstrapSettings()))


def grid_size(settings: dict[str, Any]) -> int:
    """Trials in a needle pass's grid: lengths × depths × seeds × needles."""
    return (len(settings.get("lengths", [])) * len(settings.get("depths", [])) * len(settings.get("seeds", [0]))
            * len(settings.get("needle_set", {}).get("ids", [])))


def stopping_block(settings: dict[str, Any], trials_run: int, grid_trials: int,
                   per_trial: np.ndarray) -> dict[str, Any]:
    """``trials.stopping`` of an early-stopped profile: the rule (``settings["until_stable"]``), how many of
    the ``grid_trials`` trials ran, and the top-k Jaccard index of this kind's passing trials (whether the
    rule holds for it)."""
    rule = StopRule.from_json(settings["until_stable"])
    jaccard = (top_k_jaccard(per_trial, rule.k, rule.bootstrap) if len(per_trial) >= rule.min_passed else None)
    return {"rule": rule.to_json(), "trials_run": trials_run, "grid_trials": grid_trials,
            "jaccard": None if jaccard is None else round(jaccard, 4),
            "stable": jaccard is not None and jaccard >= rule.jaccard}


def retention_profile(kind: str, identity: ModelIdentity, settings: dict[str, Any],
                      records: list[dict[str, Any]]) -> Profile:
    """Layer-retention profile of ``kind``: per task type, mean and standard deviation of each layer's share."""
    by_task: dict[str, list[list[float]]] = {}
    for r in records:
        by_task.setdefault(r["task"], []).append(r["retention"])
    if not by_task:
        raise NoPassingTrialsError(f"{kind}: no samples were run")
    retention = {}
    for task, rows in sorted(by_task.items()):
        n = len(rows)
        mean = [mean_of([row[l] for row in rows]) for l in range(identity.num_layers)]
        std = [math.sqrt(math.fsum((row[l] - mean[l]) ** 2 for row in rows) / n) for l in range(identity.num_layers)]
        retention[task] = LayerRetention(mean=mean, std=std, samples=n)
    keys = ("window", "kernel_size", "capacity", "max_tokens")
    probe = {**{k: v for k, v in settings.items() if k not in ("probes",)}, "kind": kind}
    trials = {"total": len(records), "passed": len(records),
              "per_task": {t: len(v) for t, v in sorted(by_task.items())}}
    return Profile(kind=kind, model=identity, probe=probe, trials=trials, retention=retention,
                   retention_settings={k: settings.get(k) for k in keys if k in settings})


def read_profile_log(path: str | Path) -> tuple[dict[str, Any], list[tuple[int, dict[str, Any]]]]:
    """Read a profiling pass's trial log: ``(settings, [(line number, trial), ...])``. ``settings.pass`` must
    name a pass and ``settings.model`` be a model identity, besides what
    :func:`~headprobe.files.trial_log.read_log_records` checks.

    Raises
    ------
    FileFormatError
        Naming the settings field that is missing or of the wrong type.
    """
    settings, records = read_log_records(path)
    if get_pass(str(settings.get("pass"))) is None:
        names = [p.name for p in probe_passes()]
        raise FileFormatError(path, "settings.pass", f"expected {', '.join(names[:-1])} or {names[-1]}, found "
                              f"{settings.get('pass')!r}")
    ModelIdentity.from_json(settings.get("model"), path, "settings.model")
    return settings, records


# ---- checking records ----------------------------------------------------------------------------

def check_trial_records(settings: dict[str, Any], records: Iterable[tuple[str, dict[str, Any]]]) -> None:
    """Check every ``(where, record)`` of a profiling pass's log before it is averaged, by the rules of its
    pass (``settings["pass"]``, :meth:`~headprobe.probes.pass_steps.PassSteps.check_records`); ``where``
    names the record in messages (``"file:line"``).

    Raises
    ------
    FileFormatError
        Naming the record's place and field.
    """
    steps_of_log(settings).check_records(settings, list(records))


def steps_of_log(settings: dict[str, Any]) -> Any:
    """The steps of the pass a log's settings name (its ``settings["pass"]``).

    Raises
    ------
    FileFormatError
        No registered pass has that name.
    """
    probe_pass = get_pass(str(settings.get("pass")))
    if probe_pass is None:
        raise FileFormatError("<trial log>", "settings.pass", f"no probe pass {settings.get('pass')!r}")
    return probe_pass.implementation


def exact_head_means(per_trial: list, layers: int, heads: int) -> list[list[float]]:
    """``[layers][heads]`` means over trials of ``per_trial`` (``[trials][layers][heads]``), each by
    :func:`mean_of` (an exact sum: the same mean in any order of the trials, so shards and ranks merge to one
    process's profile)."""
    return [[mean_of([float(t[l][h]) for t in per_trial]) for h in range(heads)] for l in range(layers)]


def mean_of(values: list[float]) -> float:
    """Mean of finite floats by an exact sum (``math.fsum``, so the order does not matter); for values whose
    sum is beyond the float range (a trial log's ``seconds``, which nothing bounds), the exact sum of
    ``v / n`` instead of an ``OverflowError``."""
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        return math.fsum(v / len(values) for v in values)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def require_field(record: dict[str, Any], key: str, kind: type | tuple, where: str) -> None:
    """``record[key]`` is a ``kind`` (not a boolean)."""
    value = record.get(key)
    if value is None or isinstance(value, bool) or not isinstance(value, kind):
        names = {str: "a string", int: "an integer", dict: "an object", (int, float): "a number"}
        raise FileFormatError(where, key, f"expected {names.get(kind, 'a value')}, found {_shown(value)}")


def is_count(value: Any) -> bool:
    """A non-negative integer (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_number(value: Any, low: float = -math.inf, high: float = math.inf) -> bool:
    """A finite number (not a boolean) from ``low`` to ``high``."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and low <= value <= high)


#: A record field's check: (what is expected, in words; whether a value is that).
FieldRule = tuple[str, Callable[[Any], bool]]

COUNT: FieldRule = ("an integer >= 0", is_count)
SHARE: FieldRule = ("a number from 0 to 1", lambda v: is_number(v, 0.0, 1.0))
SECONDS: FieldRule = ("a finite number >= 0", lambda v: is_number(v, 0.0))
NUMBER: FieldRule = ("a finite number", is_number)
TEXT: FieldRule = ("a string", lambda v: isinstance(v, str))
SWITCH: FieldRule = ("true or false", lambda v: isinstance(v, bool))
OBJECT: FieldRule = ("an object", lambda v: isinstance(v, dict))


def check_fields(record: dict[str, Any], rules: dict[str, FieldRule], where: str, prefix: str = "") -> None:
    """Each field of ``record`` that ``rules`` names and the record holds is what its rule expects.

    Raises
    ------
    FileFormatError
        Naming ``where``, the field (``prefix`` + its key) and what was expected.
    """
    for key, (expected, ok) in rules.items():
        if key in record and not ok(record[key]):
            raise FileFormatError(where, prefix + key, f"expected {expected}, found {_shown(record[key])}")


def require_numbers(value: Any, shape: list[int], where: str, name: str, most: float | None = None,
                    signed: bool = False) -> None:
    """``value`` is a nested list of ``shape`` holding finite numbers >= 0 (any sign with ``signed``: QRHead's
    calibrated scores), and at most ``most`` when given (what the probe can produce)."""
    if len(shape) > 1:
        if not isinstance(value, list) or len(value) != shape[0]:
            found = f"{len(value)} rows" if isinstance(value, list) else _shown(value)
            raise FileFormatError(where, name, f"expected {shape[0]} rows (one per layer), found {found}")
        for i, row in enumerate(value):
            require_numbers(row, shape[1:], where, f"{name}[{i}]", most, signed)
        return
    if not isinstance(value, list) or len(value) != shape[0]:
        found = f"{len(value)} values" if isinstance(value, list) else _shown(value)
        raise FileFormatError(where, name, f"expected {shape[0]} values, found {found}")
    for j, x in enumerate(value):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or (x < 0 and not signed):
            wanted = "a finite number" if signed else "a finite number >= 0"
            raise FileFormatError(where, f"{name}[{j}]", f"expected {wanted}, found {x!r}")
        if most is not None and x > most:
            raise FileFormatError(where, f"{name}[{j}]", f"expected a number from 0 to {most:g}, found {x!r}")


# ---- merging shard logs --------------------------------------------------------------------------

@dataclass
class MergedLogs:
    """Shard logs of one pass, merged.

    Attributes
    ----------
    settings
        The first log's settings (``shard`` set to ``None``).
    records
        Every trial once (the first record of an id), sorted by id.
    missing
        How many trials of the grid the settings describe no log holds.
    missing_ids
        Their ids (needle passes; layer-retention logs do not name their samples in the settings).
    shards
        The ``[i, n]`` of each log that recorded one.
    """

    settings: dict[str, Any]
    records: list[dict[str, Any]]
    missing: int
    missing_ids: list[str]
    shards: list[list[int]]


def merge_logs(paths: list[str | Path], allow_partial: bool = False) -> MergedLogs:
    """Merge the shard logs of one pass: settings must agree (shard aside), every record must be sound
    (:func:`check_trial_records`), and together the logs must hold the whole grid the settings describe.

    Parameters
    ----------
    allow_partial
        Merge even when trials of the grid are missing (a shard not given, or not finished); the
        profile then says how many (``trials.missing``).

    Raises
    ------
    HeadprobeError
        No logs, settings that differ, a shard given twice (or a log of the whole grid beside others),
        logs of different splits of the grid or written by different headprobe versions
        (:func:`check_shard_set`, :func:`check_one_version`), a record outside the grid, or missing trials
        without ``allow_partial`` (naming the shards that hold them and the first few ids).
    FileFormatError
        A record that is not sound, naming its file, line and field.
    """
    if not paths:
        raise HeadprobeError("merge: no trial logs given")
    settings, _ = read_profile_log(paths[0])
    merged: dict[str, dict[str, Any]] = {}
    where_of: dict[str, str] = {}
    shards: list[list[int]] = []
    given: list[tuple[str, dict[str, Any]]] = []
    for path in paths:
        other, numbered = read_profile_log(path)
        diff = settings_diff(settings, other)
        if diff:
            raise HeadprobeError(f"{path}: made with other settings than {paths[0]} ({', '.join(diff)})")
        given.append((str(path), other))
        check_shard_set(given)
        check_one_version(given)
        if other.get("shard"):
            shards.append(list(other["shard"]))
        located = [(f"{path}:{number}", r) for number, r in numbered]
        check_trial_records(settings, located)
        for where, r in located:
            if r["trial"] not in merged:
                merged[r["trial"]] = r
                where_of[r["trial"]] = where
    gap = steps_of_log(settings).missing_trials(settings, where_of, shards)
    missing, missing_ids = gap.count, gap.ids
    if missing and not allow_partial:
        raise HeadprobeError(f"merge: {gap.what}; give every shard's log (finish unfinished shards with "
                             f"{param('resume', True)}) or pass {param('allow_partial', True)} to merge what is there")
    return MergedLogs({**settings, "shard": None}, sorted(merged.values(), key=lambda r: r["trial"]), missing,
                      missing_ids, shards)


def _shard_of(name: str, settings: dict[str, Any]) -> tuple[int, int] | None:
    """A log's ``settings.shard``: ``None`` (the whole grid) or ``[i, n]`` with ``0 <= i < n``."""
    shard = settings.get("shard")
    if shard is None:
        return None
    if not (isinstance(shard, list) and len(shard) == 2 and all(is_count(x) for x in shard)
            and shard[0] < shard[1]):
        raise FileFormatError(name, "settings.shard", f"expected null or [i, n] with 0 <= i < n, found {_shown(shard)}")
    return shard[0], shard[1]


def check_shard_set(logs: list[tuple[str, dict[str, Any]]]) -> None:
    """Shard logs that can be merged: each a possible shard (``[i, n]``, ``0 <= i < n``), all of one split
    of the grid (one ``n``), none given twice; a log of the whole grid (``shard: null``) merges alone.
    ``logs``: ``(name, settings)`` of each log, in the order given; the last one is checked against the
    others.

    Raises
    ------
    FileFormatError
        An impossible ``settings.shard``, naming the log.
    HeadprobeError
        A shard given twice, a log of another split or of the whole grid beside shard logs, naming both logs.
    """
    name, settings = logs[-1]
    shard = _shard_of(name, settings)
    for other_name, other in logs[:-1]:
        theirs = _shard_of(other_name, other)
        if theirs == shard:
            what = "the whole grid (no shard)" if shard is None else f"shard {shard[0]}/{shard[1]}"
            raise HeadprobeError(f"{name}: {what} again ({other_name} is {what} too); give each shard's log once")
        if shard is None or theirs is None:
            whole, sharded = (name, other_name) if shard is None else (other_name, name)
            raise HeadprobeError(f"{whole}: a log of the whole grid (no shard) merges alone, not beside the shard "
                                 f"log {sharded}")
        if theirs[1] != shard[1]:
            raise HeadprobeError(f"{name}: shard {shard[0]}/{shard[1]}, but {other_name} is shard "
                                 f"{theirs[0]}/{theirs[1]}; merge the logs of one split of the grid (one n)")


def check_one_version(logs: list[tuple[str, dict[str, Any]]]) -> None:
    """Logs written by one headprobe version (``settings.headprobe_version``): a profile records one version,
    and the scores of two versions need not be the same measurement. ``logs`` as for
    :func:`check_shard_set`.

    Raises
    ------
    HeadprobeError
        Naming the two logs and their versions.
    """
    name, settings = logs[-1]
    first_name, first = logs[0]
    ours, theirs = settings.get("headprobe_version"), first.get("headprobe_version")
    if ours != theirs:
        raise HeadprobeError(f"{name}: written by headprobe {ours}, {first_name} by headprobe {theirs}; merge logs "
                             f"of one version (rerun the other version's shards with {param('force', True)})")


def profiles_from_log(settings: dict[str, Any], records: list[dict[str, Any]]) -> list[Profile]:
    """Every profile a log holds, averaged by its pass (retrieval logs give retrieval and enhanced-retrieval
    profiles).

    Raises
    ------
    NoPassingTrialsError
        When the pass can make no profile of the log.
    """
    return steps_of_log(settings).profiles(settings, records)
