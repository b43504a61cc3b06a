"""Needle trials: the attention rows of the answer steps, head scores and gates, in one of two modes.

``reference`` follows the published procedure: one prefill over the whole prompt, then greedy decoding
step by step, taking the attention row of every step (:mod:`headprobe.probes.reference_mode`). ``fast``
teacher-forces the gold answer: trials of one length share the haystack prefix before the needle, whose
KV is computed once and reused; the suffixes (needle, rest of the haystack, question, gold answer) of a
batch of trials run in one forward; rows are computed only for the positions that predict answer
tokens (:mod:`headprobe.probes.fast_mode`). A fast trial passes its gate only if greedy decoding would
have produced the gold answer, so it would have counted in reference mode too. ``reuse`` approximates
fast mode: one haystack forward per length, and per trial only the needle, the question and a share of
the haystack after the needle recomputed (:mod:`headprobe.probes.reuse_mode`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..haystack.corpus import Haystack
from ..haystack.needles import Needle
from .fast_mode import run_fast_length_group
from .probe_config import NeedleProbeConfig
from .prompt_cache import HaystackCaches
from .reference_mode import run_reference_trial
from .reuse_mode import run_reuse_length_group
from .trial_grid import TrialSpec


def run_needle_trials(
    loaded,
    haystacks: dict[int, Haystack],
    needles: dict[str, Needle],
    trials: list[TrialSpec],
    config: NeedleProbeConfig,
    on_trial: Callable[[dict[str, Any]], None],
    progress: Callable[[int], None] | None = None,
    caches: HaystackCaches | None = None,
) -> None:
    """Run ``trials`` and hand each finished trial's record to ``on_trial`` (which appends it to the log).

    Parameters
    ----------
    loaded
        :class:`headprobe.LoadedModel`.
    haystacks
        Haystack per seed.
    needles
        Needles by id; all of one kind.
    trials
        Trials still to run.
    config
        Mode and settings.
    on_trial
        Receives each trial's record as soon as it is finished.
    progress
        Receives the number of trials finished since its last call.
    caches
        Fast and reuse mode: haystack prompts and their KV kept between calls (a run that calls this
        function several times, as early stopping does, computes each length's haystack forward once).
    """
    if config.mode == "reference":
        for spec in trials:
            on_trial(run_reference_trial(loaded, haystacks[spec.seed], needles[spec.needle_id], spec, config))
            if progress:
                progress(1)
        return
    by_length: dict[tuple[int, int], list[TrialSpec]] = {}
    for spec in trials:
        by_length.setdefault((spec.length, spec.seed), []).append(spec)
    for (length, seed), group in sorted(by_length.items()):
        if config.mode == "reuse":
            run_reuse_length_group(loaded, haystacks[seed], needles, length, group, config, on_trial, progress,
                                   caches)
        else:
            run_fast_length_group(loaded, haystacks[seed], needles, length, group, config, on_trial, progress,
                                  caches)
