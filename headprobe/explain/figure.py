"""The figure of an explanation: the budget per layer and KV head, and each engine's bytes against a full cache."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

if not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.figure import Figure

from ..files.overwrite import check_overwrite
from ..plots.profile_figures import fit_title, save_figure
from .explanation import Explanation
from .setting import format_bytes


def _label(e) -> str:
    words = e.setting if len(e.setting) <= 46 else e.setting[:45] + "…"
    stored = "" if not e.runs else " (per query head)" if e.stored == "query_head" else " (per KV head)"
    return f"{e.engine}{stored}\n{words}"


def explain_figure(ex: Explanation) -> Figure:
    """Two panels: a heatmap of the budget's tokens ``[layers][kv_heads]`` at the context, and horizontal bars of
    every engine's bytes after prefill (light) and at the end (dark), with the full cache marked."""
    b = np.asarray(ex.budget, dtype=np.float64)
    layers, heads = b.shape
    rows = len(ex.engines)
    height = max(4.0, min(0.22 * layers + 1.5, 12.0), 0.55 * rows + 1.5)
    fig, (heat, bars) = plt.subplots(1, 2, figsize=(min(1.6 + 0.45 * heads, 6.0) + 8.5, height),
                                     constrained_layout=True,
                                     gridspec_kw={"width_ratios": [min(1.6 + 0.45 * heads, 6.0), 8.5]})
    sns.heatmap(b, ax=heat, cmap="viridis", cbar_kws={"label": "tokens kept"},
                yticklabels=max(1, layers // 16), xticklabels=True)
    heat.set_xlabel("KV head")
    heat.set_ylabel("layer")
    heat.set_title(f"tokens per KV head at {ex.setting.context:,}", fontsize=10)
    y = np.arange(rows)
    full = ex.full_bytes(True)
    for i, e in enumerate(ex.engines):
        if not e.runs:
            bars.text(0.01 * full, i, "cannot run", va="center", fontsize=8, color="grey")
            continue
        bars.barh(i, e.bytes_end, color="steelblue", height=0.6)
        bars.barh(i, e.bytes_prefill, color="lightsteelblue", height=0.25)
        masked = "\nmasks: nothing freed" if not e.frees_memory else ""
        bars.text(e.bytes_end, i, f"  {format_bytes(e.bytes_end)} ({e.bytes_end / full:.1%}){masked}", va="center",
                  fontsize=7.5)
    bars.axvline(full, color="black", ls="--", lw=1)
    bars.text(full, -0.7, " full cache", fontsize=8, va="bottom")
    bars.set_yticks(y, [_label(e) for e in ex.engines], fontsize=7)
    bars.set_ylim(rows - 0.5, -1.0)
    bars.set_xlim(0, full * 1.5)
    bars.set_xlabel(f"cache bytes (batch {ex.setting.batch}, {ex.setting.dtype}); thin: after prefill, wide: after "
                    f"{ex.setting.max_new_tokens} new tokens")
    bars.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: format_bytes(v)))
    bars.tick_params(axis="x", labelsize=8)
    total = int(b.sum())
    what = {"budget_map": "budget map", "profile": "profile", "duoattention": "DuoAttention pattern",
            "headkv": "HeadKV scores", "kvpress": "kvpress"}[ex.source["kind"]]
    names = ", ".join(Path(p).name for p in ex.source["paths"]) or ex.source["description"]
    fit_title(fig, fig.suptitle(f"{ex.model.name.split('/')[-1]}, {what} {names}: {total:,} tokens kept "
                                f"({total / ex.full_tokens():.1%} of a full cache) at {ex.setting.context:,} tokens",
                                fontsize=10))
    return fig


__all__ = ("explain_figure",)


def save_explain_figure(ex: Explanation, path: str | Path, force: bool = False) -> Path:
    """Draw :func:`explain_figure` and save it (PNG, or SVG by suffix), never replacing a file without ``force``."""
    check_overwrite(path, force)
    return save_figure(explain_figure(ex), path, force=force)
