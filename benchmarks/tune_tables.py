"""Markdown tables for ``docs/benchmarks.md`` ("Tune"): the tuned settings against every preset on the held-out
items, and the cost of tune against one eval of all presets on the same grid.

Usage::

    python benchmarks/tune_tables.py TUNE_REPORT.json PRESETS_EVAL.json [--tune-time LOG ...] [--eval-time LOG]

``PRESETS_EVAL.json`` is a ``headprobe eval`` of every preset on the same grid (calibration and held-out
items); its trials on the held-out items give every preset's held-out accuracy, paired trial by trial with
the tuned setting's (the same prompts: the intervals are the tune report's paired bootstrap, same seed and
level). The settings both ran on the held-out items (the full cache, and the presets tune evaluated itself)
must agree trial by trial; the script checks it. ``--tune-time``/``--eval-time`` read ``/usr/bin/time -v``
logs (several for a run that was resumed) for wall and CPU seconds.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

from headprobe.eval.presets import PUBLISHED
from headprobe.eval.result import EvalResult
from headprobe.tune.halving import HalvingRule, bootstrap_means, interval
from headprobe.tune.report import load_tune_report


def _times(paths: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds summed over ``/usr/bin/time -v`` logs."""
    wall = cpu = 0.0
    for path in paths:
        text = Path(path).read_text(errors="replace")
        m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
        parts = [float(p) for p in m.group(1).split(":")]
        wall += sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
        cpu += sum(float(x) for x in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", text))
    return wall, cpu


def trials_by_setting(result: EvalResult) -> dict[str, dict[tuple, dict]]:
    """``{setting label: {(item, length, depth): trial}}`` over every cell of ``result``."""
    out: dict[str, dict[tuple, dict]] = {}
    for c in result.cells:
        for t in c["trials"]:
            out.setdefault(c["setting"], {})[(t["item"], c["length"], c["depth"])] = t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report")
    ap.add_argument("presets")
    ap.add_argument("--tune-time", nargs="*", default=[])
    ap.add_argument("--eval-time", nargs="*", default=[])
    args = ap.parse_args()
    report = load_tune_report(args.report)
    runs = Path(args.report).with_name(Path(args.report).stem + ".runs")
    held_run = trials_by_setting(EvalResult.load(runs / "holdout.json"))
    base = trials_by_setting(EvalResult.load(args.presets))
    rule = HalvingRule(**{k: report["rule"][k] for k in ("eta", "level", "resamples", "seed")})
    holdout = report["split"]["holdout"]
    keys = sorted(k for k in next(iter(held_run.values())) if k[0] in holdout)
    for label, trials in held_run.items():          # tune's own held-out runs agree with the eval's
        if label in base:
            for k in keys:
                assert trials[k]["response"] == base[label][k]["response"], (label, k)
    print(f"held-out items {', '.join(holdout)}: {len(keys)} trials per setting; intervals: {rule.level:.0%} "
          f"paired bootstrap, {rule.resamples} resamples\n")
    print("| capacity | setting | held-out accuracy | interval | tuned − it | cache MiB |")
    print("|---:|---|---:|---|---|---:|")
    summary = []
    for cap in report["capacities"]:
        c = cap["capacity"]
        chosen = cap["chosen"]["label"]
        labels = [chosen] + [s for s in base if (s.endswith(f"@{c}") or s == "full") and s != chosen]
        scores = np.array([[(held_run.get(lab) or base[lab])[k]["score"] for k in keys] for lab in labels])
        boot = bootstrap_means(scores, rule)
        nbytes = [np.mean([(held_run.get(lab) or base[lab])[k]["cache_bytes"] for k in keys]) for lab in labels]
        rows = []
        for i, lab in enumerate(labels):
            lead = "–" if i == 0 else "[{:+.2f}, {:+.2f}]".format(*interval(boot[:, 0] - boot[:, i], rule.level))
            lo, hi = interval(boot[:, i], rule.level)
            rows.append((scores[i].mean(), lab, lo, hi, lead, nbytes[i] / 2**20))
        name = {lab: lab.split("@")[0] for lab in labels}
        presets = [r for r in rows if name[r[1]] in PUBLISHED and r[1] != "full"]   # the tuned one too, if a preset
        best = max(presets, key=lambda r: r[0])
        for acc, lab, lo, hi, lead, mib in sorted(rows, key=lambda r: -r[0]):
            mark = " (tuned, the best preset)" if lab == chosen == best[1] else " (tuned)" if lab == chosen \
                else " (best preset)" if lab == best[1] else ""
            print(f"| {c} | `{lab}`{mark} | {acc:.2f} | [{lo:.2f}, {hi:.2f}] | {lead} | {mib:.2f} |")
        pub = {n: next((r for r in rows if r[1] == f"{n}@{c}"), None) for n in ("snapkv", "headkv-r")}
        summary.append((c, chosen, rows[0], best, pub))
    print("\n| capacity | tuned | best preset (hindsight) | tuned − best | SnapKV | HeadKV-R |")
    print("|---:|---|---|---|---|---|")
    for c, _chosen, mine, best, pub in summary:
        cols = [f"{r[0]:.2f} {r[4]}" if r else "– (not run)" for r in (pub["snapkv"], pub["headkv-r"])]
        print(f"| {c} | {mine[0]:.2f} | `{best[1]}` {best[0]:.2f} | {best[4]} | {cols[0]} | {cols[1]} |")
    cost = report["cost"]
    eval_trials = sum(len(t) for t in base.values())
    print(f"\ntune: {cost['search_trials']} search trials + {cost['holdout_trials']} held-out trials = "
          f"{cost['trials']}; eval of every preset: {eval_trials} trials")
    if args.tune_time and args.eval_time:
        tw, tc = _times(args.tune_time)
        ew, ec = _times(args.eval_time)
        print(f"tune {tw / 60:.1f} min wall, {tc / 60:.1f} min CPU; eval {ew / 60:.1f} min wall, {ec / 60:.1f} min CPU; "
              f"ratio {tw / ew:.2f} wall, {tc / ec:.2f} CPU")


if __name__ == "__main__":
    main()
