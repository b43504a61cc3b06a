"""A profiling run: the trial grid of each probe pass, its trial log, and the profiles it yields."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError, NoPassingTrialsError, param
from ..files.jsonio import check_writable_dir
from ..files.trial_log import TrialLog
from ..haystack.corpus import Haystack, load_haystack
from ..haystack.needles import Needle, load_needles, needle_set_fingerprint, shipped_needle_file
from ..haystack.tasks import TaskSample, load_tasks
from ..models.registry import model_slug
from ..profile import Profile
from .aggregate import gate_name, profiles_from_log
from .early_stop import StopRule, check_stop_rule, run_until_stable
from .needle_probe import NeedleProbeConfig, run_needle_trials
from .prompt_cache import HaystackCaches
from .retention import RetentionConfig, run_retention_sample
from .reuse_mode import DEFAULT_RECOMPUTE_SHARE, check_recompute_share
from .selective_prefill import check_reuse_model
from .trial_grid import TrialSpec, make_grid, shard_trials
from .trial_order import spread_order

PROBES = ("retrieval", "enhanced_retrieval", "retrieval_reasoning", "layer_retention")
MODES = ("fast", "reference", "reuse")
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
        ``{"retrieval": path, "reasoning": path}``; missing kinds use the shipped needle sets.
    needle_ids
        Restrict to these needle ids (``None`` for all).
    haystack
        Text file or folder, ``None`` for the shipped corpus.
    gate
        Retrieval-reasoning gate: ``"published"`` (QA-F1 > 0.5) or ``"likelihood"`` (correct candidate
        more likely than the distractor).
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
    needle_files: dict[str, Path] = field(default_factory=dict)
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
class _Run:
    """What the passes of one run share; each pass adds its trial counts to ``result``."""

    loaded: Any
    request: ProfileRequest
    common: dict[str, Any]
    stem: str
    progress: ProgressFactory | None
    result: ProfileResult


def run_profile(loaded, request: ProfileRequest, progress: ProgressFactory | None = None,
                version: str = "") -> ProfileResult:
    """Run the requested probes on a loaded model; append trials to logs; write profiles.

    Each pass (retrieval, reasoning, layer_retention) has its own trial log; a pass whose trials all
    fail their gate is reported in ``failures`` and the other passes still run. With ``request.shard``
    set only the logs are written (merge them with :func:`merge_profile_logs`).
    """
    check_request(request)
    if request.mode == "reuse" and any(p != "layer_retention" for p in request.probes):
        check_reuse_model(loaded.model)
    out_dir = check_writable_dir(request.out_dir)
    stem = request.name or model_slug(loaded.identity.name)
    shard_suffix = f".shard{request.shard[0]}of{request.shard[1]}" if request.shard else ""
    base_haystack = load_haystack(request.haystack)
    run = _Run(loaded, request, common_settings(loaded, request, version), stem, progress, ProfileResult([], [], 0, 0))
    for pass_name in probe_passes(request.probes):
        log_path = out_dir / f"{stem}.{pass_name}{shard_suffix}.trials.jsonl"
        if pass_name == "layer_retention":
            log = _retention_pass(run, log_path)
        else:
            log = _needle_pass(run, pass_name, base_haystack, log_path)
        run.result.logs.append(log_path)
        if request.shard is None:
            _write_profiles(log, out_dir, stem, run.result)
    return run.result


def check_request(request: ProfileRequest) -> None:
    """Refuse unknown probes and modes before any work starts."""
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


def probe_passes(probes: list[str]) -> list[str]:
    """The passes that run ``probes``, in the order the probes first name them (see :data:`PASSES`)."""
    return list(dict.fromkeys(PASSES[p] for p in probes))


def common_settings(loaded, request: ProfileRequest, version: str) -> dict[str, Any]:
    """Settings every pass's log records: the model and what applies to all probes."""
    return {
        "model": loaded.identity.to_json(), "mode": request.mode, "chat_template": request.chat_template,
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


def needle_settings(common: dict[str, Any], request: ProfileRequest, pass_name: str, needle_path: Path,
                    needles: list[Needle], haystack: Haystack) -> dict[str, Any]:
    """A needle pass's log settings (``pass_name``: ``"retrieval"`` or ``"reasoning"``)."""
    return {**common, "pass": pass_name, "probes": _pass_probes(request, pass_name),
            "lengths": list(request.lengths), "depths": _rounded_depths(request), "seeds": list(request.seeds),
            "needle_set": {"path": str(needle_path), "fingerprint": needle_set_fingerprint(needle_path),
                           "ids": [n.id for n in needles]},
            "haystack": {"name": haystack.name, "fingerprint": haystack.fingerprint},
            "gate": request.gate if pass_name == "reasoning" else "published",
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


def resolve_needles(request: ProfileRequest, kind: str) -> tuple[Path, list[Needle]]:
    """The needle file of a kind (the request's, else the shipped one) and its needles, restricted to
    ``request.needle_ids`` when given.

    Raises
    ------
    HeadprobeError
        When none of ``needle_ids`` is in the file, or the file holds needles of another kind.
    """
    needle_path = Path(request.needle_files.get(kind) or shipped_needle_file(kind))
    needles = load_needles(needle_path)
    if request.needle_ids:
        chosen = [n for n in needles if n.id in set(request.needle_ids)]
        if not chosen:
            raise HeadprobeError(f"{param('needle_ids')}: none of {', '.join(request.needle_ids)} is in {needle_path}")
        needles = chosen
    wrong = [n.id for n in needles if n.kind != kind]
    if wrong:
        raise HeadprobeError(f"{needle_path}: needles {', '.join(wrong)} are not of kind '{kind}'")
    return needle_path, needles


def _check_lengths(loaded, lengths: list[int]) -> None:
    max_context = loaded.identity.max_context
    for length in lengths:
        if max_context and length > max_context:
            raise HeadprobeError(f"{param('lengths', length)}: beyond the model's context of {max_context} tokens")


def _retention_pass(run: _Run, log_path: Path) -> TrialLog:
    """Run the layer-retention samples not yet in the log."""
    request, result = run.request, run.result
    samples = [s for group in load_tasks(request.tasks, samples_per_task=request.samples_per_task).values()
               for s in group]
    log = TrialLog(log_path, retention_settings(run.common, request, samples), resume=request.resume,
                   force=request.force)
    todo = [s for s in samples if s.id not in log]
    result.trials_skipped += len(samples) - len(todo)
    bar = run.progress(len(todo), f"{run.stem} layer_retention") if run.progress else None
    config = RetentionConfig(**{**request.retention.__dict__, "chat_template": request.chat_template})
    for sample in todo:
        log.append(run_retention_sample(run.loaded, sample, config))
        result.trials_run += 1
        if bar:
            bar(1)
    return log


def _needle_pass(run: _Run, pass_name: str, base_haystack: Haystack, log_path: Path) -> TrialLog:
    """Run the needle trials of a pass (``"retrieval"`` or ``"reasoning"``) not yet in the log."""
    request, result = run.request, run.result
    kind = "retrieval" if pass_name == "retrieval" else "reasoning"
    needle_path, needles = resolve_needles(request, kind)
    _check_lengths(run.loaded, request.lengths)
    settings = needle_settings(run.common, request, pass_name, needle_path, needles, base_haystack)
    log = TrialLog(log_path, settings, resume=request.resume, force=request.force)
    grid = shard_trials(make_grid([n.id for n in needles], request.lengths, _rounded_depths(request), request.seeds),
                        request.shard)
    todo: list[TrialSpec] = [t for t in grid if t.id not in log]
    result.trials_skipped += len(grid) - len(todo)
    probes_here = settings["probes"]
    bar = run.progress(len(todo), f"{run.stem} {'+'.join(probes_here)} ({request.mode})") if run.progress else None
    config = NeedleProbeConfig(mode=request.mode, chat_template=request.chat_template,
                               batch_size=request.batch_size, max_new_tokens=request.max_new_tokens,
                               gate=settings["gate"], split_attention=request.split_attention,
                               recompute_share=request.recompute_share)
    haystacks = {s: _haystack_for_seed(base_haystack, s) for s in request.seeds}
    by_id = {n.id: n for n in needles}
    logged_before = len(log.done)
    if request.until_stable is None:
        run_needle_trials(run.loaded, haystacks, by_id, todo, config, log.append, bar)
    else:
        caches = HaystackCaches(keep=len(request.lengths) * len(request.seeds))
        rule = request.until_stable
        gates = {kind: gate_name(kind, settings) for kind in _pass_kinds(pass_name, probes_here)}
        outcome = run_until_stable(
            spread_order(grid, rule.order_seed), log.done,
            lambda chunk: run_needle_trials(run.loaded, haystacks, by_id, chunk, config, log.append, bar, caches),
            gates, rule)
        result.stopping[pass_name] = outcome
    result.trials_run += len(log.done) - logged_before
    return log


def _pass_kinds(pass_name: str, probes: list[str]) -> list[str]:
    """The score kinds a needle pass's profiles hold (retrieval passes: only the requested ones)."""
    kinds = ("retrieval", "enhanced_retrieval") if pass_name == "retrieval" else ("retrieval_reasoning",)
    return [k for k in kinds if k in probes]


def _write_profiles(log: TrialLog, out_dir: Path, stem: str, result: ProfileResult) -> None:
    """Write the profiles of a finished pass; a pass in which no trial passed goes to ``result.failures``."""
    try:
        profiles = profiles_from_log(log.settings, list(log.records()))
    except NoPassingTrialsError as exc:  # other passes still run; the log keeps every trial
        result.failures.append(str(exc))
        return
    for profile in profiles:
        path = out_dir / f"{stem}.{profile.kind}.json"
        profile.save(path)
        result.profiles.append(path)


def merge_profile_logs(paths: list[str | Path], out_dir: str | Path, name: str | None = None) -> list[Path]:
    """Merge shard logs of one pass into its profile(s)."""
    from .aggregate import merge_logs

    settings, records = merge_logs(paths)
    out_dir = check_writable_dir(out_dir)
    stem = name or model_slug(settings["model"]["name"])
    written = []
    for profile in profiles_from_log(settings, records):
        path = Path(out_dir) / f"{stem}.{profile.kind}.json"
        profile.save(path)
        written.append(path)
    return written


def load_profile(path: str | Path) -> Profile:
    return Profile.load(path)
