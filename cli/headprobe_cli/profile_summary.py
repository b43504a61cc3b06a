"""What ``headprobe profile`` says when it ends: what was found, and what to run next."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np

from headprobe.profile import Profile

#: Heads listed per head-score profile.
TOP_HEADS = 5
#: Layers listed for a layer-retention profile.
TOP_LAYERS = 3


def head_lines(profile: Profile, top: int = TOP_HEADS) -> list[str]:
    """The ``top`` query heads of a head-score profile by score, each with its bootstrap interval when the
    profile has one: ``L12.H3 0.412 [0.318, 0.507]``."""
    scores = np.asarray(profile.query_heads, dtype=float)             # [layers, query heads]
    order = np.argsort(-scores, axis=None, kind="stable")[:top]
    low = high = None
    if profile.intervals:
        low = np.asarray(profile.intervals["low"], dtype=float)
        high = np.asarray(profile.intervals["high"], dtype=float)
    cells = []
    for flat in order:
        layer, head = np.unravel_index(flat, scores.shape)
        cell = f"L{layer}.H{head} {scores[layer, head]:.3f}"
        if low is not None and high is not None:
            level = profile.intervals.get("level", 0.9)
            cell += f" [{low[layer, head]:.3f}, {high[layer, head]:.3f}]" + ("" if cells else f" ({level:.0%} interval)")
        cells.append(cell)
    return cells


def retention_line(profile: Profile, top: int = TOP_LAYERS) -> str:
    """The layers whose retention share, averaged over the profile's tasks, is largest."""
    tasks = profile.retention or {}
    means = [np.asarray(t.mean, dtype=float) for t in tasks.values()]
    if not means:
        return "no task"
    mean = np.mean(means, axis=0)                                      # [layers]
    order = np.argsort(-mean, kind="stable")[:top]
    return ", ".join(f"layer {i} {mean[i]:.1%}" for i in order) + f" of the kept tokens (mean of {len(means)} tasks)"


def summary_lines(paths: list[Path], default_dir: Path | None = None) -> list[str]:
    """The run's closing lines for the profiles at ``paths``: the top heads (or layers) of each, then the
    commands that use them (``allocate`` with the profile, ``plot``).

    Parameters
    ----------
    default_dir
        The folder ``allocate`` reads without ``--profile`` (the user's profiles folder): when the profiles
        were written there, the commands need not name them.
    """
    if not paths:
        return []
    profiles = [(Path(p), Profile.load(p)) for p in paths]
    lines = ["", "what the profiles hold:"]
    for _, profile in profiles:
        if profile.kind == "layer_retention":
            lines.append(f"  {profile.kind}: {retention_line(profile)}")
            continue
        t = profile.trials
        lines.append(f"  {profile.kind} ({t.get('passed')}/{t.get('total')} trials passed): top heads "
                     + "; ".join(head_lines(profile)))
    heads = [(p, prof) for p, prof in profiles if prof.kind != "layer_retention"]
    layers = [p for p, prof in profiles if prof.kind == "layer_retention"]
    lines += ["", "next:"]
    in_default = default_dir is not None and all(p.parent.resolve() == Path(default_dir).resolve() for p, _ in profiles)
    if heads:
        path, prof = next(((p, x) for p, x in heads if x.kind == "retrieval_reasoning"), heads[0])
        named = "" if in_default else f" --profile {shlex.quote(str(path))}"
        lines.append(f"  headprobe allocate{named} --beta 1.01 -o budget.json   # KV budgets by the {prof.kind} scores")
        lines.append("  headprobe generate --budget budget.json \"...\"   # generate with that cache")
        lines.append(f"  headprobe plot {' '.join(shlex.quote(str(p)) for p, _ in heads)}   # head heatmaps")
    if layers:
        named = "" if in_default else f" --profile {shlex.quote(str(layers[0]))}"
        lines.append(f"  headprobe allocate --method dynamickv{named} -o layers.json   # budgets per layer")
    return lines
