"""A profiling request, checked once and resolved once.

:func:`check_profile_run` turns a :class:`~headprobe.probes.request.ProfileRequest` into a
:class:`ProfilePlan` before the model loads: the request checked, each pass's input read (every needle
file once), the output files named, and what an earlier run left settled (logs to resume or replace,
profiles that would be replaced, logs another run holds). :meth:`ProfilePlan.resolve` then settles, in
one step once the model is loaded, what depends on it: the grid (``grid="auto"`` by device, lengths
capped by the context), the retrieval-reasoning gate (``gate="auto"`` by model size), and every prompt
against the model's tokenizer and context. The result, a :class:`ResolvedProfile`, is what
:func:`~headprobe.probes.run.run_profile` runs. All three are immutable.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import HeadprobeError, param
from ..files.jsonio import check_writable_dir
from ..files.log_lock import LogLock
from ..files.overwrite import check_overwrite
from ..haystack.prompt_format import prompt_format_of
from ..paths import user_profiles_dir
from .inputs import RunInputs
from .modes import AUTO_MODE, AUTO_RECOMPUTE_SHARE, auto_mode
from .outputs import ProfileOutputs, log_path, profile_made_by_log, profile_path, profile_stem
from .pass_steps import PassPlan, PassRun, RunContext
from .registry import passes_for
from .request import ProfileRequest, check_request, is_set
from .selective_prefill import check_reuse_model
from .trial_grid import Grid, resolve_grid

if TYPE_CHECKING:
    from ..models.loading import LoadedModel


@dataclass(frozen=True)
class ProfilePlan:
    """A profiling run checked before its model loads.

    Attributes
    ----------
    request
        The request (``out_dir`` set).
    model_name
        The model it was checked for (the file names come from it).
    stem
        File-name stem of its logs and profiles.
    outputs
        This process's logs, and the profiles it writes: the whole grid's on rank 0 of a ``torchrun``
        launch, none for a shard.
    passes
        Each requested pass with its input, in the order the probes first name them.
    """

    request: ProfileRequest
    model_name: str
    stem: str
    outputs: ProfileOutputs
    passes: tuple[PassPlan, ...]

    def resolve(self, lm: LoadedModel, version: str = "") -> ResolvedProfile:
        """Settle what depends on the loaded model, in one step: the grid on its device and context, the
        gate, the settings of each pass's log (every prompt checked against the model's tokenizer and
        context); nothing is written.

        Raises
        ------
        HeadprobeError
            A loaded model other than the one the run was checked for, or input the model cannot take
            (lengths beyond its context or too short for a prompt, reuse mode on an architecture it does
            not drive).
        """
        if profile_stem(self.request.name, lm.identity.name) != self.stem:
            raise HeadprobeError(f"{param('model', lm.identity.name)}: the run was checked for "
                                 f"{self.model_name}, whose files are named {self.stem}.*")
        plan = self._with_mode(lm)
        request = plan.request
        grid = resolve_grid(request.grid, request.lengths, request.depths, lm.device.type == "cuda",
                            lm.identity.max_context)
        common = {"model": lm.identity.to_json(), "mode": request.mode, "chat_template": request.chat_template,
                  "prompt_format": prompt_format_of(lm.tokenizer, request.chat_template),
                  "headprobe_version": version, "group_reduction": request.group_reduction}
        context = RunContext(request, grid, common)
        runs = tuple(PassRun(p, context, p.steps.settings(lm, p, context)) for p in plan.passes)
        return ResolvedProfile(plan, grid, runs)

    def _with_mode(self, lm: LoadedModel) -> ProfilePlan:
        """This plan with ``mode="auto"`` settled for the loaded model (:func:`~headprobe.probes.modes.
        auto_mode`); any other mode as it is."""
        request = self.request
        if request.mode != AUTO_MODE:
            return self
        runs_reuse = (all("reuse" in p.probe_pass.implementation.modes for p in self.passes)
                      and any(p.probe_pass.implementation.approximates_in_reuse for p in self.passes))
        if runs_reuse:
            try:
                check_reuse_model(lm.model)
            except HeadprobeError:
                runs_reuse = False
        asked_fast = is_set(request, "batch_size") or is_set(request, "split_attention")
        asked_share = is_set(request, "recompute_share")
        mode = auto_mode(lm.device.type == "cpu", runs_reuse, asked_fast, asked_share)
        share = request.recompute_share if asked_share or mode != "reuse" else AUTO_RECOMPUTE_SHARE
        return dataclasses.replace(self, request=dataclasses.replace(request, mode=mode, recompute_share=share))


@dataclass(frozen=True)
class ResolvedProfile:
    """A profiling run resolved for its loaded model: what :func:`~headprobe.probes.run.run_profile` runs.

    Attributes
    ----------
    plan
        The checked run.
    grid
        Its lengths and depths.
    passes
        Each pass with its log's settings (``settings.get("gate")``: the gate it counts trials under).
    """

    plan: ProfilePlan
    grid: Grid
    passes: tuple[PassRun, ...]

    @property
    def request(self) -> ProfileRequest:
        return self.plan.request


def profile_outputs(request: ProfileRequest, model_name: str) -> ProfileOutputs:
    """The logs and profiles a run of ``request`` on the model named ``model_name`` writes."""
    out_dir = Path(request.out_dir) if request.out_dir is not None else user_profiles_dir()
    stem = profile_stem(request.name, model_name)
    logs = {p.name: log_path(out_dir, stem, p.name, request.shard) for p in passes_for(request.probes)}
    profiles = {} if request.shard else {k: profile_path(out_dir, stem, k) for k in request.probes}
    return ProfileOutputs(out_dir, logs, profiles)


def check_profile_run(request: ProfileRequest, model_name: str,
                      profiles_of: ProfileRequest | None = None) -> ProfilePlan:
    """Check a run before its model loads and return its plan.

    Refused: unknown probes or modes, a grid of impossible values, needle files no requested pass reads,
    needle ids or task types that do not exist, an output folder that cannot be written, an output that
    the run would replace, and a log that another run holds. An existing trial log needs ``resume``
    (continue it) or ``force`` (start over); an existing profile needs ``force``, except that with
    ``resume`` a run may rewrite the profile its own log made (the profile's probe settings are the
    log's). :func:`~headprobe.probes.run.run_profile` calls it when given a request; call it yourself to
    refuse before loading the model (the command line does), and hand ``run_profile`` the plan.

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
    options = check_request(request)
    outputs = profile_outputs(request, model_name)
    request = dataclasses.replace(request, out_dir=outputs.out_dir)
    inputs = RunInputs(request)
    passes = []
    for probe_pass in passes_for(request.probes):
        data = probe_pass.implementation.read(request, options[probe_pass.name], inputs)
        probes = tuple(k for k in request.probes if k in probe_pass.kinds)
        passes.append(PassPlan(probe_pass, probes, data, options[probe_pass.name],
                               outputs.logs[probe_pass.name]))
    inputs.check_given()
    if profiles_of is not None:
        outputs = dataclasses.replace(outputs, profiles=profile_outputs(profiles_of, model_name).profiles)
    _check_outputs(request, outputs)
    return ProfilePlan(request, model_name, profile_stem(request.name, model_name), outputs, tuple(passes))


def _check_outputs(request: ProfileRequest, outputs: ProfileOutputs) -> None:
    """Refuse outputs that cannot be written or would replace what an earlier run left."""
    check_writable_dir(outputs.out_dir)
    for log in outputs.logs.values():
        if log.exists() and not (request.resume or request.force):
            raise HeadprobeError(f"{log}: a trial log already exists; pass {param('resume', True)} to continue it "
                                 f"or {param('force', True)} to start over")
        LogLock(log).release()       # refused here if another run writes to it
    kind_log = {k: outputs.logs[p.name] for p in passes_for(request.probes) for k in p.kinds}
    for kind, path in outputs.profiles.items():
        if path.exists() and not request.force:
            log = kind_log[kind]
            if not (request.resume and profile_made_by_log(path, log)):
                check_overwrite(path, False, hint=f"or choose another {param('out_dir')}"
                                + ("" if not request.resume else f" (it was not made from {log})"))
