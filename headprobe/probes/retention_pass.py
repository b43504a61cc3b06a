"""The layer-retention pass: task prompts, each layer's share of the top-ranked tokens (DynamicKV §3).

It reads the shipped task prompts (``tasks``, ``samples_per_task``), runs one prompt forward each
(:func:`~headprobe.probes.retention.run_retention_sample`, the same in every mode) and profiles, per task
type, the mean and spread of each layer's share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ..haystack.tasks import TaskSample
from ..models.identity import ModelIdentity
from .aggregate import COUNT, SECONDS, check_fields, require_field, require_numbers, retention_profile
from .log_settings import shard_setting
from .modes import MODES
from .pass_steps import PassSteps, TrialGap
from .retention import run_retention_sample
from .trial_grid import Grid, shard_samples

if TYPE_CHECKING:
    from ..files.trial_log import TrialLog
    from ..models.loading import LoadedModel
    from ..profile import Profile
    from .inputs import RunInputs
    from .pass_steps import PassPlan, PassRun, RunContext
    from .request import ProfileRequest


#: Layer-retention prompts per task on the CPU grid when ``samples_per_task`` is not given: on SmolLM2 two
#: a task keep the task mix's ranking of layers at Spearman 0.999 and DynamicKV's layer budgets within 2.4%
#: (L1 share) of all 31 shipped prompts', in a third of the time (docs/benchmarks.md, "The default profile").
CPU_SAMPLES_PER_TASK = 2


def cpu_grid_samples(request: ProfileRequest, grid: Grid) -> int | None:
    """Prompts per task a run takes beyond what it asked for: :data:`CPU_SAMPLES_PER_TASK` on the CPU grid
    (the resolved ``grid.default``) when ``samples_per_task`` was not given, else ``None``."""
    if request.samples_per_task is not None:
        return None
    return CPU_SAMPLES_PER_TASK if grid.default == "cpu" else None


def first_per_task(samples: list[TaskSample], per_task: int | None) -> list[TaskSample]:
    """The first ``per_task`` samples of each task, in their order (all with ``None``)."""
    if per_task is None:
        return list(samples)
    seen: dict[str, int] = {}
    kept = []
    for sample in samples:
        seen[sample.task] = seen.get(sample.task, 0) + 1
        if seen[sample.task] <= per_task:
            kept.append(sample)
    return kept


class RetentionPass(PassSteps):
    """Layer retention over task prompts (one profile kind, :attr:`kind`)."""

    runners: ClassVar[Mapping[str, Any]] = dict.fromkeys(MODES, run_retention_sample)
    reads = frozenset({"tasks", "samples_per_task", "retention", "grid"})

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.kinds = (kind,)

    def read(self, request: ProfileRequest, options: Any, inputs: RunInputs) -> list[TaskSample]:  # noqa: ARG002 (the probe-pass interface)
        """The task samples, task by task."""
        return inputs.task_samples()

    def settings(self, lm: LoadedModel, plan: PassPlan, context: RunContext) -> dict[str, Any]:  # noqa: ARG002 (the probe-pass interface)
        request = context.request
        per_task = cpu_grid_samples(request, context.grid)
        samples = first_per_task(plan.data, per_task)
        retention = request.retention
        out = {**context.common, "pass": plan.probe_pass.name, "probes": list(plan.probes),
               "tasks": sorted({s.task for s in samples}), "samples": len(samples),
               "window": retention.window, "kernel_size": retention.kernel_size,
               "capacity": retention.capacity, "max_tokens": retention.max_tokens,
               "shard": shard_setting(request.shard)}
        if per_task is not None:
            out["samples_per_task"] = per_task
        return out

    def trials(self, run: PassRun) -> list[TaskSample]:
        return shard_samples(first_per_task(run.plan.data, run.settings.get("samples_per_task")), run.request.shard)

    def run(self, lm: LoadedModel, run: PassRun, todo: list[TaskSample], log: TrialLog,
            progress: Any) -> None:
        request = run.request
        config = dataclasses.replace(request.retention, chat_template=request.chat_template)
        sample_record = self.runner(request.mode)
        for sample in todo:
            log.append(sample_record(lm, sample, config))
            if progress:
                progress(1)

    def profiles(self, settings: dict[str, Any], records: list[dict[str, Any]]) -> list[Profile]:
        return [retention_profile(self.kind, ModelIdentity.from_json(settings["model"], "<trial log>"), settings,
                                  records)]

    def check_records(self, settings: dict[str, Any], records: list[tuple[str, dict[str, Any]]]) -> None:
        """A record needs its task and ``[layers]`` shares, each from 0 to 1 (a layer's share of the top-ranked
        tokens); ``prompt_tokens`` and ``seconds``, where it holds them, must be counts and finite numbers."""
        layers = ModelIdentity.from_json(settings["model"], "<trial log>").num_layers
        for where, r in records:
            require_field(r, "task", str, where)
            check_fields(r, {"prompt_tokens": COUNT, "seconds": SECONDS}, where)
            require_numbers(r.get("retention"), [layers], where, "retention", most=1.0)

    def missing_trials(self, settings: dict[str, Any], found: dict[str, str], shards: list[list[int]]) -> TrialGap:  # noqa: ARG002 (the probe-pass interface)
        """How many of the log's samples no log holds (the settings count them but do not name them)."""
        missing = max(0, int(settings.get("samples", len(found))) - len(found))
        return TrialGap(missing, [], f"{missing} of {settings.get('samples')} layer-retention samples are missing")


#: The layer-retention pass.
LAYER_RETENTION = RetentionPass("layer_retention")
