"""Markdown tables from a ``headprobe eval`` result: per setting, and accuracy per context length.

Usage::

    python benchmarks/eval_tables.py eval/eval.json

Prints two tables: every setting with its mean accuracy, found rate (score > 0.5), allocated and held
cache MiB, share of a full cache and ms per generated token; then mean accuracy per context length.
Long-generation results (``--task longgen``) also get the mean needle recall.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

import headprobe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", help="a headprobe.eval result JSON")
    args = parser.parse_args()
    result = headprobe.EvalResult.load(args.result)
    summary = [s for s in result.summary() if s.get("cells")]
    longgen = any("needle_recall" in s for s in summary)
    head = "| setting | mean accuracy | found | cache allocated MiB | pairs held MiB | share of full cache | ms / token |"
    if longgen:
        head = head.replace("| mean accuracy | found |", "| mean ROUGE-L vs full | ROUGE-L > 0.5 |")
        head = head.replace("| ms / token |", "| needle recall | ms / token |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for s in summary:
        share = 100.0 * s["cache_bytes"] / s["full_cache_bytes"]
        row = (f"| {s['setting']} | {s['mean_accuracy']:.2f} | {s['pass_rate']:.2f} | {s['cache_bytes'] / 2**20:.2f} | "
               f"{s['used_bytes'] / 2**20:.2f} | {share:.1f}% |")
        if longgen:
            row += f" {s['needle_recall']:.2f} |"
        print(row + f" {s['ms_per_token']:.0f} |")
    lengths = result.grid["lengths"]
    by: dict[tuple[str, int], list[float]] = defaultdict(list)
    for c in result.cells:
        by[(c["setting"], c["length"])].append(c["accuracy"])
    print()
    print("| setting | " + " | ".join(str(L) for L in lengths) + " |")
    print("|---|" + "---:|" * len(lengths))
    for s in summary:
        cells = [by.get((s["setting"], L)) for L in lengths]
        print(f"| {s['setting']} | " + " | ".join(f"{np.mean(c):.2f}" if c else "–" for c in cells) + " |")


if __name__ == "__main__":
    main()
