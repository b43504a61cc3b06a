"""Needle accuracy against capacity, one panel per observation window, one line per method.

Usage::

    python benchmarks/eval_window_figure.py eval.json [more.json ...] -o docs/figures/eval_windows.png

Reads ``headprobe eval`` results of one model and grid (several files are read as one) and draws, per
window (each method at its published setting; every method at window 8, at window 32, at its question
window), mean accuracy against capacity per head, with the full cache as a dashed line. A method keeps
its colour in every panel, so a method can be followed from its published window to the matched ones.
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from pathlib import Path

import matplotlib

if not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")

import matplotlib.pyplot as plt
import seaborn as sns

import headprobe
from headprobe.eval.presets import describe_window


def panels(results: list) -> tuple[dict[str, dict[str, dict[int, float]]], float | None]:
    """``{panel: {method: {capacity: accuracy}}}`` and the full cache's accuracy."""
    out: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    full = None
    for r in results:
        windows: dict[str, list[int]] = defaultdict(list)
        for c in r.cells:
            windows[c["setting"]].extend(t["window"] for t in c["trials"] if "window" in t)
        settings = {s["label"]: s for s in r.settings}
        for s in r.summary():
            if not s.get("cells"):
                continue
            method, window, kind = describe_window(settings[s["setting"]], windows.get(s["setting"], ()))
            if s["capacity"] is None:
                full = s["mean_accuracy"]
                continue
            if kind == "published":
                out["published settings"][f"{method} (window {window})"][s["capacity"]] = s["mean_accuracy"]
            if kind in ("published", "matched") and window != "none":
                out[f"window {window}"][method][s["capacity"]] = s["mean_accuracy"]
    return out, full


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    results = [headprobe.EvalResult.load(p) for p in args.results]
    data, full = panels(results)
    order = sorted(data, key=lambda k: (k != "published settings", not k.split(" ")[1].isdigit(),
                                        int(k.split(" ")[1]) if k.split(" ")[1].isdigit() else 0, k))
    methods = sorted({m.split(" (")[0] for p in data.values() for m in p})
    colors = dict(zip(methods, sns.color_palette("tab10", len(methods))))
    fig, axes = plt.subplots(1, len(order), figsize=(4.2 * len(order), 3.8), sharey=True, squeeze=False)
    for ax, key in zip(axes[0], order):
        for method, accs in sorted(data[key].items()):
            caps = sorted(accs)
            ax.plot(caps, [accs[c] for c in caps], marker="o", label=method, color=colors[method.split(" (")[0]])
        if full is not None:
            ax.axhline(full, color="grey", ls="--", lw=1, label="full cache")
        ax.set_xscale("log", base=2)
        ax.set_xticks([32, 64, 128, 256], ["32", "64", "128", "256"])
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("capacity (tokens per KV head)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6.5, loc="upper left")
    axes[0][0].set_ylabel("mean accuracy")
    axes[0][0].set_ylim(-0.03, 1.03)
    name = results[0].model.get("name", "").split("/")[-1]
    lengths = sorted({n for r in results for n in r.grid.get("lengths", [])})
    span = f"{lengths[0]:,}" + (f" to {lengths[-1]:,}" if len(lengths) > 1 else "") + " tokens" if lengths else ""
    fig.suptitle(f"{name}: needle accuracy by observation window" + (f", {span}" if span else ""), fontsize=11)
    fig.tight_layout()
    out = Path(args.out)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
