"""The steps of a probe pass, which ``run_profile`` takes in turn, and what each step hands the next.

A pass (declared in :mod:`headprobe.probes.registry`) is run in four steps, each a method of its
:class:`PassSteps`:

1. :meth:`~PassSteps.read`, before the model loads: read and check the pass's input (needles inserted
   into a haystack, task prompts, a user's own examples); the result is :attr:`PassPlan.data`.
2. :meth:`~PassSteps.settings`, once the model is loaded: check the input against the model and return
   the settings the pass's trial log records (and its profiles carry).
3. :meth:`~PassSteps.trials` and :meth:`~PassSteps.run`: the trials of this shard, and running those not
   yet in the log by the runner of the request's mode (:attr:`~PassSteps.runners`), each record appended
   to the log as soon as it is finished.
4. :meth:`~PassSteps.profiles`: average a log (a run's, a merge of shard logs, the ranks' under
   ``torchrun``) into one profile per kind.

:meth:`~PassSteps.check_records` checks a log's records before they are averaged or resumed, and
:meth:`~PassSteps.missing_trials` says what merged shard logs lack of the trials their settings describe.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .gates import GateChoice

if TYPE_CHECKING:
    from ..files.trial_log import TrialLog
    from ..models.loading import LoadedModel
    from ..profile import Profile
    from .inputs import RunInputs
    from .registry import ProbePass
    from .request import ProfileRequest
    from .trial_grid import Grid


@dataclass(frozen=True)
class PassPlan:
    """A pass of a run, checked before the model loads.

    Attributes
    ----------
    probe_pass
        The pass.
    probes
        Its kinds the request asks for.
    data
        Its input, as :meth:`PassSteps.read` returned it.
    options
        Its options (:attr:`PassSteps.options`), or ``None``.
    log
        This process's trial log of the pass.
    """

    probe_pass: ProbePass
    probes: tuple[str, ...]
    data: Any
    options: Any
    log: Path

    @property
    def steps(self) -> PassSteps:
        return self.probe_pass.implementation


@dataclass(frozen=True)
class RunContext:
    """What every pass of a run is resolved against once the model is loaded.

    Attributes
    ----------
    request
        The request.
    grid
        Its lengths and depths on this model and device.
    common
        The settings every pass's log records (model, mode, chat template, version, group reduction).
    """

    request: ProfileRequest
    grid: Grid
    common: dict[str, Any]


@dataclass(frozen=True)
class PassRun:
    """A pass ready to run on the loaded model: its plan and its log's settings."""

    plan: PassPlan
    context: RunContext
    settings: dict[str, Any]

    @property
    def steps(self) -> PassSteps:
        return self.plan.steps

    @property
    def request(self) -> ProfileRequest:
        return self.context.request

    @property
    def gate(self) -> GateChoice | None:
        """The gate its trials count under, when it takes the request's gate (as its settings record it)."""
        return GateChoice.from_settings(self.settings) if self.steps.takes_gate else None


@dataclass(frozen=True)
class TrialGap:
    """Trials of a pass's grid that shard logs lack: how many, their ids (where the settings name them),
    and what to say about them (``"3 of 40 trials of the grid are missing (shard 1/4 not given; ...)"``)."""

    count: int
    ids: list[str]
    what: str


class PassSteps:
    """The steps of a probe pass (see the module's description). Subclass it for a new pass.

    Attributes
    ----------
    kinds
        The profile kinds it writes (those of its line in the registry).
    needle_kind
        The kind of the request's needles it reads (``"retrieval"``, ``"reasoning"``), or ``None``.
    takes_gate
        Whether its trials count under the request's gate (``ProfileRequest.gate``), else the published one.
    runners
        Mode → the function that runs its trials in that mode; the modes it runs in.
    options
        A dataclass of its own options (``ProfileRequest.options[name]``, ``--pass-option``), or ``None``.
    reads
        The optional request parameters it reads (``{"lengths", "tasks", ...}``): a request that sets one
        no requested pass reads is refused (:meth:`~headprobe.probes.request.ProfileRequest.check_options`).
        ``None``: it does not say, and no parameter is refused on its account.
    """

    kinds: tuple[str, ...] = ()
    needle_kind: str | None = None
    takes_gate: bool = False
    runners: ClassVar[Mapping[str, Any]] = {}
    options: type | None = None
    reads: frozenset[str] | None = None

    @property
    def modes(self) -> tuple[str, ...]:
        """The modes it runs in."""
        return tuple(self.runners)

    @property
    def approximates_in_reuse(self) -> bool:
        """Whether reuse mode runs it differently from fast mode (an approximation), rather than the same
        exact runner under every mode's name."""
        return "reuse" in self.runners and self.runners["reuse"] != self.runners.get("fast")

    def runner(self, mode: str) -> Callable[..., Any]:
        """The function that runs its trials in ``mode``."""
        return self.runners[mode]

    def score_kinds(self, settings: dict[str, Any]) -> tuple[str, ...]:
        """The kinds a log of this pass carries (and its profiles average): those it asked for."""
        return tuple(k for k in self.kinds if k in settings.get("probes", self.kinds))

    def read(self, request: ProfileRequest, options: Any, inputs: RunInputs) -> Any:
        """Read and check the pass's input before the model loads (``inputs``: what the request names, each
        file read once; ``options``: the pass's own); refuse bad input (HeadprobeError)."""
        raise NotImplementedError

    def settings(self, lm: LoadedModel, plan: PassPlan, context: RunContext) -> dict[str, Any]:
        """Check the input against the loaded model; the settings of the pass's trial log (which must
        name the pass as ``"pass"`` and its requested kinds as ``"probes"``, beside ``context.common``)."""
        raise NotImplementedError

    def trials(self, run: PassRun) -> list[Any]:
        """This shard's trials (``request.shard``), in order, each with an ``id``."""
        raise NotImplementedError

    def progress_label(self, run: PassRun) -> str:
        """What the progress bar says besides the file stem."""
        return run.plan.probe_pass.name

    def run(self, lm: LoadedModel, run: PassRun, todo: list[Any], log: TrialLog,
            progress: Callable[[int], Any] | None) -> Any:
        """Run ``todo`` (this shard's trials not yet in the log), appending each record to ``log`` and
        reporting finished trials to ``progress``; return the early-stopping outcome, if the pass had one."""
        raise NotImplementedError

    def profiles(self, settings: dict[str, Any], records: list[dict[str, Any]]) -> list[Profile]:
        """The profiles of a log: one per kind of ``settings["probes"]``.

        Raises
        ------
        NoPassingTrialsError
            When no profile can be made (no trial passed): a profile of zeros would look like a result.
        """
        raise NotImplementedError

    def check_records(self, settings: dict[str, Any], records: list[tuple[str, dict[str, Any]]]) -> None:
        """Check every ``(where, record)`` of a log before it is averaged (FileFormatError naming it)."""

    def missing_trials(self, settings: dict[str, Any], found: dict[str, str],  # noqa: ARG002 (the probe-pass interface)
                       shards: list[list[int]]) -> TrialGap:  # noqa: ARG002 (the probe-pass interface)
        """What shard logs being merged lack of the trials their settings describe.

        Parameters
        ----------
        found
            Trial id → where its record is (``"file:line"``), over every log.
        shards
            The ``[i, n]`` of each log that recorded one.

        Raises
        ------
        FileFormatError
            A record of a trial the settings do not describe, naming where it is.
        """
        return TrialGap(0, [], "")
