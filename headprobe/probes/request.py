"""What a profiling run is asked to do (:class:`ProfileRequest`), and the checks that need no file and no model."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..errors import HeadprobeError, param
from ..haystack.needles import needle_file_list
from .early_stop import StopRule, check_stop_rule
from .gates import check_gate
from .modes import AUTO_MODE, DEFAULT_RECOMPUTE_SHARE, MODES, check_recompute_share
from .outputs import check_name
from .pass_options import build_options
from .registry import passes_for, probe_passes
from .retention import RetentionConfig
from .trial_grid import GRIDS


def _tuple(value: Sequence[Any] | None) -> tuple[Any, ...] | None:
    return None if value is None else tuple(value)


@dataclass(frozen=True)
class ProfileRequest:
    """Everything a profiling run needs besides the model; immutable (lists given are kept as tuples).

    Attributes
    ----------
    probes
        Profile kinds to write, any of :data:`~headprobe.probes.registry.PROFILE_KINDS`; each is run by
        its pass (:mod:`headprobe.probes.registry`).
    lengths, depths, seeds
        The needle grid (depths as fractions). ``lengths`` or ``depths`` left ``None`` come from ``grid``
        once the model is loaded.
    out_dir
        Where logs and profiles go (``None``: the user's profiles folder,
        :func:`~headprobe.paths.user_profiles_dir`).
    grid
        The default lengths and depths: ``"full"`` (HeadKV's 5 lengths up to 10K, capped at the model's
        context, by 10 depths), ``"cpu"`` (lengths 1000 and 2000, depths 0, 50 and 100 %), or ``"auto"``:
        full on a GPU, cpu elsewhere.
    mode
        ``"fast"`` or ``"reference"`` (exact), ``"reuse"`` (approximate, :data:`~headprobe.probes.modes.
        DEFAULT_RECOMPUTE_SHARE`), or ``"auto"``, settled once the model is loaded
        (:func:`~headprobe.probes.modes.auto_mode`): reuse mode at
        :data:`~headprobe.probes.modes.AUTO_RECOMPUTE_SHARE` on a CPU, fast mode on a GPU or where a
        requested pass or the model does not run in reuse mode. Logs and profiles record the mode run.
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
        pass over the suffix (see :class:`~headprobe.probes.probe_config.NeedleProbeConfig`).
    recompute_share
        Reuse mode: share (0 to 1) of the haystack after the needle recomputed per trial
        (:mod:`headprobe.probes.reuse_mode`).
    until_stable
        Run each needle pass in a spread order and stop once its top-k heads are stable across bootstrap
        resamples (:mod:`headprobe.probes.early_stop`); ``None`` runs the whole grid.
    options
        Options of passes that declare them (:attr:`~headprobe.probes.pass_steps.PassSteps.options`), by
        pass name: ``{"pass": {"field": value}}``; values may be given as text (the command line's
        ``--pass-option PASS.FIELD=VALUE``).
    """

    probes: Sequence[str]
    lengths: Sequence[int] | None = None
    depths: Sequence[float] | None = None
    out_dir: Path | str | None = None
    mode: str = "fast"
    seeds: Sequence[int] = (0,)
    needle_files: Sequence[Path | str] | Mapping[str, Path | str] = ()
    needle_ids: Sequence[str] | None = None
    haystack: str | None = None
    chat_template: bool = True
    batch_size: int = 4
    max_new_tokens: int = 24
    gate: str = "published"
    group_reduction: str = "mean"
    tasks: Sequence[str] | None = None
    samples_per_task: int | None = None
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    split_attention: bool = True
    recompute_share: float = DEFAULT_RECOMPUTE_SHARE
    until_stable: StopRule | None = None
    resume: bool = False
    force: bool = False
    shard: tuple[int, int] | None = None
    name: str | None = None
    grid: str = "auto"
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        fix = object.__setattr__
        fix(self, "probes", tuple(self.probes))
        fix(self, "lengths", _tuple(self.lengths))
        fix(self, "depths", _tuple(self.depths))
        fix(self, "seeds", tuple(self.seeds))
        fix(self, "needle_files", tuple(needle_file_list(self.needle_files)))
        fix(self, "needle_ids", _tuple(self.needle_ids))
        fix(self, "tasks", _tuple(self.tasks))
        fix(self, "shard", _tuple(self.shard))
        fix(self, "options", MappingProxyType({k: MappingProxyType(dict(v)) for k, v in dict(self.options).items()}))

    def check_options(self, given: Collection[str] | None = None) -> None:
        """Refuse parameters that would not take effect: one that no requested probe's pass reads
        (:attr:`~headprobe.probes.pass_steps.PassSteps.reads`: ``lengths`` for layer retention alone,
        ``tasks`` for needle probes alone, ``gate`` without ``retrieval_reasoning``, ...) or that applies in
        another mode (:data:`MODE_PARAMETERS`: ``recompute_share`` outside reuse mode, ``batch_size``
        outside fast mode). The command line runs it with the flags typed; :func:`check_request` does not
        (a program may build requests for several modes or probes from one set of values).

        Parameters
        ----------
        given
            The parameters the caller set (the command line passes the flags typed). ``None``: those whose
            values differ from the defaults (``gate``: ``"likelihood"``, as ``"auto"`` only chooses for
            the passes that take a gate and ``"published"`` is every other pass's).

        Raises
        ------
        HeadprobeError
            Naming the parameter and what it needs.
        """
        passes = passes_for(self.probes)
        for name in optional_parameters():
            if not (name in given if given is not None else is_set(self, name)):
                continue
            if not any(p.implementation.reads is None or name in p.implementation.reads for p in passes):
                kinds = [k for p in probe_passes() if name in (p.implementation.reads or ()) for k in p.kinds]
                listed = ", ".join(kinds[:-1]) + (" or " if len(kinds) > 1 else "") + kinds[-1]
                raise HeadprobeError(f"{param(name)}: applies to the {listed} probe"
                                     f"{'s' if len(kinds) > 1 else ''} only, and none is requested "
                                     f"({param('probes', ' '.join(self.probes))})")
            modes = MODE_PARAMETERS.get(name, (*MODES, AUTO_MODE))
            if self.mode not in modes:
                raise HeadprobeError(f"{param(name)}: applies in {param('mode', modes[0])} only, not "
                                     f"{param('mode', self.mode)}")


#: Parameters that take effect in some modes only: parameter → those modes.
MODE_PARAMETERS: dict[str, tuple[str, ...]] = {
    "batch_size": ("fast", AUTO_MODE), "split_attention": ("fast", AUTO_MODE),
    "recompute_share": ("reuse", AUTO_MODE),
}


def optional_parameters() -> list[str]:
    """The request parameters some registered pass reads and others do not, in the request's order."""
    read = {name for p in probe_passes() for name in (p.implementation.reads or ())} | set(MODE_PARAMETERS)
    return [f.name for f in dataclasses.fields(ProfileRequest) if f.name in read]


def is_set(request: ProfileRequest, name: str) -> bool:
    """Whether ``request`` sets parameter ``name`` to other than its default."""
    value = getattr(request, name)
    if name == "gate":
        return value == "likelihood"
    spec = next(f for f in dataclasses.fields(ProfileRequest) if f.name == name)
    default = spec.default_factory() if spec.default is dataclasses.MISSING else spec.default   # type: ignore[misc]
    return value != (tuple(default) if isinstance(default, list) else default)


def check_request(request: ProfileRequest) -> dict[str, Any]:
    """Refuse unknown probes, modes a pass does not run in, a grid of impossible values, ``resume`` with
    ``force``, a ``name`` that is not a plain file-name stem, and pass options that do not fit, before any
    file is read. Returns each requested pass's options
    (:func:`~headprobe.probes.pass_options.build_options`), by pass name.

    Parameters that would not take effect are left to :meth:`ProfileRequest.check_options`, which a caller
    runs with the parameters it set (the command line does, with the flags typed): a program may build
    requests for several modes or probes from one set of values, which would be refused here."""
    passes = passes_for(request.probes)
    if request.mode not in (*MODES, AUTO_MODE):
        raise HeadprobeError(f"{param('mode', request.mode)}: expected fast or reference (exact), reuse "
                             "(approximate) or auto")
    if request.resume and request.force:
        raise HeadprobeError(f"{param('resume', True)} with {param('force', True)}: choose one ({param('resume', True)} "
                             f"continues the logs, {param('force', True)} starts them over)")
    check_name(request.name)
    for probe_pass in passes:
        modes = probe_pass.implementation.modes
        if request.mode != AUTO_MODE and request.mode not in modes:
            raise HeadprobeError(f"{param('mode', request.mode)}: the {probe_pass.name} pass runs in "
                                 f"{' or '.join(modes)} mode only")
    if request.mode in ("reuse", AUTO_MODE):
        check_recompute_share(request.recompute_share)
    if request.until_stable is not None:
        check_stop_rule(request.until_stable)
        if request.shard is not None:
            raise HeadprobeError(f"{param('until_stable')}: cannot stop early on a shard of the grid "
                                 f"({param('shard', '/'.join(map(str, request.shard)))}); run the whole grid")
    if request.grid not in GRIDS:
        raise HeadprobeError(f"{param('grid', request.grid)}: expected one of {', '.join(GRIDS)}")
    for length in request.lengths or ():
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise HeadprobeError(f"{param('lengths', length)}: expected a positive number of tokens")
    for depth in request.depths or ():
        if not (isinstance(depth, (int, float)) and math.isfinite(depth) and 0 <= depth <= 1):
            raise HeadprobeError(f"{param('depths', depth)}: expected a depth between 0 and 1")
    if isinstance(request.batch_size, bool) or not isinstance(request.batch_size, int) or request.batch_size < 1:
        raise HeadprobeError(f"{param('batch_size')}: expected a positive integer")
    check_gate(request.gate)
    return _pass_options(request, passes)


def _pass_options(request: ProfileRequest, passes: list) -> dict[str, Any]:
    names = {p.name: p for p in passes}
    for name in request.options:
        if name not in names:
            raise HeadprobeError(f"{param('options', name)}: no requested pass of that name "
                                 f"(requested: {', '.join(names)})")
    return {p.name: build_options(p.name, p.implementation.options, request.options.get(p.name, {}))
            for p in passes}
