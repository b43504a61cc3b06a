"""How stable a profile's head ranking is: bootstrap intervals of the top heads and, from the trial log,
the top-k Jaccard index as trials were added.

:func:`stability_figure` draws one or two panels: the profile's top heads with their bootstrap intervals
(from the profile's ``intervals`` block), and, given the profile's trial log, the mean Jaccard index of
the bootstrap resamples' top-k heads against the number of trials run, in the order the log holds them
(the spread order of ``--until-stable`` runs), with the stopping threshold when the run had one.
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ..errors import HeadprobeError
from ..probes.aggregate import gate_name
from ..probes.bootstrap import BootstrapSettings, top_k_jaccard
from ..profile import Profile
from .profile_figures import _probe_label, short_model_name


def jaccard_curve(records: list[dict[str, Any]], kind: str, gate: str, k: int, every: int = 10,
                  settings: BootstrapSettings | None = None, min_passed: int = 5) -> tuple[list[int], list[float]]:
    """Top-``k`` bootstrap Jaccard index after every ``every`` trials of ``records`` (in log order).

    Returns
    -------
    trials, jaccard
        Trials run (passing or not) at each point, and the index of the passing trials so far (points with
        fewer than ``min_passed`` passing trials are left out).
    """
    settings = settings or BootstrapSettings()
    xs, ys = [], []
    for end in range(every, len(records) + every, every):
        end = min(end, len(records))
        passed = [r["scores"][kind] for r in records[:end] if r["gates"].get(gate)]
        if len(passed) >= min_passed:
            xs.append(end)
            ys.append(top_k_jaccard(np.array(passed, dtype=np.float64), k, settings))
        if end == len(records):
            break
    return xs, ys


def stability_figure(profile: Profile, top: int = 20, log: tuple[dict[str, Any], list[dict[str, Any]]] | None = None,
                     k: int | None = None) -> Figure:
    """Top heads with bootstrap intervals, and (given the trial log) top-k stability against trials run.

    Parameters
    ----------
    profile
        A needle profile with an ``intervals`` block.
    top
        Heads to show in the interval panel.
    log
        ``(settings, records)`` of the profile's trial log (``headprobe.read_log``), or ``None`` for the
        interval panel only.
    k
        Top-k set of the stability panel (default: the run's ``--until-stable`` k, else 20).
    """
    if profile.query_heads is None or not profile.intervals:
        raise HeadprobeError(f"{profile.kind} profile of {short_model_name(profile.model.name)} has no bootstrap intervals "
                             "to plot (profiles written by this version of headprobe have them)")
    iv = profile.intervals
    panels = 2 if log is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, max(3.5, 0.28 * top + 1.2)), squeeze=False)
    ax = axes[0, 0]
    heads = profile.top_heads(top)
    means = np.array([s for _, _, s in heads])
    low = np.array([iv["low"][l][h] for l, h, _ in heads])
    high = np.array([iv["high"][l][h] for l, h, _ in heads])
    y = np.arange(len(heads))[::-1]
    ax.errorbar(means, y, xerr=[means - low, high - means], fmt="o", color="C0", ecolor="C0", capsize=3)
    ax.set_yticks(y, [f"{l}-{h}" for l, h, _ in heads])
    ax.set_xlabel(f"mean score over passing trials, {100 * iv['level']:g}% bootstrap interval")
    ax.set_ylabel("head (layer-query head), by rank")
    ax.set_title(f"top {len(heads)} heads ({iv.get('trials', '?')} passing trials, {iv['resamples']} resamples)",
                 fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    if log is not None:
        settings, records = log
        rule = settings.get("until_stable") or {}
        k = k or rule.get("k", 20)
        every = rule.get("check_every", 10)
        xs, ys = jaccard_curve(records, profile.kind, gate_name(profile.kind, settings), k, every)
        ax2 = axes[0, 1]
        ax2.plot(xs, ys, marker=".", color="C1", label=f"top-{k} Jaccard (bootstrap mean)")
        if rule:
            ax2.axhline(rule["jaccard"], color="grey", linestyle="--", label=f"stop at {rule['jaccard']}")
        ax2.set_xlabel("trials run (log order)")
        ax2.set_ylabel(f"mean Jaccard, resampled vs. profile top-{k}")
        ax2.set_ylim(0, 1.02)
        ax2.set_title(f"top-{k} stability as trials are added", fontsize=10)
        ax2.grid(alpha=0.3)
        ax2.legend(loc="lower right", fontsize=8)
    mode = profile.probe.get("mode", "?")
    share = profile.probe.get("recompute_share")
    mode_label = f"{mode}, share {100 * share:g}%" if share is not None else mode
    fig.suptitle(f"{short_model_name(profile.model.name)}: {_probe_label(profile)} ({mode_label}): head stability",
                 fontsize=11)
    fig.tight_layout()
    return fig
