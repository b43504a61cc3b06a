"""Layer splits against their baselines in one needle eval result: per capacity, each group of settings'
accuracy (over every trial, and over the trials the full cache answers), the KV pairs it held, and the paired
bootstrap interval of each lead group minus every other group, trial by trial (90%, 2,000 resamples, seed 0,
over the trials the full cache answers, sorted by id).

    python benchmarks/layer_split_tables.py eval.json [more.json ...] --group "split=^layer_window:ret" \\
        --group "random=^layer_window:rand" --group "uniform=^layer_window@" --group "headkv-r=^headkv-r@" \\
        --lead split --lead headkv-r

A group is a name and a regular expression over setting labels; at each capacity the settings it matches are
one row, their scores averaged trial by trial (several seeds of a random split: their mean). ``--same-bytes
A=B`` tables the settings run at capacity A with those at B: on a model whose own sliding layers a capacity
does not compress (Gemma 3), per-head settings hold a split's bytes at another capacity than the split's mean. The full cache
answers a trial when its score is above 0.5 (the eval's "found"). Several results of the same prompts (the
same model, needles, lengths and depths, as a later run of more settings) are read as one: their settings
are joined by label, and a label in two of them is refused.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict

import numpy as np
from tune_tables import trials_by_setting  # benchmarks/ is the script's folder

from headprobe.eval.result import EvalResult
from headprobe.tune.halving import HalvingRule, bootstrap_means, interval

FOUND = 0.5


def parse_groups(specs: list[str]) -> list[tuple[str, re.Pattern]]:
    out = []
    for spec in specs:
        name, sep, pattern = spec.partition("=")
        if not sep or not name or not pattern:
            raise SystemExit(f"--group {spec!r}: expected NAME=REGEX")
        out.append((name, re.compile(pattern)))
    return out


def _trial_name(key: tuple) -> str:
    """A needle trial by its needle and depth; a dataset item (RULER's) by its id."""
    return f"{key[0]} at depth {100 * key[2]:g}%" if key[2] is not None else str(key[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="headprobe eval results (JSON) of the same prompts, one with a "
                    "full-cache setting")
    ap.add_argument("--group", action="append", required=True, help="NAME=REGEX over setting labels")
    ap.add_argument("--lead", action="append", default=[], help="a group whose lead over the others is shown")
    ap.add_argument("--same-bytes", action="append", default=[], metavar="A=B",
                    help="table the settings at capacity A with those at capacity B (they hold the same bytes)")
    args = ap.parse_args()
    same = {}
    for spec in args.same_bytes:
        a, sep, b = spec.partition("=")
        if not sep or not a.isdigit() or not b.isdigit():
            raise SystemExit(f"--same-bytes {spec!r}: expected two capacities A=B")
        same[int(a)] = int(b)
    trials: dict[str, dict[tuple, dict]] = {}
    capacity: dict[str, int | None] = {}
    for path in args.results:
        result = EvalResult.load(path)
        if not result.complete:
            raise SystemExit(f"{path}: an unfinished run (complete: false); finish it with --resume first")
        for label, by_key in trials_by_setting(result).items():
            if label in trials and label != "full":
                raise SystemExit(f"{path}: setting {label} is in two results")
            trials.setdefault(label, by_key)
        capacity.update({s["setting"]: same.get(s["capacity"], s["capacity"]) for s in result.summary()})
    groups = parse_groups(args.group)
    names = [n for n, _ in groups]
    for lead in args.lead:
        if lead not in names:
            raise SystemExit(f"--lead {lead}: not a group ({', '.join(names)})")
    full = trials.get("full")
    if full is None:
        raise SystemExit("no full-cache setting in the results")
    for label, by_key in trials.items():
        if set(by_key) != set(full):
            raise SystemExit(f"setting {label} ran other prompts than the full cache; read results of one grid")
    keys = sorted(full, key=lambda k: (k[0], k[1], k[2]))
    answered = [k for k in keys if float(full[k]["score"]) > FOUND]
    print(f"{len(keys)} trials a setting; the full cache answers {len(answered)} (mean score "
          f"{np.mean([float(full[k]['score']) for k in keys]):.2f}); it fails on: "
          + (", ".join(_trial_name(k) for k in keys if k not in answered) or "none"))
    by_cap: dict[int, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for label, cap in capacity.items():
        for name, pattern in groups:
            if cap is not None and pattern.search(label):
                by_cap[cap][name].append(label)
    rule = HalvingRule()
    for cap in sorted(by_cap):
        rows = [n for n in names if by_cap[cap].get(n)]
        mean = {n: [np.mean([float(trials[lab][k]["score"]) for lab in by_cap[cap][n]]) for k in keys] for n in rows}
        held = {n: np.mean([float(trials[lab][k]["used_bytes"]) for lab in by_cap[cap][n] for k in keys]) / 2 ** 20
                for n in rows}
        idx = [keys.index(k) for k in answered]
        scores = np.array([[mean[n][i] for i in idx] for n in rows])
        boot = bootstrap_means(scores, rule) if len(idx) else None
        leads = [lead for lead in args.lead if lead in rows]
        print(f"\ncapacity {cap} tokens per KV head ({len(idx)} trials the full cache answers; "
              f"{rule.level:.0%} paired bootstrap)\n")
        print("| setting | settings | all trials | where full answers | KV pairs held MiB | "
              + " | ".join(f"{lead} − it" for lead in leads) + " |")
        print("|---|---:|---:|---:|---:|" + "---|" * len(leads))
        for i, n in enumerate(rows):
            cells = []
            for lead in leads:
                j = rows.index(lead)
                if j == i or boot is None:
                    cells.append("–")
                    continue
                d = scores[j] - scores[i]
                lo, hi = interval(boot[:, j] - boot[:, i], rule.level)
                cells.append(f"{d.mean():+.2f} [{lo:+.2f}, {hi:+.2f}]")
            answered_mean = f"{scores[i].mean():.2f}" if len(idx) else "–"
            print(f"| {n} | {len(by_cap[cap][n])} | {np.mean(mean[n]):.2f} | {answered_mean} | {held[n]:.1f} | "
                  + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
