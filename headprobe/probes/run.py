"""A profiling run: the trial grid of each probe pass, its trial log, and the profiles it yields."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError, NoPassingTrialsError
from ..files.jsonio import check_writable_dir
from ..files.trial_log import TrialLog
from ..haystack.corpus import Haystack, load_haystack
from ..haystack.needles import load_needles, needle_set_fingerprint, shipped_needle_file
from ..haystack.tasks import load_tasks
from ..models.registry import model_slug
from ..profile import Profile
from .aggregate import profiles_from_log
from .needle_probe import NeedleProbeConfig, run_needle_trials
from .retention import RetentionConfig, run_retention_sample
from .trial_grid import TrialSpec, make_grid, shard_trials

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
    resume: bool = False
    force: bool = False
    shard: tuple[int, int] | None = None
    name: str | None = None


@dataclass
class ProfileResult:
    """What a run wrote."""

    logs: list[Path]
    profiles: list[Path]
    trials_run: int
    trials_skipped: int
    failures: list[str] = field(default_factory=list)


def _haystack_for_seed(base: Haystack, seed: int) -> Haystack:
    """Seed 0 keeps the corpus order; other seeds shuffle its documents (blank-line separated blocks)."""
    if seed == 0:
        return base
    import random

    docs = base.text.split("\n\n")
    random.Random(seed).shuffle(docs)
    return Haystack(f"{base.name}#seed{seed}", "\n\n".join(docs))


def run_profile(loaded, request: ProfileRequest, progress: ProgressFactory | None = None,
                version: str = "") -> ProfileResult:
    """Run the requested probes on a loaded model; append trials to logs; write profiles.

    With ``request.shard`` set only the logs are written (merge them with :func:`merge_profile_logs`).
    """
    for probe in request.probes:
        if probe not in PROBES:
            raise HeadprobeError(f"--probe {probe}: unknown probe; expected one of {', '.join(PROBES)}")
    if request.mode not in ("fast", "reference"):
        raise HeadprobeError(f"--mode {request.mode}: expected fast or reference")
    out_dir = check_writable_dir(request.out_dir)
    stem = request.name or model_slug(loaded.identity.name)
    shard_suffix = f".shard{request.shard[0]}of{request.shard[1]}" if request.shard else ""
    base_haystack = load_haystack(request.haystack)
    haystacks = {s: _haystack_for_seed(base_haystack, s) for s in request.seeds}
    common = {
        "model": loaded.identity.to_json(), "mode": request.mode, "chat_template": request.chat_template,
        "headprobe_version": version, "group_reduction": request.group_reduction,
    }
    result = ProfileResult([], [], 0, 0)
    passes = []
    for probe in request.probes:
        if PASSES[probe] not in passes:
            passes.append(PASSES[probe])
    for pass_name in passes:
        probes_here = [p for p in request.probes if PASSES[p] == pass_name]
        log_path = out_dir / f"{stem}.{pass_name}{shard_suffix}.trials.jsonl"
        if pass_name == "layer_retention":
            samples = [s for group in load_tasks(request.tasks, samples_per_task=request.samples_per_task).values()
                       for s in group]
            settings = {**common, "pass": pass_name, "probes": probes_here,
                        "tasks": sorted({s.task for s in samples}), "samples": len(samples),
                        "window": request.retention.window, "kernel_size": request.retention.kernel_size,
                        "capacity": request.retention.capacity, "max_tokens": request.retention.max_tokens,
                        "shard": list(request.shard) if request.shard else None}
            log = TrialLog(log_path, settings, resume=request.resume, force=request.force)
            todo = [s for s in samples if s.id not in log]
            result.trials_skipped += len(samples) - len(todo)
            bar = progress(len(todo), f"{stem} layer_retention") if progress else None
            config = RetentionConfig(**{**request.retention.__dict__, "chat_template": request.chat_template})
            for sample in todo:
                log.append(run_retention_sample(loaded, sample, config))
                result.trials_run += 1
                if bar:
                    bar(1)
        else:
            kind = "retrieval" if pass_name == "retrieval" else "reasoning"
            needle_path = Path(request.needle_files.get(kind) or shipped_needle_file(kind))
            needles = load_needles(needle_path)
            if request.needle_ids:
                chosen = [n for n in needles if n.id in set(request.needle_ids)]
                if not chosen:
                    raise HeadprobeError(f"--needles: none of {', '.join(request.needle_ids)} is in {needle_path}")
                needles = chosen
            wrong = [n.id for n in needles if n.kind != kind]
            if wrong:
                raise HeadprobeError(f"{needle_path}: needles {', '.join(wrong)} are not of kind '{kind}'")
            for length in request.lengths:
                if loaded.identity.max_context and length > loaded.identity.max_context:
                    raise HeadprobeError(f"--lengths {length}: beyond the model's context of "
                                         f"{loaded.identity.max_context} tokens")
            settings = {**common, "pass": pass_name, "probes": probes_here, "lengths": list(request.lengths),
                        "depths": [round(d, 6) for d in request.depths], "seeds": list(request.seeds),
                        "needle_set": {"path": str(needle_path), "fingerprint": needle_set_fingerprint(needle_path),
                                       "ids": [n.id for n in needles]},
                        "haystack": {"name": base_haystack.name, "fingerprint": base_haystack.fingerprint},
                        "gate": request.gate if kind == "reasoning" else "published",
                        "max_new_tokens": request.max_new_tokens, "shard": list(request.shard) if request.shard else None}
            log = TrialLog(log_path, settings, resume=request.resume, force=request.force)
            grid = shard_trials(make_grid([n.id for n in needles], request.lengths,
                                          [round(d, 6) for d in request.depths], request.seeds), request.shard)
            todo: list[TrialSpec] = [t for t in grid if t.id not in log]
            result.trials_skipped += len(grid) - len(todo)
            bar = progress(len(todo), f"{stem} {'+'.join(probes_here)} ({request.mode})") if progress else None
            config = NeedleProbeConfig(mode=request.mode, chat_template=request.chat_template,
                                       batch_size=request.batch_size, max_new_tokens=request.max_new_tokens,
                                       gate=settings["gate"], split_attention=request.split_attention)
            counter = {"n": 0}

            def on_trial(record: dict[str, Any]) -> None:
                log.append(record)
                counter["n"] += 1

            run_needle_trials(loaded, haystacks, {n.id: n for n in needles}, todo, config, on_trial, bar)
            result.trials_run += counter["n"]
        result.logs.append(log_path)
        if request.shard is None:
            try:
                profiles = profiles_from_log(log.settings, list(log.records()))
            except NoPassingTrialsError as exc:  # other passes still run; the log keeps every trial
                result.failures.append(str(exc))
                continue
            for profile in profiles:
                path = out_dir / f"{stem}.{profile.kind}.json"
                profile.save(path)
                result.profiles.append(path)
    return result


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
