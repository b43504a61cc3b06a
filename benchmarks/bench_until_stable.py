"""Early stopping against the full grid: how many trials ``--until-stable`` runs, and how its profile agrees
with the full grid's.

Given the trial log of a full-grid run, the script replays ``--until-stable`` on it: the grid in spread
order, the same checks, each trial's record taken from the log instead of being computed (a trial's
result does not depend on the order trials run in, so the replay stops where a real run stops). For each
stopping rule it prints the trials run, the Jaccard index at the stop and the agreement of the stopped
profile with the full grid's (Spearman over all query heads, top-10 and top-20 overlap). With ``--stopped``
it also compares the profiles of a real ``--until-stable`` run with the full grid's.

    python benchmarks/bench_until_stable.py fullgrid/smollm2-135m.retrieval.trials.jsonl --k 10 20
    python benchmarks/bench_until_stable.py fullgrid/smollm2-135m.reasoning.trials.jsonl \\
        --stopped stable/smollm2-135m.retrieval_reasoning.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from scipy.stats import spearmanr

import headprobe
from headprobe.head_ranking import rank_order
from headprobe.probes.aggregate import gate_name, merge_logs
from headprobe.probes.early_stop import StopRule, run_until_stable
from headprobe.probes.trial_grid import make_grid
from headprobe.probes.trial_order import spread_order


def means(records: list[dict], kind: str, gate: str) -> np.ndarray:
    passed = [r["scores"][kind] for r in records if r["gates"].get(gate)]
    return np.mean(np.array(passed, dtype=np.float64), axis=0).ravel()


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    return {"spearman": round(float(spearmanr(a, b)[0]), 4),
            "top10": len(set(rank_order(a)[:10].tolist()) & set(rank_order(b)[:10].tolist())),
            "top20": len(set(rank_order(a)[:20].tolist()) & set(rank_order(b)[:20].tolist()))}


def replay(settings: dict, records: list[dict], kinds: list[str], rule: StopRule) -> tuple[object, list[dict]]:
    """Run ``run_until_stable`` over the log's records in spread order; returns the outcome and the records
    the stopped run would hold."""
    grid = make_grid(settings["needle_set"]["ids"], settings["lengths"], settings["depths"], settings["seeds"])
    by_id = {r["trial"]: r for r in records}
    missing = [t.id for t in grid if t.id not in by_id]
    if missing:
        raise SystemExit(f"the log misses {len(missing)} trials of its grid (e.g. {missing[0]}); give a full-grid log")
    done: dict = {}

    def run_chunk(chunk):
        for spec in chunk:
            done[spec.id] = by_id[spec.id]

    gates = {kind: gate_name(kind, settings) for kind in kinds}
    outcome = run_until_stable(spread_order(grid, rule.order_seed), done, run_chunk, gates, rule)
    return outcome, list(done.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", metavar="LOG",
                        help="trial log of a full-grid run, or the shard logs (--shard i/n) of one")
    parser.add_argument("--k", nargs="+", type=int, default=[10, 20])
    parser.add_argument("--jaccard", type=float, default=0.9)
    parser.add_argument("--stopped", nargs="*", default=[], help="profiles of a real --until-stable run")
    parser.add_argument("--out", help="write the results as JSON")
    args = parser.parse_args()

    merged = merge_logs(args.logs)          # one run's log, or its shard logs: checked and complete
    settings, records = merged.settings, merged.records
    name = args.logs[0] if len(args.logs) == 1 else f"{args.logs[0]} (+{len(args.logs) - 1} shard logs)"
    kinds = [k for k in (("retrieval", "enhanced_retrieval") if settings["pass"] == "retrieval"
                         else ("retrieval_reasoning",)) if k in settings.get("probes", [k])]
    seconds = sum(r.get("seconds", 0.0) for r in records)
    print(f"{name}: {len(records)} trials, mode {settings['mode']}"
          + (f" (share {settings['recompute_share']})" if "recompute_share" in settings else "")
          + f", {seconds:.0f} s of trial time")
    results = []
    for k in args.k:
        rule = StopRule(k=k, jaccard=args.jaccard)
        outcome, stopped = replay(settings, records, kinds, rule)
        spent = sum(r.get("seconds", 0.0) for r in stopped)
        row = {"k": k, "jaccard_rule": args.jaccard, "stable": outcome.stable, "trials": outcome.trials,
               "grid": outcome.grid, "trial_seconds": round(spent, 1), "jaccard": outcome.jaccard, "agreement": {}}
        for kind in kinds:
            gate = gate_name(kind, settings)
            row["agreement"][kind] = compare(means(stopped, kind, gate), means(records, kind, gate))
            row["agreement"][kind]["passed"] = sum(1 for r in stopped if r["gates"].get(gate))
        results.append(row)
        print(f"top-{k}, Jaccard >= {args.jaccard}: {'stable' if outcome.stable else 'not stable'} after "
              f"{outcome.trials} of {outcome.grid} trials ({spent:.0f} s of {seconds:.0f} s trial time); "
              + "; ".join(f"{kind}: Jaccard {outcome.jaccard[kind] if outcome.jaccard else None}, vs full grid "
                          f"rho {a['spearman']:.3f}, top10 {a['top10']}, top20 {a['top20']} ({a['passed']} passed)"
                          for kind, a in row["agreement"].items()))
    for path in args.stopped:
        profile = headprobe.Profile.load(path)
        full = means(records, profile.kind, gate_name(profile.kind, settings))
        agree = compare(np.array(profile.query_heads).ravel(), full)
        stop = profile.trials.get("stopping", {})
        print(f"{path}: {stop.get('trials_run')} of {stop.get('grid_trials')} trials, stable {stop.get('stable')}, "
              f"Jaccard {stop.get('jaccard')}; vs full grid rho {agree['spearman']:.3f}, top10 {agree['top10']}, "
              f"top20 {agree['top20']}")
        results.append({"profile": path, "stopping": stop, "agreement": agree})
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
