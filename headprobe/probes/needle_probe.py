"""Needle trials, one runner per mode: the attention rows of the answer steps, head scores and gates.

``reference`` follows the published procedure: one prefill over the whole prompt, then greedy decoding
step by step, taking the attention row of every step (:mod:`headprobe.probes.reference_mode`). ``fast``
teacher-forces the gold answer: trials of one length share the haystack prefix before the needle, whose
KV is computed once and reused; the suffixes (needle, rest of the haystack, question, gold answer) of a
batch of trials run in one forward; rows are computed only for the positions that predict answer
tokens (:mod:`headprobe.probes.fast_mode`). A fast trial passes its gate only if greedy decoding would
have produced the gold answer, so it would have counted in reference mode too. ``reuse`` approximates
fast mode: one haystack forward per length, and per trial only the needle, the question and a share of
the haystack after the needle recomputed (:mod:`headprobe.probes.reuse_mode`).

Every runner takes the same arguments:

lm
    :class:`headprobe.LoadedModel`.
haystacks
    Haystack per seed.
needles
    Needles by id; all of one kind.
trials
    Trials still to run.
config
    Settings (:class:`~headprobe.probes.probe_config.NeedleProbeConfig`), the scores to record among them.
on_trial
    Receives each trial's record as soon as it is finished.
progress
    Receives the number of trials finished since its last call.
caches
    Fast and reuse mode: haystack prompts and their KV kept between calls (a run that calls a runner
    several times, as early stopping does, computes each length's haystack forward once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..haystack.corpus import Haystack
from ..haystack.needles import Needle
from .fast_mode import run_fast_length_group
from .probe_config import NeedleProbeConfig
from .prompt_cache import HaystackCaches
from .reference_mode import run_reference_trial
from .reuse_mode import run_reuse_length_group
from .trial_grid import TrialSpec

if TYPE_CHECKING:
    from ..models.loading import LoadedModel

OnTrial = Callable[[dict[str, Any]], None]


def run_reference_trials(lm: LoadedModel, haystacks: dict[int, Haystack], needles: dict[str, Needle],
                         trials: list[TrialSpec], config: NeedleProbeConfig, on_trial: OnTrial,
                         progress: Callable[[int], None] | None = None,
                         caches: HaystackCaches | None = None) -> None:  # noqa: ARG001 (the probe-pass interface)
    """Reference mode: each trial by greedy decoding, one at a time (``caches`` is not used)."""
    for spec in trials:
        on_trial(run_reference_trial(lm, haystacks[spec.seed], needles[spec.needle_id], spec, config))
        if progress:
            progress(1)


def run_fast_trials(lm: LoadedModel, haystacks: dict[int, Haystack], needles: dict[str, Needle],
                    trials: list[TrialSpec], config: NeedleProbeConfig, on_trial: OnTrial,
                    progress: Callable[[int], None] | None = None,
                    caches: HaystackCaches | None = None) -> None:
    """Fast mode: teacher-forced batches on each length's shared haystack prefix."""
    for (length, seed), group in _length_groups(trials):
        run_fast_length_group(lm, haystacks[seed], needles, length, group, config, on_trial, progress, caches)


def run_reuse_trials(lm: LoadedModel, haystacks: dict[int, Haystack], needles: dict[str, Needle],
                     trials: list[TrialSpec], config: NeedleProbeConfig, on_trial: OnTrial,
                     progress: Callable[[int], None] | None = None,
                     caches: HaystackCaches | None = None) -> None:
    """Reuse mode: each trial on its length's haystack KV, a share of it recomputed."""
    for (length, seed), group in _length_groups(trials):
        run_reuse_length_group(lm, haystacks[seed], needles, length, group, config, on_trial, progress, caches)


def _length_groups(trials: list[TrialSpec]) -> list[tuple[tuple[int, int], list[TrialSpec]]]:
    """``trials`` by ``(length, seed)``, in that order."""
    by_length: dict[tuple[int, int], list[TrialSpec]] = {}
    for spec in trials:
        by_length.setdefault((spec.length, spec.seed), []).append(spec)
    return sorted(by_length.items())
