"""Eval figures: the needle grid (length × depth, one panel per setting), accuracy versus cache bytes, and
RULER's score per task versus cache bytes."""

from __future__ import annotations

import math
import os

import matplotlib

if not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.colors import LinearSegmentedColormap
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from ..eval.result import EvalResult
from ..eval.ruler_task import ruler_points
from .profile_figures import short_model_name

#: Red (miss) to green (found), like the needle-in-a-haystack figures of the papers.
NEEDLE_CMAP = LinearSegmentedColormap.from_list("needle", ["#F0496E", "#EBB839", "#0CD79F"])


def needle_grid(result: EvalResult, columns: int = 4) -> Figure:
    """One heatmap per setting: depth (rows, 0% at the top) × prompt length (columns), cell = accuracy."""
    labels = [s["label"] for s in result.settings]
    n = max(len(labels), 1)
    cols = min(columns, n)
    rows = math.ceil(n / cols)
    lengths, depths = result.grid["lengths"], result.grid["depths"]
    w = max(2.6, 0.55 * len(lengths) + 1.6)
    h = max(2.2, 0.35 * len(depths) + 1.3)
    fig, axes = plt.subplots(rows, cols, figsize=(w * cols + 1.2, h * rows + 0.6), squeeze=False)
    summary = {s["setting"]: s for s in result.summary()}
    for k, ax in enumerate(axes.ravel()):
        if k >= n:
            ax.axis("off")
            continue
        label = labels[k]
        grid = result.accuracy_grid(label)
        sns.heatmap(grid, ax=ax, vmin=0, vmax=1, cmap=NEEDLE_CMAP, annot=grid.size <= 60, fmt=".2f",
                    cbar=k == n - 1, linewidths=0.5, linecolor="white",
                    xticklabels=[str(x) for x in lengths],
                    yticklabels=[f"{100 * float(d):.0f}%" if d is not None else "-" for d in depths],
                    cbar_kws={"label": "accuracy"} if k == n - 1 else None)
        acc = summary.get(label, {}).get("mean_accuracy")
        ax.set_title(f"{label}" + (f"  (mean {acc:.2f})" if acc is not None else ""), fontsize=9)
        ax.set_xlabel("context length (tokens)", fontsize=8)
        ax.set_ylabel("needle depth", fontsize=8)
        ax.tick_params(labelsize=7)
    task = {"babi": "reasoning-in-a-haystack accuracy", "dataset": "dataset QA accuracy",
            "longgen": "long generation, ROUGE-L F1 against the full cache"}.get(result.task.get("kind"),
                                                                                  "needle-in-a-haystack accuracy")
    fig.suptitle(f"{short_model_name(result.model.get('name', ''))}: {task}", fontsize=11)
    fig.tight_layout()
    return fig


def accuracy_vs_memory(result: EvalResult) -> Figure:
    """Mean accuracy against the real cache size (MiB), one line per method across capacities; kvpress's
    presses (``kvpress:`` settings, run by kvpress) dashed with square markers beside headprobe's settings."""
    summary = [s for s in result.summary() if s.get("cells")]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    names = list(dict.fromkeys(s["name"] for s in summary))
    palette = sns.color_palette("tab10", len(names))
    for color, name in zip(palette, names, strict=False):
        pts = sorted((s["cache_bytes"] / 2**20, s["mean_accuracy"], s["capacity"]) for s in summary
                     if s["name"] == name)
        xs, ys, caps = zip(*pts, strict=True)
        if len(pts) == 1 and caps[0] is None:
            ax.axhline(ys[0], color=color, ls=":" if name.startswith("kvpress:") else "--", lw=1,
                       label=f"{name} ({xs[0]:.0f} MiB)")
            continue
        kvpress = name.startswith("kvpress:")
        ax.plot(xs, ys, marker="s" if kvpress else "o", ls="--" if kvpress else "-", color=color, label=name)
        for x, y, c in pts:
            ax.annotate(str(c), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7, color=color)
    ax.set_xscale("log")
    ticks = FuncFormatter(lambda x, _: f"{x:g}")
    ax.xaxis.set_major_formatter(ticks)
    ax.xaxis.set_minor_formatter(ticks)
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_xlabel("KV cache allocated (MiB, log scale; labels = capacity per head)")
    longgen = result.task.get("kind") == "longgen"
    ax.set_ylabel("mean ROUGE-L F1 against the full cache" if longgen else "mean accuracy")
    ax.set_ylim(-0.03, 1.03)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    what = "long-generation fidelity" if longgen else "accuracy"
    ax.set_title(f"{short_model_name(result.model.get('name', ''))}: {what} vs cache memory", fontsize=10)
    fig.tight_layout()
    return fig


def ruler_vs_memory(result: EvalResult, columns: int = 3) -> Figure:
    """RULER's score against the cache each setting held, one panel per task (and RULER's average).

    Each method is a line over its compression ratios (points labelled with the ratio); kvpress's presses
    (``kvpress:`` settings, run by kvpress) dashed with square markers beside headprobe's settings; the full
    cache's score is the ceiling, a dotted line across each panel. The x axis is the bytes the cache held
    as a share of a full cache of the same tokens (log scale), so a press that masks instead of freeing
    memory sits at 100 % whatever it attends. The numbers are :func:`headprobe.eval.ruler_task.ruler_points`.
    """
    points = ruler_points(result)
    panels = list(dict.fromkeys(p["panel"] for p in points if p["panel"] != "average"))
    if any(p["panel"] == "average" for p in points):
        panels.append("average")
    names = list(dict.fromkeys(p["name"] for p in points if p["name"] != "full"))
    colors = dict(zip(names, sns.color_palette("tab10" if len(names) <= 10 else "tab20", len(names)), strict=True))
    n = max(len(panels), 1)
    cols = min(columns, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols + 1.8, 3.6 * rows + 0.6), squeeze=False)
    for k, ax in enumerate(axes.ravel()):
        if k >= n:
            ax.axis("off")
            continue
        here = [p for p in points if p["panel"] == panels[k]]
        full = next((p for p in here if p["name"] == "full"), None)
        if full is not None:
            ax.axhline(full["score"], color="black", ls=":", lw=1.2, label="full cache (ceiling)")
        for name in names:
            pts = sorted((p for p in here if p["name"] == name), key=lambda p: p["share"])
            if not pts:
                continue
            kv = pts[0]["kvpress"]
            ax.plot([100 * p["share"] for p in pts], [p["score"] for p in pts], color=colors[name],
                    marker="s" if kv else "o", ls="--" if kv else "-", lw=1.2, ms=4, label=name)
            for p in pts:
                if p["ratio"] is not None:
                    ax.annotate(f"{p['ratio']:g}", (100 * p["share"], p["score"]), textcoords="offset points",
                                xytext=(3, 3), fontsize=6, color=colors[name])
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}%"))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: f"{x:g}%" if f"{x:g}"[0] in "25" else ""))
        ax.tick_params(axis="both", which="both", labelsize=7)
        ax.set_ylim(-3, 103)
        ax.grid(True, alpha=0.3)
        ax.set_title(panels[k] if panels[k] == "average" else panels[k].replace("@", " at "), fontsize=9)
        ax.set_xlabel("cache held, share of a full cache (log)", fontsize=8)
        ax.set_ylabel("RULER score", fontsize=8)
    handles, labels = {}, []
    for ax in axes.ravel():
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    fig.legend([handles[lab] for lab in labels], labels, loc="center right", fontsize=7, frameon=False)
    fig.suptitle(f"{short_model_name(result.model.get('name', ''))}: RULER score vs cache held\n"
                 "(labels = compression ratio; dashed = kvpress's presses)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 1.8 / (4.6 * cols + 1.8), 1))
    return fig


def ablation_bars(ablation: dict) -> Figure:
    """Needle accuracy with the top-k heads masked versus k random heads (one pair of bars per k)."""
    rows = ablation["rows"]
    ks = [r["k"] for r in rows]
    x = np.arange(len(ks))
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    ax.bar(x - 0.2, [r["top_accuracy"] for r in rows], 0.4, label="top-k heads masked", color="#F0496E")
    ax.bar(x + 0.2, [r["random_accuracy"] for r in rows], 0.4, label="k random heads masked", color="#4C72B0")
    ax.axhline(ablation["baseline_accuracy"], color="k", ls="--", lw=1, label="no heads masked")
    ax.set_xticks(x, [f"k={k}" for k in ks])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("needle accuracy")
    ax.legend(fontsize=7)
    ax.set_title(f"{short_model_name(ablation['model'].get('name', ''))}: masking {ablation['profile_kind']} heads",
                 fontsize=10)
    fig.tight_layout()
    return fig
