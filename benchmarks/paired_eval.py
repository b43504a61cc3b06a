"""Each setting's accuracy in a needle (or bAbI) eval result, and one setting's lead over each of the others
with a paired bootstrap interval, trial by trial (the same prompts; tune's bootstrap: 90%, 2,000 resamples,
seed 0, over the trials sorted by id).

    python benchmarks/paired_eval.py EVAL_RESULT.json --lead "dynamickv:tune.c128.budget.json[...]@128"

Used for the held-out checks of tune's chosen settings at depths the search never saw (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse

import numpy as np
from tune_tables import trials_by_setting  # benchmarks/ is the script's folder

from headprobe.eval.result import EvalResult
from headprobe.tune.halving import HalvingRule, bootstrap_means, interval


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", help="a headprobe eval result (JSON)")
    ap.add_argument("--lead", required=True, help="the setting label whose lead over the others is shown")
    args = ap.parse_args()
    result = EvalResult.load(args.result)
    if not result.complete:
        raise SystemExit(f"{args.result}: an unfinished run (complete: false); finish it with --resume first")
    trials = {lab: {k: float(t["score"]) for k, t in by_key.items()}
              for lab, by_key in trials_by_setting(result).items()}
    if args.lead not in trials:
        raise SystemExit(f"--lead {args.lead}: not a setting of {args.result} ({', '.join(trials)})")
    keys = sorted(trials[args.lead], key=lambda k: (k[0], k[1], -1.0 if k[2] is None else k[2]))
    labels = [args.lead] + [lab for lab in trials if lab != args.lead and set(trials[lab]) >= set(keys)]
    rule = HalvingRule()
    scores = np.array([[trials[lab][k] for k in keys] for lab in labels])
    boot = bootstrap_means(scores, rule)
    print(f"{len(keys)} trials a setting; {rule.level:.0%} paired bootstrap, {rule.resamples} resamples\n")
    print(f"| setting | accuracy | interval | {args.lead} − it |")
    print("|---|---:|---|---|")
    for i in np.argsort(-scores.mean(axis=1), kind="stable"):
        lo, hi = interval(boot[:, i], rule.level)
        lead = "–" if i == 0 else "[{:+.2f}, {:+.2f}]".format(*interval(boot[:, 0] - boot[:, i], rule.level))
        print(f"| `{labels[i]}` | {scores[i].mean():.2f} | [{lo:.2f}, {hi:.2f}] | {lead} |")


if __name__ == "__main__":
    main()
