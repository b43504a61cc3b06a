"""Markdown tables from ``headprobe eval`` results: per setting, per context length, and by window.

Usage::

    python benchmarks/eval_tables.py eval/eval.json [more.json ...]

Prints four tables (several result files of one model and grid are read as one): every setting with its
observation window, whether it runs at its method's published setting or at a window chosen for the
comparison, mean accuracy, found rate (score > 0.5), allocated and held cache MiB, share of a full cache
and ms per generated token; then mean accuracy per context length and per needle depth; then mean
accuracy per method and capacity, one block per window. Long-generation results (``--task longgen``) also get the mean needle
recall.

"published" means a preset with the options its method was published with
(:data:`headprobe.eval.presets.PUBLISHED`), "matched" a preset whose window was set for the comparison
(:func:`headprobe.eval.presets.describe_window`); a question window is shown with the range of sizes it
took, "none" marks policies without an observation window.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

import headprobe
from headprobe.eval.presets import describe_window


def print_breakdown(summary: list[dict], cells: list[dict], field: str, heading: str) -> None:
    """Mean accuracy per setting (rows) and per value of a cell's ``field`` (columns: length or depth)."""
    values = sorted({c[field] for c in cells if c.get(field) is not None})
    by: dict[tuple[str, float], list[float]] = defaultdict(list)
    for c in cells:
        by[(c["setting"], c.get(field))].append(c["accuracy"])
    label = (lambda v: f"{100 * v:g}%") if field == "depth" else str
    print(f"| setting \\ {heading} | " + " | ".join(label(v) for v in values) + " |")
    print("|---|" + "---:|" * len(values))
    for s in summary:
        row = [by.get((s["setting"], v)) for v in values]
        print(f"| {s['setting']} | " + " | ".join(f"{np.mean(c):.2f}" if c else "–" for c in row) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="headprobe.eval result JSONs (one model and grid)")
    args = parser.parse_args()
    results = [headprobe.EvalResult.load(p) for p in args.results]
    summary = [s for r in results for s in r.summary() if s.get("cells")]
    settings = {s["label"]: s for r in results for s in r.settings}
    cells = [c for r in results for c in r.cells]
    windows_seen: dict[str, list[int]] = defaultdict(list)
    for c in cells:
        windows_seen[c["setting"]].extend(t["window"] for t in c["trials"] if "window" in t)
    info = {label: describe_window(s, windows_seen.get(label, ())) for label, s in settings.items()}
    longgen = any("needle_recall" in s for s in summary)
    head = ("| setting | window | settings | mean accuracy | found | cache allocated MiB | pairs held MiB | "
            "share of full cache | ms / token |")
    if longgen:
        head = head.replace("| mean accuracy | found |", "| mean ROUGE-L vs full | ROUGE-L > 0.5 |")
        head = head.replace("| ms / token |", "| needle recall | ms / token |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for s in summary:
        share = 100.0 * s["cache_bytes"] / s["full_cache_bytes"]
        _, window, kind = info[s["setting"]]
        row = (f"| {s['setting']} | {window} | {kind} | {s['mean_accuracy']:.2f} | {s['pass_rate']:.2f} | "
               f"{s['cache_bytes'] / 2**20:.2f} | {s['used_bytes'] / 2**20:.2f} | {share:.1f}% |")
        if longgen:
            row += f" {s['needle_recall']:.2f} |"
        print(row + f" {s['ms_per_token']:.0f} |")
    for field, heading in (("length", "length"), ("depth", "depth")):
        print()
        print_breakdown(summary, cells, field, heading)
    # mean accuracy by method x capacity, one block per window
    capacities = sorted({s["capacity"] for s in summary if s["capacity"] is not None})
    blocks: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for s in summary:
        if s["capacity"] is None:
            continue
        method, window, kind = info[s["setting"]]
        key = f"window {window.split(' ')[0]}" + (" (published)" if kind == "published" else "")
        blocks[key][method][s["capacity"]] = s["mean_accuracy"]

    def order(key: str) -> tuple[int, str]:
        w = key.split(" ")[1]
        return (int(w) if w.isdigit() else 10**6, key)

    print()
    print("| window | method | " + " | ".join(str(c) for c in capacities) + " |")
    print("|---|---|" + "---:|" * len(capacities))
    for key in sorted(blocks, key=order):
        for method, accs in blocks[key].items():
            print(f"| {key} | {method} | " + " | ".join(f"{accs[c]:.2f}" if c in accs else "–" for c in capacities)
                  + " |")


if __name__ == "__main__":
    main()
