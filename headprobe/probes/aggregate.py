"""Turning trial logs into profiles: mean scores over passing trials, per-needle pass rates, merging shards."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import HeadprobeError, NoPassingTrialsError, param
from ..files.trial_log import _RESUME_FREE, read_log
from ..models.identity import ModelIdentity
from ..profile import LayerRetention, Profile, reduce_groups
from .bootstrap import BootstrapSettings, interval_block, top_k_jaccard
from .early_stop import StopRule


def gate_name(kind: str, settings: dict[str, Any]) -> str:
    """The gate a trial of this kind must pass: ``"published"`` or (reasoning, on request) ``"likelihood"``."""
    return settings.get("gate", "published") if kind == "retrieval_reasoning" else "published"


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
        hint = f" or {param('gate', 'likelihood')}" if kind == "retrieval_reasoning" else ""
        raise NoPassingTrialsError(
            f"{kind}: none of the {len(records)} trials passed the {gate} gate, so there is nothing to average; "
            f"try shorter {param('lengths')}, other {param('needle_ids')}{hint} (see the responses in the trial log)"
        )
    layers, heads = identity.num_layers, identity.num_query_heads
    mean = [[math.fsum(r["scores"][kind][l][h] for r in passed) / len(passed) for h in range(heads)]
            for l in range(layers)]
    by_gate: dict[str, int] = {}
    for r in records:
        for name in ("published", "likelihood"):
            if name in r["gates"]:
                by_gate[name] = by_gate.get(name, 0) + int(bool(r["gates"][name]))
    probe = {**{k: v for k, v in settings.items() if k not in ("probes",)}, "kind": kind}
    trials = {"total": len(records), "passed": len(passed), "gate": gate, "passed_by_gate": by_gate,
              "per_needle": dict(sorted(per_needle.items())),
              "mean_seconds": round(math.fsum(r.get("seconds", 0.0) for r in records) / len(records), 3)}
    per_trial = np.array([r["scores"][kind] for r in passed], dtype=np.float64)   # [passed, layers, heads]
    if settings.get("until_stable"):
        trials["stopping"] = stopping_block(settings, len(records), per_trial, StopRule.from_json(settings["until_stable"]))
    return Profile(kind=kind, model=identity, probe=probe, trials=trials, query_heads=mean,
                   kv_heads=reduce_groups(mean, identity.group_size, group_reduction),
                   group_reduction=group_reduction, intervals=interval_block(per_trial, BootstrapSettings()))


def grid_size(settings: dict[str, Any]) -> int:
    """Trials in a needle pass's grid: lengths × depths × seeds × needles."""
    return (len(settings.get("lengths", [])) * len(settings.get("depths", [])) * len(settings.get("seeds", [0]))
            * len(settings.get("needle_set", {}).get("ids", [])))


def stopping_block(settings: dict[str, Any], trials_run: int, per_trial: np.ndarray, rule: StopRule) -> dict[str, Any]:
    """``trials.stopping`` of an early-stopped profile: the rule, how many grid trials ran, and the top-k
    Jaccard index of this kind's passing trials (whether the rule holds for it)."""
    jaccard = (top_k_jaccard(per_trial, rule.k, rule.bootstrap) if len(per_trial) >= rule.min_passed else None)
    return {"rule": rule.to_json(), "trials_run": trials_run, "grid_trials": grid_size(settings),
            "jaccard": None if jaccard is None else round(jaccard, 4),
            "stable": jaccard is not None and jaccard >= rule.jaccard}


def retention_profile(identity: ModelIdentity, settings: dict[str, Any], records: list[dict[str, Any]]) -> Profile:
    """Layer-retention profile: per task type, mean and standard deviation of each layer's share."""
    by_task: dict[str, list[list[float]]] = {}
    for r in records:
        by_task.setdefault(r["task"], []).append(r["retention"])
    if not by_task:
        raise NoPassingTrialsError("layer_retention: no samples were run")
    retention = {}
    for task, rows in sorted(by_task.items()):
        n = len(rows)
        mean = [math.fsum(row[l] for row in rows) / n for l in range(identity.num_layers)]
        std = [math.sqrt(math.fsum((row[l] - mean[l]) ** 2 for row in rows) / n) for l in range(identity.num_layers)]
        retention[task] = LayerRetention(mean=mean, std=std, samples=n)
    keys = ("window", "kernel_size", "capacity", "max_tokens")
    probe = {**{k: v for k, v in settings.items() if k not in ("probes",)}, "kind": "layer_retention"}
    trials = {"total": len(records), "passed": len(records),
              "per_task": {t: len(v) for t, v in sorted(by_task.items())}}
    return Profile(kind="layer_retention", model=identity, probe=probe, trials=trials, retention=retention,
                   retention_settings={k: settings.get(k) for k in keys if k in settings})


def merge_logs(paths: list[str | Path]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Merge shard logs of one run: settings must agree (shard aside); trials are deduplicated by id."""
    if not paths:
        raise HeadprobeError("merge: no trial logs given")
    settings, records = read_log(paths[0])
    merged = {r["trial"]: r for r in records}
    for path in paths[1:]:
        other, more = read_log(path)
        diff = sorted(k for k in set(settings) | set(other)
                      if k not in _RESUME_FREE and settings.get(k) != other.get(k))
        if diff:
            raise HeadprobeError(f"{path}: made with other settings than {paths[0]} ({', '.join(diff)})")
        for r in more:
            merged.setdefault(r["trial"], r)
    return settings, sorted(merged.values(), key=lambda r: r["trial"])


def profiles_from_log(settings: dict[str, Any], records: list[dict[str, Any]]) -> list[Profile]:
    """Every profile a log holds (retrieval logs give retrieval and enhanced-retrieval profiles)."""
    identity = ModelIdentity.from_json(settings["model"], "<trial log>")
    reduction = settings.get("group_reduction", "mean")
    if settings["pass"] == "layer_retention":
        return [retention_profile(identity, settings, records)]
    kinds = ("retrieval", "enhanced_retrieval") if settings["pass"] == "retrieval" else ("retrieval_reasoning",)
    wanted = [k for k in kinds if k in settings.get("probes", kinds)]
    profiles, failures = [], []
    for kind in wanted:
        try:
            profiles.append(needle_profile(kind, identity, settings, records, reduction))
        except NoPassingTrialsError as exc:
            failures.append(str(exc))
    if failures and not profiles:
        raise NoPassingTrialsError("; ".join(failures))
    return profiles
