"""A profiling run: each pass's trials appended to its log, and the profiles the logs yield.

:func:`run_profile` takes a request (checked and resolved here), a plan checked before the model loaded
(:func:`~headprobe.probes.plan.check_profile_run`) or a run already resolved for the model
(:meth:`~headprobe.probes.plan.ProfilePlan.resolve`), and runs its passes in turn
(:mod:`headprobe.probes.pass_steps`). :func:`merge_profile_logs` turns the shard logs of a run into its
profiles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import HeadprobeError, NoPassingTrialsError
from ..files.jsonio import check_writable_dir
from ..files.trial_log import TrialLog
from ..profile import Profile
from .aggregate import check_trial_records, merge_logs, read_profile_log
from .outputs import check_name, profile_stem, profiles_to_write, replaces_own_profile, write_profiles
from .pass_steps import PassRun
from .plan import ProfilePlan, ResolvedProfile, check_profile_run
from .request import ProfileRequest

if TYPE_CHECKING:
    from ..models.loading import LoadedModel

#: ``progress(total, description)`` returns a callable taking the number of finished trials.
ProgressFactory = Callable[[int, str], Any]


@dataclass
class ProfileResult:
    """What a run wrote (``stopping``: per needle pass, its early-stopping outcome when it had one)."""

    logs: list[Path]
    profiles: list[Path]
    trials_run: int
    trials_skipped: int
    failures: list[str] = field(default_factory=list)
    stopping: dict[str, Any] = field(default_factory=dict)


def resolve_profile(lm: LoadedModel, run: ProfileRequest | ProfilePlan | ResolvedProfile,
                    version: str = "") -> ResolvedProfile:
    """``run`` resolved for ``lm``: a request is checked first (:func:`check_profile_run`), a plan
    resolved (:meth:`ProfilePlan.resolve`); a resolved run must be the loaded model's."""
    if isinstance(run, ProfileRequest):
        run = check_profile_run(run, lm.identity.name)
    if isinstance(run, ProfilePlan):
        return run.resolve(lm, version)
    if run.passes and run.passes[0].context.common["model"] != lm.identity.to_json():
        raise HeadprobeError(f"the run was resolved for {run.plan.model_name}, not {lm.identity.name}")
    return run


def run_profile(lm: LoadedModel, request: ProfileRequest | ProfilePlan | ResolvedProfile,
                progress: ProgressFactory | None = None, version: str = "") -> ProfileResult:
    """Run the requested probes on a loaded model; append trials to logs; write profiles.

    Before any trial runs and before any log is written, everything is checked: the request, its input
    and outputs (:func:`~headprobe.probes.plan.check_profile_run`, unless ``request`` is already a plan),
    then the grid, gate and prompts on the model (:meth:`~headprobe.probes.plan.ProfilePlan.resolve`,
    unless it is already resolved). Each pass has its own trial log; a pass whose trials all fail their
    gate is reported in ``failures`` and the other passes still run. With ``request.shard`` set only the
    logs are written (merge them with :func:`merge_profile_logs`); a shard that holds no trial of a pass
    writes no log of it (``logs`` leaves it out).

    Parameters
    ----------
    version
        The headprobe version the logs record (when ``request`` is not yet resolved).
    """
    resolved = resolve_profile(lm, request, version)
    plan = resolved.plan
    result = ProfileResult([], [], 0, 0)
    for run in resolved.passes:
        log_path = run.plan.log
        if not run.steps.trials(run) and not log_path.exists():
            continue        # a shard the grid leaves empty (a torchrun rank beyond its groups) writes no log
        with TrialLog(log_path, run.settings, resume=plan.request.resume, force=plan.request.force) as log:
            if log.where:
                check_trial_records(log.settings, [(log.where[t], r) for t, r in log.done.items()])
            _run_pass(lm, run, log, plan.stem, progress, result)
        result.logs.append(log_path)
        if plan.request.shard is None:       # a shard (or a torchrun rank) writes its log only
            write_log_profiles(log.settings, list(log.records()), plan.outputs.out_dir, plan.stem, result,
                               plan.request, log_path)
    return result


def _run_pass(lm: LoadedModel, run: PassRun, log: TrialLog, stem: str, progress: ProgressFactory | None,
              result: ProfileResult) -> None:
    """Run the trials of this shard of a pass that are not yet in its log."""
    trials = run.steps.trials(run)
    todo = [t for t in trials if t.id not in log]
    result.trials_skipped += len(trials) - len(todo)
    bar = progress(len(todo), f"{stem} {run.steps.progress_label(run)}") if progress else None
    logged_before = len(log.done)
    try:
        outcome = run.steps.run(lm, run, todo, log, bar)
    finally:
        result.trials_run += len(log.done) - logged_before
    if outcome is not None:
        result.stopping[run.plan.probe_pass.name] = outcome


def write_log_profiles(settings: dict[str, Any], records: list[dict[str, Any]], out_dir: Path, stem: str,
                       result: ProfileResult, request: ProfileRequest, log: Path | None) -> None:
    """Write the profiles of a finished pass's log (a run's, or its ranks' merged); a pass in which no
    trial passed goes to ``result.failures`` (the other passes still count; the log keeps every trial).

    An existing profile is replaced with ``request.force``, or with ``request.resume`` when ``log`` made it
    (:func:`~headprobe.probes.outputs.replaces_own_profile`); any other is refused as it is written.
    """
    try:
        planned = profiles_to_write(settings, records, out_dir, stem)
    except NoPassingTrialsError as exc:
        result.failures.append(str(exc))
        return
    result.profiles.extend(write_profiles(
        planned, overwrite=lambda path: replaces_own_profile(request.force, request.resume, path, log)))


def merge_profile_logs(paths: list[str | Path], out_dir: str | Path, name: str | None = None, force: bool = False,
                       allow_partial: bool = False) -> list[Path]:
    """Merge shard logs into profiles, written to ``out_dir``.

    The logs may belong to several passes of one run (``profile --merge out/*.shard*of4.trials.jsonl``):
    they are grouped by the pass their settings name, and each pass's logs are merged on their own. Every
    record is checked (one line naming the file, line and field of a bad one) and each pass's logs must
    hold every trial of the grid their settings describe, unless ``allow_partial``
    (:func:`~headprobe.probes.aggregate.merge_logs`). An existing profile is replaced only with ``force``;
    nothing is written unless every profile can be. ``name`` (the profiles' file-name stem, default the
    model's) must be a plain name (:func:`~headprobe.probes.outputs.check_name`).
    """
    check_name(name)
    groups: dict[str, list[Path]] = {}
    for path in paths:
        settings, _ = read_profile_log(path)
        groups.setdefault(str(settings.get("pass")), []).append(Path(path))
    if not groups:
        raise HeadprobeError("merge: no trial logs given")
    out_dir = check_writable_dir(out_dir)
    planned: list[tuple[Profile, Path]] = []
    for group in groups.values():
        merged = merge_logs(group, allow_partial=allow_partial)
        stem = profile_stem(name, merged.settings["model"]["name"])
        planned += profiles_to_write({**merged.settings, "merged_shards": merged.shards}, merged.records,
                                     out_dir, stem, missing=merged.missing)
    return write_profiles(planned, overwrite=force)
