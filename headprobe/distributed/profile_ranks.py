"""A profiling run over the ranks of a ``torchrun`` launch: a slice of the trial grid each, merged at rank 0.

Each rank runs shard ``rank/world_size`` of every pass: the needle trials in whole prefix groups, dealt
round-robin (:func:`~headprobe.probes.trial_grid.shard_trials`), and every n-th layer-retention sample
(:func:`~headprobe.probes.trial_grid.shard_samples`). It appends to its own trial log,
``<stem>.<pass>.shard{i}of{n}.trials.jsonl``. When every rank has finished, rank 0 gathers the logs' trials
over the process group and writes the profiles a single process would have written from the same grid: the
scores are means over the same trials (``math.fsum``, so the order does not matter), the settings the same
but for the shard.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError, NoPassingTrialsError
from ..files.trial_log import read_log, settings_diff
from ..models.registry import model_slug
from ..probes.aggregate import profiles_from_log
from ..probes.run import (
    ProfileOutputs,
    ProfileRequest,
    ProfileResult,
    ProgressFactory,
    check_profile_run,
    replaces_own_profile,
    run_profile,
)
from .ranks import Ranks


def check_profile_run_on_ranks(request: ProfileRequest, model_name: str, ranks: Ranks) -> ProfileOutputs:
    """:func:`~headprobe.probes.run.check_profile_run` for this rank: its own shard's logs, and on rank 0
    the profiles of the whole grid, which it writes. With one rank this is ``check_profile_run``."""
    if not ranks.distributed:
        return check_profile_run(request, model_name)
    ranks.check_shard(request.shard)
    mine = dataclasses.replace(request, shard=ranks.shard)
    return check_profile_run(mine, model_name, profiles_of=request if ranks.is_main else None)


def run_profile_on_ranks(loaded: Any, request: ProfileRequest, ranks: Ranks,
                         progress: ProgressFactory | None = None, version: str = "") -> ProfileResult:
    """:func:`~headprobe.probes.run.run_profile` with the grid split over ``ranks``; rank 0 writes the profiles.

    With one rank this is ``run_profile``. Each rank resumes its own log with ``request.resume``, so a
    launch in which a rank died is rerun with ``resume`` and redoes no finished trial.

    Returns
    -------
    ProfileResult
        On rank 0: every rank's logs, the profiles written, and the trial counts of all ranks together.
        On the others: this rank's logs and counts (no profiles).

    Raises
    ------
    HeadprobeError
        ``request.shard`` set as well (the ranks already split the grid), or logs whose settings differ
        between ranks.
    """
    if not ranks.distributed:
        return run_profile(loaded, request, progress, version)
    ranks.check_shard(request.shard)
    mine = dataclasses.replace(request, shard=ranks.shard)
    result = run_profile(loaded, mine, progress if ranks.is_main else None, version)
    share = {"logs": [str(p) for p in result.logs], "trials_run": result.trials_run,
             "trials_skipped": result.trials_skipped,
             "passes": [{"settings": s, "trials": t} for s, t in (read_log(p) for p in result.logs)]}
    shares = ranks.gather_json(share)
    if shares is None:
        return result
    merged = ProfileResult(logs=[Path(p) for s in shares for p in s["logs"]], profiles=[],
                           trials_run=sum(s["trials_run"] for s in shares),
                           trials_skipped=sum(s["trials_skipped"] for s in shares))
    out_dir = Path(request.out_dir)
    stem = request.name or model_slug(loaded.identity.name)
    for index in range(len(shares[0]["passes"])):
        settings, trials = merge_pass([s["passes"][index] for s in shares], [s["logs"][index] for s in shares])
        try:
            profiles = profiles_from_log(settings, trials)
        except NoPassingTrialsError as exc:      # the other passes still count, as in one process
            merged.failures.append(str(exc))
            continue
        for profile in profiles:
            path = out_dir / f"{stem}.{profile.kind}.json"
            profile.save(path, force=replaces_own_profile(request, path, Path(shares[0]["logs"][index])))
            merged.profiles.append(path)
    return merged


def merge_pass(parts: list[dict[str, Any]], logs: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One pass's settings and trials from every rank's log of it.

    The settings must agree but for what a resumed run may change (the shard among them); the merged
    settings say ``shard: null``, as a single process's do. Trials are deduplicated by id and sorted.

    Raises
    ------
    HeadprobeError
        A rank whose log was made with other settings.
    """
    settings = {**parts[0]["settings"], "shard": None}
    merged: dict[str, dict[str, Any]] = {}
    for part, log in zip(parts, logs):
        other = part["settings"]
        diff = settings_diff(settings, other)
        if diff:
            raise HeadprobeError(f"{log}: made with other settings than {logs[0]} ({', '.join(diff)})")
        for trial in part["trials"]:
            merged.setdefault(trial["trial"], trial)
    return settings, sorted(merged.values(), key=lambda t: t["trial"])
