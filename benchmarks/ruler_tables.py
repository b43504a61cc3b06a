"""A markdown table of a RULER eval run (``headprobe eval --task ruler --ratios ...``) with headprobe's settings
and kvpress's presses side by side, for ``docs/benchmarks.md``.

Usage::

    python benchmarks/ruler_tables.py RESULT.json [MORE.json ...] [--against snapkv kvpress:snapkv]

One row per setting: its ratio (from the result's ``task.ratios``), RULER's score (mean sample score × 100,
every task of the run together), the full cache's, the bytes the cache held as a share of a full cache's
for the same tokens (mean over samples), the prompt tokens a KV head attended (kvpress rows record it; a
headprobe row keeps its capacity), seconds per sample (the prompt forward included), and for each
``--against`` name (a setting's name without ``@capacity``) its paired bootstrap interval at the same
ratio: this row's score minus that setting's, sample by sample on the same prompts (90 %, 2,000 resamples,
seed 0, tune's bootstrap). ``best-kvpress`` stands for the kvpress press with the best score at the ratio.

Several results of the same samples (a later run adding settings to an earlier one) make one table: a setting
in more than one keeps its first file's row, and the script stops if the runs answered it differently, so
a comparison across files rests on identical runs of the shared settings.

``--task NAME`` keeps one RULER task's samples (a run of several tasks), so each task's rows carry their own
paired intervals.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from headprobe.eval.result import EvalResult
from headprobe.tune.halving import HalvingRule, bootstrap_means, interval


def _rows(result: EvalResult, task: str | None = None) -> list[dict]:
    caps = {int(c): float(r) for r, c in (result.task.get("ratios") or {}).items()}
    out = []
    for cell in result.cells:
        setting = next(s for s in result.settings if s["label"] == cell["setting"])
        trials = sorted((t for t in cell["trials"] if task is None or t.get("task") == task),
                        key=lambda t: t["item"])
        if not trials:
            sys.exit(f"no samples of task {task!r} in the run's setting {cell['setting']}")
        out.append({
            "label": cell["setting"], "name": setting["name"], "capacity": setting["capacity"],
            "ratio": caps.get(setting["capacity"]) if setting["capacity"] is not None else None,
            "scores": np.array([float(t["score"]) for t in trials]), "items": [t["item"] for t in trials],
            "share": float(np.mean([t["cache_bytes"] / t["full_cache_bytes"] for t in trials])),
            "attended": float(np.mean([t.get("attended_tokens", setting["capacity"] or t["prompt_len"])
                                       for t in trials])),
            "seconds": float(np.mean([t["seconds"] for t in trials])),
        })
    return out


def _merged(runs: list[list[dict]], paths: list[str]) -> list[dict]:
    """One row per label over several runs; a label in more than one must have the same items and scores."""
    by_label: dict[str, dict] = {}
    for rows, path in zip(runs, paths, strict=True):
        for row in rows:
            first = by_label.setdefault(row["label"], row)
            if first is not row and (first["items"] != row["items"]
                                     or not np.array_equal(first["scores"], row["scores"])):
                sys.exit(f"{path}: setting {row['label']} scored differently from the earlier file's run")
    return list(by_label.values())


def _lead(row: dict, other: dict | None, rule: HalvingRule) -> str:
    if other is None or other is row or other["items"] != row["items"]:
        return "-"
    boot = bootstrap_means(np.stack([row["scores"], other["scores"]]), rule)
    lo, hi = interval(boot[:, 0] - boot[:, 1], rule.level)
    diff = 100 * (row["scores"].mean() - other["scores"].mean())
    return f"{diff:+.0f} [{100 * lo:+.0f}, {100 * hi:+.0f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", metavar="RESULT")
    ap.add_argument("--against", nargs="+", default=["snapkv", "best-kvpress"])
    ap.add_argument("--task", default=None, help="one RULER task's samples only (default: every task)")
    args = ap.parse_args()
    rows = _merged([_rows(EvalResult.load(path), args.task) for path in args.results], args.results)
    full = next((r for r in rows if r["name"] == "full"), None)
    rule = HalvingRule()
    head = "| setting | ratio | RULER score | full cache | cache bytes / full | tokens attended a head | s / sample |"
    head += "".join(f" − {a} |" for a in args.against)
    print(head)
    print("|---|---:|---:|---:|---:|---:|---:|" + "---|" * len(args.against))
    for row in sorted(rows, key=lambda r: (r["ratio"] is not None, r["ratio"] or 0, r["name"])):
        same = [r for r in rows if r["ratio"] == row["ratio"]]
        cells = []
        for a in args.against:
            if a == "best-kvpress":
                presses = [r for r in same if r["name"].startswith("kvpress:")]
                other = max(presses, key=lambda r: r["scores"].mean()) if presses else None
            else:
                other = next((r for r in same if r["name"] == a), None)
            cells.append(_lead(row, other, rule) if row["ratio"] is not None else "-")
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:g}"
        ceiling = "-" if full is None else f"{100 * full['scores'].mean():.0f}"
        print(f"| `{row['label']}` | {ratio} | {100 * row['scores'].mean():.0f} | {ceiling} | {row['share']:.1%} | "
              f"{row['attended']:.0f} | {row['seconds']:.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
