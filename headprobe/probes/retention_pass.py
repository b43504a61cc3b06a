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
from .trial_grid import shard_samples

if TYPE_CHECKING:
    from ..files.trial_log import TrialLog
    from ..profile import Profile
    from .inputs import RunInputs
    from .pass_steps import PassPlan, PassRun, RunContext
    from .request import ProfileRequest


class RetentionPass(PassSteps):
    """Layer retention over task prompts (one profile kind, :attr:`kind`)."""

    runners: ClassVar[Mapping[str, Any]] = dict.fromkeys(MODES, "retention:run_retention_sample")
    reads = frozenset({"tasks", "samples_per_task", "retention"})

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.kinds = (kind,)

    def read(self, request: ProfileRequest, options: Any, inputs: RunInputs) -> list[TaskSample]:  # noqa: ARG002 (the probe-pass interface)
        """The task samples, task by task."""
        return inputs.task_samples()

    def settings(self, loaded: Any, plan: PassPlan, context: RunContext) -> dict[str, Any]:  # noqa: ARG002 (the probe-pass interface)
        request, samples = context.request, plan.data
        retention = request.retention
        return {**context.common, "pass": plan.probe_pass.name, "probes": list(plan.probes),
                "tasks": sorted({s.task for s in samples}), "samples": len(samples),
                "window": retention.window, "kernel_size": retention.kernel_size,
                "capacity": retention.capacity, "max_tokens": retention.max_tokens,
                "shard": shard_setting(request.shard)}

    def trials(self, run: PassRun) -> list[TaskSample]:
        return shard_samples(run.plan.data, run.request.shard)

    def run(self, loaded: Any, run: PassRun, todo: list[TaskSample], log: TrialLog, progress: Any) -> None:
        request = run.request
        config = dataclasses.replace(request.retention, chat_template=request.chat_template)
        sample_record = self.runner(request.mode)
        for sample in todo:
            log.append(sample_record(loaded, sample, config))
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
