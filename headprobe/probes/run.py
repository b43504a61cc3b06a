"""A profiling run: the trial grid of each probe pass, its trial log, and the profiles it yields."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError, NoPassingTrialsError, param
from ..files.jsonio import check_writable_dir
from ..files.log_lock import LogLock
from ..files.overwrite import check_overwrite
from ..files.trial_log import TrialLog, read_log_records, settings_diff
from ..haystack.context import build_context
from ..haystack.corpus import Haystack, load_haystack
from ..haystack.needles import Needle, check_needle_files, gather_needles, needle_file_list, needle_set_record
from ..haystack.prompt_format import prompt_format_of
from ..haystack.tasks import TaskSample, load_tasks
from ..models.registry import model_slug
from ..paths import haystacks_dir
from ..profile import Profile
from .aggregate import check_trial_records, gate_name, merge_logs, profiles_from_log, read_profile_log
from .early_stop import StopRule, check_stop_rule, run_until_stable
from .gates import GateChoice, check_gate, choose_gate
from .modes import DEFAULT_RECOMPUTE_SHARE, MODES, check_recompute_share
from .needle_probe import NeedleProbeConfig, run_needle_trials
from .prompt_cache import HaystackCaches
from .retention import RetentionConfig, run_retention_sample
from .selective_prefill import check_reuse_model
from .trial_grid import TrialSpec, make_grid, shard_samples, shard_trials
from .trial_order import spread_order

PROBES = ("retrieval", "enhanced_retrieval", "retrieval_reasoning", "layer_retention")
PASSES = {"retrieval": "retrieval", "enhanced_retrieval": "retrieval", "retrieval_reasoning": "reasoning",
          "layer_retention": "layer_retention"}

#: ``progress(total, description)`` returns a callable taking the number of finished trials.
ProgressFactory = Callable[[int, str], Any]


@dataclass
class ProfileRequest:
    """Everything a profiling run needs besides the model.

    Attributes
    ----------
    probes
        Subset of :data:`PROBES`.
    lengths, depths, seeds
        The needle grid (depths as fractions).
    needle_files
        Needle files of any kinds: each needle's ``kind`` decides which pass uses it, every file must hold
        needles of a requested pass, and a kind no file holds uses the shipped needle set (a
        ``{kind: path}`` mapping is read as its paths).
    needle_ids
        Restrict to these needle ids (``None`` for all).
    haystack
        Text file or folder, ``None`` for the shipped corpus.
    gate
        Retrieval-reasoning gate: ``"published"`` (QA-F1 > 0.5), ``"likelihood"`` (correct candidate
        more likely than the distractor), or ``"auto"``: likelihood for models under 1B parameters,
        published for larger ones (:func:`~headprobe.probes.gates.choose_gate`; the log and the profile
        record the choice).
    tasks, samples_per_task
        Layer-retention task types (``None``: all shipped) and samples per task.
    name
        File-name stem for logs and profiles (default: from the model name).
    split_attention
        Fast mode: split the prompt forward's attention into a pass over the cached prefix and a causal
        pass over the suffix (see :class:`~headprobe.probes.needle_probe.NeedleProbeConfig`).
    recompute_share
        Reuse mode: share (0 to 1) of the haystack after the needle recomputed per trial
        (:mod:`headprobe.probes.reuse_mode`).
    until_stable
        Run each needle pass in a spread order and stop once its top-k heads are stable across bootstrap
        resamples (:mod:`headprobe.probes.early_stop`); ``None`` runs the whole grid.
    """

    probes: list[str]
    lengths: list[int]
    depths: list[float]
    out_dir: Path
    mode: str = "fast"
    seeds: list[int] = field(default_factory=lambda: [0])
    needle_files: list[Path] | dict[str, Path] = field(default_factory=list)
    needle_ids: list[str] | None = None
    haystack: str | None = None
    chat_template: bool = True
    batch_size: int = 4
    max_new_tokens: int = 24
    gate: str = "published"
    group_reduction: str = "mean"
    tasks: list[str] | None = None
    samples_per_task: int | None = None
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    split_attention: bool = True
    recompute_share: float = DEFAULT_RECOMPUTE_SHARE
    until_stable: StopRule | None = None
    resume: bool = False
    force: bool = False
    shard: tuple[int, int] | None = None
    name: str | None = None


@dataclass
class ProfileResult:
    """What a run wrote (``stopping``: per needle pass, its early-stopping outcome when it had one)."""

    logs: list[Path]
    profiles: list[Path]
    trials_run: int
    trials_skipped: int
    failures: list[str] = field(default_factory=list)
    stopping: dict[str, Any] = field(default_factory=dict)


def _haystack_for_seed(base: Haystack, seed: int) -> Haystack:
    """Seed 0 keeps the corpus order; other seeds shuffle its documents (blank-line separated blocks)."""
    if seed == 0:
        return base
    import random

    docs = base.text.split("\n\n")
    random.Random(seed).shuffle(docs)
    return Haystack(f"{base.name}#seed{seed}", "\n\n".join(docs))


@dataclass
class ProfileOutputs:
    """The files a profiling run writes, by name (none of them need exist yet).

    Attributes
    ----------
    out_dir
        The folder they go in.
    logs
        Pass name → its trial log (``<stem>.<pass>[.shard<i>of<n>].trials.jsonl``).
    profiles
        Profile kind → its profile (``<stem>.<kind>.json``); empty for a shard run, which writes logs only.
    """

    out_dir: Path
    logs: dict[str, Path]
    profiles: dict[str, Path]


def profile_stem(request: ProfileRequest, model_name: str) -> str:
    """File-name stem of a run's logs and profiles: ``request.name``, else the model's slug."""
    return request.name or model_slug(model_name)


def profile_outputs(request: ProfileRequest, model_name: str) -> ProfileOutputs:
    """The logs and profiles a run of ``request`` on the model named ``model_name`` writes."""
    out_dir = Path(request.out_dir)
    stem = profile_stem(request, model_name)
    shard_suffix = f".shard{request.shard[0]}of{request.shard[1]}" if request.shard else ""
    logs = {p: out_dir / f"{stem}.{p}{shard_suffix}.trials.jsonl" for p in probe_passes(request.probes)}
    profiles = {} if request.shard else {k: out_dir / f"{stem}.{k}.json" for k in request.probes}
    return ProfileOutputs(out_dir, logs, profiles)


def check_profile_run(request: ProfileRequest, model_name: str,
                      profiles_of: ProfileRequest | None = None) -> ProfileOutputs:
    """Refuse a run before its model loads: unknown probes or modes, a grid of impossible values, needle
    ids or task types that do not exist, an output folder that cannot be written, an output that the
    run would replace, and a log that another run holds.

    An existing trial log needs ``resume`` (continue it) or ``force`` (start over); an existing profile
    needs ``force``, except that with ``resume`` a run may rewrite the profile its own log made (the
    profile's probe settings are the log's). Called by :func:`run_profile`; call it yourself to refuse
    before loading the model (the command line does).

    Parameters
    ----------
    profiles_of
        The request whose profiles this process will write, when not ``request`` itself: under
        ``torchrun`` a rank runs its shard of the grid (``request``) and rank 0 writes the whole grid's
        profiles (:func:`~headprobe.distributed.profile_ranks.check_profile_run_on_ranks`).

    Raises
    ------
    HeadprobeError
        Naming the parameter or the file.
    """
    check_request(request)
    for kind in ("retrieval", "reasoning"):
        if kind in probe_passes(request.probes):
            resolve_needles(request, kind)
    if "layer_retention" in request.probes:
        load_tasks(request.tasks, samples_per_task=request.samples_per_task)
    outputs = profile_outputs(request, model_name)
    check_writable_dir(outputs.out_dir)
    for log in outputs.logs.values():
        if log.exists() and not (request.resume or request.force):
            raise HeadprobeError(f"{log}: a trial log already exists; pass {param('resume', True)} to continue it "
                                 f"or {param('force', True)} to start over")
        LogLock(log).release()       # refused here if another run writes to it
    profiles = outputs.profiles if profiles_of is None else profile_outputs(profiles_of, model_name).profiles
    for kind, path in profiles.items():
        if path.exists() and not request.force:
            log = outputs.logs[PASSES[kind]]
            if not (request.resume and profile_made_by_log(path, log)):
                check_overwrite(path, False, hint=f"or choose another {param('out_dir')}"
                                + ("" if not request.resume else f" (it was not made from {log})"))
    return outputs


def profile_made_by_log(profile_path: Path, log_path: Path) -> bool:
    """Whether the profile at ``profile_path`` was made from the trial log at ``log_path``: its probe
    settings are the log's (shard, batch size, device and version aside)."""
    if not log_path.exists():
        return False
    try:
        settings, _ = read_log_records(log_path)
        probe = Profile.load(profile_path).probe
    except (HeadprobeError, OSError):
        return False
    ours = {k: v for k, v in settings.items() if k != "probes"}
    return not settings_diff(ours, {k: v for k, v in probe.items() if k != "kind"})


def run_profile(loaded, request: ProfileRequest, progress: ProgressFactory | None = None,
                version: str = "") -> ProfileResult:
    """Run the requested probes on a loaded model; append trials to logs; write profiles.

    Before any trial runs and before any log is written, everything is checked
    (:func:`check_profile_run`, then :func:`check_grid` with the model's tokenizer and context). Each pass
    (retrieval, reasoning, layer_retention) has its own trial log; a pass whose trials all fail their gate
    is reported in ``failures`` and the other passes still run. With ``request.shard`` set only the logs
    are written (merge them with :func:`merge_profile_logs`).
    """
    outputs = check_profile_run(request, loaded.identity.name)
    if request.mode == "reuse" and any(p != "layer_retention" for p in request.probes):
        check_reuse_model(loaded.model)
    base_haystack = load_haystack(request.haystack)
    common = common_settings(loaded, request, version)
    plans = [_plan_pass(loaded, request, common, p, base_haystack) for p in outputs.logs]
    result = ProfileResult([], [], 0, 0)
    stem = profile_stem(request, loaded.identity.name)
    for plan in plans:
        log_path = outputs.logs[plan.name]
        with TrialLog(log_path, plan.settings, resume=request.resume, force=request.force) as log:
            if log.where:
                check_trial_records(log.settings, [(log.where[t], r) for t, r in log.done.items()])
            if plan.name == "layer_retention":
                _retention_pass(loaded, request, plan, log, stem, progress, result)
            else:
                _needle_pass(loaded, request, plan, log, stem, progress, result)
        result.logs.append(log_path)
        if request.shard is None:
            _write_profiles(log, outputs, result)
    return result


def check_request(request: ProfileRequest) -> None:
    """Refuse unknown probes and modes, a grid of impossible values, and needle files no requested pass
    reads, before any work starts."""
    for probe in request.probes:
        if probe not in PROBES:
            raise HeadprobeError(f"{param('probes', probe)}: unknown probe; expected one of {', '.join(PROBES)}")
    if request.mode not in MODES:
        raise HeadprobeError(f"{param('mode', request.mode)}: expected fast or reference (exact) or reuse (approximate)")
    if request.mode == "reuse":
        check_recompute_share(request.recompute_share)
    if request.until_stable is not None:
        check_stop_rule(request.until_stable)
        if request.shard is not None:
            raise HeadprobeError(f"{param('until_stable')}: cannot stop early on a shard of the grid "
                                 f"({param('shard', '/'.join(map(str, request.shard)))}); run the whole grid")
    needles = any(PASSES[p] != "layer_retention" for p in request.probes)
    if needles and not (request.lengths and request.depths and request.seeds):
        raise HeadprobeError(f"{param('lengths')}, {param('depths')} and {param('seeds')}: give at least one of each")
    for length in request.lengths:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise HeadprobeError(f"{param('lengths', length)}: expected a positive number of tokens")
    for depth in request.depths:
        if not (isinstance(depth, (int, float)) and math.isfinite(depth) and 0 <= depth <= 1):
            raise HeadprobeError(f"{param('depths', depth)}: expected a depth between 0 and 1")
    check_gate(request.gate)
    check_needle_files(needle_file_list(request.needle_files), needle_kinds(request.probes))


def check_grid(loaded, request: ProfileRequest, kind: str, needles: list[Needle], haystack: Haystack) -> None:
    """Refuse lengths the model's context, the prompt around the haystack or the haystack cannot hold.

    Builds the prompt of every needle at the shortest length (the needle and question must leave room
    for haystack) and of one needle at the longest (the context and the haystack must hold it), with the
    model's tokenizer and chat template, before any trial runs.

    Raises
    ------
    HeadprobeError
        Naming ``lengths`` (and the needle, for a prompt too long for the shortest length).
    """
    max_context = loaded.identity.max_context
    for length in request.lengths:
        if max_context and length > max_context:
            raise HeadprobeError(f"{param('lengths', length)}: beyond the model's context of {max_context} tokens")
    shortest, longest = min(request.lengths), max(request.lengths)
    for needle in needles:
        try:
            build_context(loaded.tokenizer, haystack, needle, shortest, request.depths[0], request.chat_template,
                          max_context)
        except HeadprobeError as exc:
            raise HeadprobeError(f"{exc} ({kind} needle {needle.id})") from None
    build_context(loaded.tokenizer, haystack, needles[0], longest, request.depths[0], request.chat_template,
                  max_context)


def needle_kinds(probes: list[str]) -> set[str]:
    """The needle kinds (``"retrieval"``, ``"reasoning"``) the passes of ``probes`` read."""
    return {"retrieval" if p == "retrieval" else "reasoning" for p in probe_passes(probes)
            if p != "layer_retention"}


def probe_passes(probes: list[str]) -> list[str]:
    """The passes that run ``probes``, in the order the probes first name them (see :data:`PASSES`)."""
    return list(dict.fromkeys(PASSES[p] for p in probes))


def common_settings(loaded, request: ProfileRequest, version: str) -> dict[str, Any]:
    """Settings every pass's log records: the model and what applies to all probes."""
    return {
        "model": loaded.identity.to_json(), "mode": request.mode, "chat_template": request.chat_template,
        "prompt_format": prompt_format_of(loaded.tokenizer, request.chat_template),
        "headprobe_version": version, "group_reduction": request.group_reduction,
    }


def _shard_setting(request: ProfileRequest) -> list[int] | None:
    return list(request.shard) if request.shard else None


def retention_settings(common: dict[str, Any], request: ProfileRequest, samples: list[TaskSample]) -> dict[str, Any]:
    """The layer-retention pass's log settings."""
    retention = request.retention
    return {**common, "pass": "layer_retention", "probes": _pass_probes(request, "layer_retention"),
            "tasks": sorted({s.task for s in samples}), "samples": len(samples),
            "window": retention.window, "kernel_size": retention.kernel_size,
            "capacity": retention.capacity, "max_tokens": retention.max_tokens, "shard": _shard_setting(request)}


def portable_file_name(path: str | Path) -> tuple[str, bool]:
    """How files record a file they read: ``(name, shipped)``.

    A file headprobe ships is named by its place among the shipped haystacks (``needles/retrieval.jsonl``);
    a user's file by its path relative to the working directory of the run, so that a profile made on
    one machine names nothing of that machine's folders. Files record the file's fingerprint next to it.
    """
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(haystacks_dir().resolve()).as_posix(), True
    except ValueError:
        pass
    try:
        return Path(os.path.relpath(resolved, Path.cwd().resolve())).as_posix(), False
    except ValueError:   # another drive (Windows)
        return resolved.name, False


def needle_settings(common: dict[str, Any], request: ProfileRequest, pass_name: str, needle_paths: list[Path],
                    needles: list[Needle], haystack: Haystack, gate: GateChoice | None = None) -> dict[str, Any]:
    """A needle pass's log settings (``pass_name``: ``"retrieval"`` or ``"reasoning"``; ``gate``: the
    reasoning pass's gate, see :func:`~headprobe.probes.gates.choose_gate`).

    Each needle file is named portably (:func:`portable_file_name`) beside its fingerprint, as is a
    user's haystack.
    """
    haystack_name = haystack.name if request.haystack is None else portable_file_name(request.haystack)[0]
    return {**common, "pass": pass_name, "probes": _pass_probes(request, pass_name),
            "lengths": list(request.lengths), "depths": _rounded_depths(request), "seeds": list(request.seeds),
            "needle_set": needle_set_record(needle_paths, needles, portable_file_name),
            "haystack": {"name": haystack_name, "fingerprint": haystack.fingerprint},
            "gate": gate.gate if gate is not None else "published", **(gate.settings() if gate is not None else {}),
            "max_new_tokens": request.max_new_tokens, "shard": _shard_setting(request), **_approximation(request)}


def _approximation(request: ProfileRequest) -> dict[str, Any]:
    """Settings that make a run other than the exact full grid (absent otherwise, so older logs resume)."""
    out: dict[str, Any] = {}
    if request.mode == "reuse":
        out["recompute_share"] = request.recompute_share
    if request.until_stable is not None:
        out["until_stable"] = request.until_stable.to_json()
    return out


def _pass_probes(request: ProfileRequest, pass_name: str) -> list[str]:
    return [p for p in request.probes if PASSES[p] == pass_name]


def _rounded_depths(request: ProfileRequest) -> list[float]:
    return [round(d, 6) for d in request.depths]


def resolve_needles(request: ProfileRequest, kind: str) -> tuple[list[Path], list[Needle]]:
    """The needle files of a kind (the request's files that hold needles of that kind, else the shipped
    one) and their needles of that kind, restricted to ``request.needle_ids`` when given.

    Raises
    ------
    HeadprobeError
        When none of ``needle_ids`` is among them.
    """
    return gather_needles(needle_file_list(request.needle_files), kind, request.needle_ids)


@dataclass
class _PassPlan:
    """One pass, checked and ready to run: its settings and what it runs."""

    name: str
    settings: dict[str, Any]
    needles: list[Needle] = field(default_factory=list)
    haystack: Haystack | None = None
    samples: list[TaskSample] = field(default_factory=list)


def _plan_pass(loaded, request: ProfileRequest, common: dict[str, Any], pass_name: str,
               base_haystack: Haystack) -> _PassPlan:
    """Resolve a pass's needles or task samples, check its grid against the model, and build its settings."""
    if pass_name == "layer_retention":
        samples = [s for group in load_tasks(request.tasks, samples_per_task=request.samples_per_task).values()
                   for s in group]
        return _PassPlan(pass_name, retention_settings(common, request, samples), samples=samples)
    kind = "retrieval" if pass_name == "retrieval" else "reasoning"
    needle_paths, needles = resolve_needles(request, kind)
    check_grid(loaded, request, kind, needles, base_haystack)
    gate = choose_gate(request.gate, loaded) if pass_name == "reasoning" else None
    settings = needle_settings(common, request, pass_name, needle_paths, needles, base_haystack, gate)
    return _PassPlan(pass_name, settings, needles=needles, haystack=base_haystack)


def _retention_pass(loaded, request: ProfileRequest, plan: _PassPlan, log: TrialLog, stem: str,
                    progress: ProgressFactory | None, result: ProfileResult) -> None:
    """Run the layer-retention samples not yet in the log."""
    mine = shard_samples(plan.samples, request.shard)
    todo = [s for s in mine if s.id not in log]
    result.trials_skipped += len(mine) - len(todo)
    bar = progress(len(todo), f"{stem} layer_retention") if progress else None
    config = RetentionConfig(**{**request.retention.__dict__, "chat_template": request.chat_template})
    for sample in todo:
        log.append(run_retention_sample(loaded, sample, config))
        result.trials_run += 1
        if bar:
            bar(1)


def _needle_pass(loaded, request: ProfileRequest, plan: _PassPlan, log: TrialLog, stem: str,
                 progress: ProgressFactory | None, result: ProfileResult) -> None:
    """Run the needle trials of a pass (``"retrieval"`` or ``"reasoning"``) not yet in the log."""
    needles, settings = plan.needles, plan.settings
    grid = shard_trials(make_grid([n.id for n in needles], request.lengths, _rounded_depths(request), request.seeds),
                        request.shard)
    todo: list[TrialSpec] = [t for t in grid if t.id not in log]
    result.trials_skipped += len(grid) - len(todo)
    bar = progress(len(todo), f"{stem} {'+'.join(settings['probes'])} ({request.mode})") if progress else None
    config = NeedleProbeConfig(mode=request.mode, chat_template=request.chat_template,
                               batch_size=request.batch_size, max_new_tokens=request.max_new_tokens,
                               gate=settings["gate"], split_attention=request.split_attention,
                               recompute_share=request.recompute_share)
    haystacks = {s: _haystack_for_seed(plan.haystack, s) for s in request.seeds}
    by_id = {n.id: n for n in needles}
    logged_before = len(log.done)
    try:
        if request.until_stable is None:
            run_needle_trials(loaded, haystacks, by_id, todo, config, log.append, bar)
        else:
            caches = HaystackCaches(keep=len(request.lengths) * len(request.seeds))
            rule = request.until_stable
            gates = {kind: gate_name(kind, settings) for kind in _pass_kinds(plan.name, settings["probes"])}
            outcome = run_until_stable(
                spread_order(grid, rule.order_seed), log.done,
                lambda chunk: run_needle_trials(loaded, haystacks, by_id, chunk, config, log.append, bar, caches),
                gates, rule)
            result.stopping[plan.name] = outcome
    finally:
        result.trials_run += len(log.done) - logged_before


def _pass_kinds(pass_name: str, probes: list[str]) -> list[str]:
    """The score kinds a needle pass's profiles hold (retrieval passes: only the requested ones)."""
    kinds = ("retrieval", "enhanced_retrieval") if pass_name == "retrieval" else ("retrieval_reasoning",)
    return [k for k in kinds if k in probes]


def _write_profiles(log: TrialLog, outputs: ProfileOutputs, result: ProfileResult) -> None:
    """Write the profiles of a finished pass; a pass in which no trial passed goes to ``result.failures``."""
    try:
        profiles = profiles_from_log(log.settings, list(log.records()))
    except NoPassingTrialsError as exc:  # other passes still run; the log keeps every trial
        result.failures.append(str(exc))
        return
    for profile in profiles:
        path = outputs.profiles[profile.kind]
        profile.save(path)
        result.profiles.append(path)


def merge_profile_logs(paths: list[str | Path], out_dir: str | Path, name: str | None = None, force: bool = False,
                       allow_partial: bool = False) -> list[Path]:
    """Merge shard logs into profiles, written to ``out_dir``.

    The logs may belong to several passes of one run (``profile --merge out/*.shard*of4.trials.jsonl``):
    they are grouped by the pass their settings name, and each pass's logs are merged on their own. Every
    record is checked (one line naming the file, line and field of a bad one) and each pass's logs must
    hold every trial of the grid their settings describe, unless ``allow_partial``
    (:func:`~headprobe.probes.aggregate.merge_logs`). An existing profile is replaced only with ``force``;
    nothing is written unless every profile can be.
    """
    groups: dict[str, list[Path]] = {}
    for path in paths:
        settings, _ = read_profile_log(path)
        groups.setdefault(str(settings.get("pass")), []).append(Path(path))
    if not groups:
        raise HeadprobeError("merge: no trial logs given")
    out_dir = check_writable_dir(out_dir)
    planned: list[tuple[Profile, Path, int]] = []
    for group in groups.values():
        merged = merge_logs(group, allow_partial=allow_partial)
        stem = name or model_slug(merged.settings["model"]["name"])
        for profile in profiles_from_log({**merged.settings, "merged_shards": merged.shards}, merged.records):
            planned.append((profile, Path(out_dir) / f"{stem}.{profile.kind}.json", merged.missing))
    for _, path, _ in planned:
        check_overwrite(path, force, hint=f"or choose another {param('out_dir')}")
    for profile, path, missing in planned:
        if missing:
            profile.trials["missing"] = missing
        profile.save(path)
    return [path for _, path, _ in planned]


def load_profile(path: str | Path) -> Profile:
    return Profile.load(path)
