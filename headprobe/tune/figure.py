"""The tune figure: accuracy with its interval against cache bytes, one panel per capacity.

Every candidate tried is a point at its calibration accuracy (over the trials it ran, with its bootstrap
interval), coloured by how far it got; the chosen setting is a star. Beside them, on the held-out items,
the chosen setting (hollow star) and the published presets (diamonds, labelled), each with its interval.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

from ..plots.profile_figures import plt  # the plots' backend choice (Agg without a display)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_STATUS = {"dropped": ("#B8B8B8", "dropped early"), "finalist": ("#4C72B0", "reached the last rung"),
           "chosen": ("#D62728", "chosen (calibration)")}


def tune_figure(report: dict[str, Any]) -> Figure:
    """The figure of a tune report (:func:`~headprobe.tune.report.build_report`)."""
    caps = report["capacities"]
    fig, axes = plt.subplots(1, len(caps), figsize=(4.6 * len(caps), 4.2), squeeze=False)
    for ax, cap in zip(axes[0], caps, strict=False):
        for status, (color, label) in _STATUS.items():
            pts = [c for c in cap["candidates"] if c["status"] == status and c["accuracy"] is not None]
            if not pts:
                continue
            xs = [c["cache_bytes"] / 2**20 for c in pts]
            ys = [c["accuracy"] for c in pts]
            err = [[c["accuracy"] - c["interval"][0] for c in pts], [c["interval"][1] - c["accuracy"] for c in pts]]
            marker, size = ("*", 14) if status == "chosen" else ("o", 5)
            ax.errorbar(xs, ys, yerr=err, fmt=marker, ms=size, color=color, ecolor=color, elinewidth=0.8, alpha=0.85,
                        label=f"{label} ({len(pts)})", zorder=3 if status == "chosen" else 2)
        for row in cap["holdout"]:
            if row["kind"] == "full":
                continue
            x, y = row["cache_bytes"] / 2**20, row["accuracy"]
            err = [[y - row["interval"][0]], [row["interval"][1] - y]]
            if row["chosen"]:
                ax.errorbar([x], [y], yerr=err, fmt="*", ms=14, mfc="none", color="#D62728", elinewidth=0.8,
                            label="chosen, held out", zorder=4)
            elif row["published"]:
                ax.errorbar([x], [y], yerr=err, fmt="D", ms=5, color="#2CA02C", elinewidth=0.8, alpha=0.8,
                            label="presets, held out" if not ax.get_legend_handles_labels()[1].count(
                                "presets, held out") else None, zorder=2)
                ax.annotate(row["preset"], (x, y), textcoords="offset points", xytext=(4, -3), fontsize=6,
                            color="#2CA02C")
        full = next((r for r in cap["holdout"] if r["kind"] == "full"), None)
        if full is not None:
            ax.axhline(full["accuracy"], color="k", ls="--", lw=0.8, label="full cache, held out")
        chosen = textwrap.fill(cap["chosen"]["label"], 48, break_on_hyphens=False)   # long labels wrap, not overlap
        ax.set_title(f"{cap['capacity']} tokens per KV head, chosen:\n{chosen}", fontsize=8)
        ax.set_xlabel("KV cache allocated (MiB)")
        ax.set_ylabel("accuracy (bootstrap interval)")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6, loc="best")
    name = report["model"].get("name", "")
    fig.suptitle(f"{name.split('/')[-1]}: every candidate tried (calibration) and the presets (held out)", fontsize=10)
    fig.tight_layout()
    return fig


__all__ = ("tune_figure",)
