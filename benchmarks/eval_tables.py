"""Markdown tables from ``headprobe eval`` results: per setting, per context length, and by window.

Usage::

    python benchmarks/eval_tables.py eval/eval.json [more.json ...]

Prints three tables (several result files of one model and grid are read as one): every setting with its
observation window, whether it runs at its method's published setting or at a window chosen for the
comparison, mean accuracy, found rate (score > 0.5), allocated and held cache MiB, share of a full cache
and ms per generated token; then mean accuracy per context length; then mean accuracy per method and
capacity, one block per window. Long-generation results (``--task longgen``) also get the mean needle
recall.

"published" means a preset with the options its method was published with
(:data:`headprobe.eval.presets.PUBLISHED`); "window N" / "window question" a preset or policy whose
window was set for the comparison; a question window is shown with the range of sizes it took.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict

import numpy as np

import headprobe
from headprobe.eval.presets import PRESETS
from headprobe.eval.settings import QUESTION_WINDOW

_WINDOW = re.compile(r"\[window=([^\],]+)\]$")
#: Policies that score the prompt from an observation window (the others keep recent tokens or key
#: diversity whatever their ``window``).
OBSERVING = ("snapkv", "dynamickv", "keepkv", "morphkv")


def method_and_window(setting: dict, windows_seen: dict[str, list[int]]) -> tuple[str, str, str]:
    """``(method, window label, kind)`` of a setting from the result JSON; ``kind`` is ``published``,
    ``matched`` (a window set for the comparison) or ``custom``."""
    name, options = setting["name"], setting.get("options") or {}
    base = _WINDOW.sub("", name)
    if setting["policy"] == "full":
        return name, "–", "–"
    window = options.get("window", headprobe.POLICIES[setting["policy"]].window)
    if setting["policy"] not in OBSERVING:
        label = "none"
    elif window == QUESTION_WINDOW:
        seen = windows_seen.get(setting["label"], [])
        label = f"question ({min(seen)}–{max(seen)})" if seen else "question"
    else:
        label = str(window)
    if name in PRESETS and options == PRESETS[name][3]:
        kind = "published"
    elif base in PRESETS and set(options) - set(PRESETS[base][3]) <= {"window"}:
        kind = "matched"
    else:
        kind = "custom"
    return base, label, kind


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
    info = {label: method_and_window(s, windows_seen) for label, s in settings.items()}
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
    lengths = sorted({c["length"] for c in cells})
    by: dict[tuple[str, int], list[float]] = defaultdict(list)
    for c in cells:
        by[(c["setting"], c["length"])].append(c["accuracy"])
    print()
    print("| setting | " + " | ".join(str(L) for L in lengths) + " |")
    print("|---|" + "---:|" * len(lengths))
    for s in summary:
        row = [by.get((s["setting"], L)) for L in lengths]
        print(f"| {s['setting']} | " + " | ".join(f"{np.mean(c):.2f}" if c else "–" for c in row) + " |")
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
