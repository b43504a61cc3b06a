"""A profiling run over the ranks of a ``torchrun`` launch: a slice of the trial grid each, merged at rank 0.

Each rank runs shard ``rank/world_size`` of every pass: the needle trials in whole prefix groups, dealt
round-robin (:func:`~headprobe.probes.trial_grid.shard_trials`), and every n-th layer-retention sample
(:func:`~headprobe.probes.trial_grid.shard_samples`). It appends to its own trial log,
``<stem>.<pass>.shard{i}of{n}.trials.jsonl`` (a rank dealt no trial of a pass writes no log of it). When every rank has finished, rank 0 gathers the logs' trials
over the process group and writes the profiles a single process would have written from the same grid: the
scores are means over the same trials (``math.fsum``, so the order does not matter), the settings the same
but for the shard.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import HeadprobeError
from ..files.trial_log import read_log, settings_diff
from ..probes.aggregate import check_one_version, check_shard_set
from ..probes.plan import ProfilePlan, ResolvedProfile, check_profile_run
from ..probes.request import ProfileRequest
from ..probes.run import ProfileResult, ProgressFactory, resolve_profile, run_profile, write_log_profiles
from .ranks import Ranks

if TYPE_CHECKING:
    from ..models.loading import LoadedModel


def check_profile_run_on_ranks(request: ProfileRequest, model_name: str, ranks: Ranks) -> ProfilePlan:
    """:func:`~headprobe.probes.plan.check_profile_run` for this rank: its own shard's logs, and on rank 0
    the profiles of the whole grid, which it writes. With one rank this is ``check_profile_run``."""
    if not ranks.distributed:
        return check_profile_run(request, model_name)
    ranks.check_shard(request.shard)
    mine = dataclasses.replace(request, shard=ranks.shard)
    return check_profile_run(mine, model_name, profiles_of=request if ranks.is_main else None)


def run_profile_on_ranks(lm: LoadedModel, request: ProfileRequest | ProfilePlan | ResolvedProfile,
                         ranks: Ranks, progress: ProgressFactory | None = None,
                         version: str = "") -> ProfileResult:
    """:func:`~headprobe.probes.run.run_profile` with the grid split over ``ranks``; rank 0 writes the profiles.

    With one rank this is ``run_profile``. ``request`` is a request (checked here for this rank) or this
    rank's plan (:func:`check_profile_run_on_ranks`), resolved or not. Each rank resumes its own log with
    ``request.resume``, so a launch in which a rank died is rerun with ``resume`` and redoes no finished
    trial.

    Returns
    -------
    ProfileResult
        On rank 0: every rank's logs, the profiles written, and the trial counts of all ranks together.
        On the others: this rank's logs and counts (no profiles).

    Raises
    ------
    HeadprobeError
        ``request.shard`` set as well (the ranks already split the grid), a plan made for another rank,
        or logs whose settings differ between ranks.
    """
    if not ranks.distributed:
        return run_profile(lm, request, progress, version)
    if isinstance(request, ProfileRequest):
        request = check_profile_run_on_ranks(request, lm.identity.name, ranks)
    resolved = resolve_profile(lm, request, version)
    plan = resolved.plan
    if plan.request.shard != ranks.shard:
        raise HeadprobeError(f"rank {ranks.rank}: the run was checked for shard {plan.request.shard}, not "
                             f"{ranks.shard} (check it with check_profile_run_on_ranks)")
    result = run_profile(lm, resolved, progress if ranks.is_main else None)
    parts = []
    for run in resolved.passes:          # a pass of which this rank was dealt nothing has no log
        logged = run.plan.log in result.logs
        settings, trials = read_log(run.plan.log) if logged else (run.settings, [])
        parts.append({"log": str(run.plan.log) if logged else None, "settings": settings, "trials": trials})
    share = {"logs": [str(p) for p in result.logs], "trials_run": result.trials_run,
             "trials_skipped": result.trials_skipped, "passes": parts}
    shares = ranks.gather_json(share)
    if shares is None:
        return result
    merged = ProfileResult(logs=[Path(p) for s in shares for p in s["logs"]], profiles=[],
                           trials_run=sum(s["trials_run"] for s in shares),
                           trials_skipped=sum(s["trials_skipped"] for s in shares))
    for index in range(len(shares[0]["passes"])):
        parts = [s["passes"][index] for s in shares]
        settings, trials = merge_pass(parts)
        own_log = next((Path(p["log"]) for p in parts if p.get("log")), None)    # any shard log of the pass
        write_log_profiles(settings, trials, plan.outputs.out_dir, plan.stem, merged, plan.request, own_log)
    return merged


def merge_pass(parts: list[dict[str, Any]], logs: list[str] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One pass's settings and trials from every rank's part of it: ``{"settings", "trials"}`` and the
    rank's log, ``"log"`` (``None`` for a rank that was dealt no trial of the pass and wrote no log), or,
    for parts without it, ``logs[i]``.

    The logs' settings must agree but for what a resumed run may change (the shard among them), and they
    must have been written by one headprobe version with one shard each
    (:func:`~headprobe.probes.aggregate.check_one_version`,
    :func:`~headprobe.probes.aggregate.check_shard_set`); the merged settings say ``shard: null``, as a
    single process's do. Trials are deduplicated by id and sorted.

    Raises
    ------
    HeadprobeError
        A rank whose log was made with other settings or by another version.
    """
    parts = [{**p, "log": p["log"] if "log" in p else (logs[i] if logs else f"rank {i}")} for i, p in enumerate(parts)]
    logged = [p for p in parts if p["log"] is not None] or parts[:1]
    settings = {**logged[0]["settings"], "shard": None}
    merged: dict[str, dict[str, Any]] = {}
    seen: list[tuple[str, dict[str, Any]]] = []
    for part in logged:
        name, other = str(part["log"]), part["settings"]
        diff = settings_diff(settings, other)
        if diff:
            raise HeadprobeError(f"{name}: made with other settings than {logged[0]['log']} ({', '.join(diff)})")
        seen.append((name, other))
        check_shard_set(seen)
        check_one_version(seen)
        for trial in part["trials"]:
            merged.setdefault(trial["trial"], trial)
    return settings, sorted(merged.values(), key=lambda t: t["trial"])
