"""Reuse mode against exact fast mode: time per trial and agreement, over the recompute share.

One needle pass (retrieval or retrieval-reasoning) on a grid of lengths x depths x needles runs once in
fast mode (exact) and once per recompute share in reuse mode, in one process, one after the other. For
every share the script reports seconds per trial (wall time of the run, haystack forwards included, and
the process's CPU time, which other jobs on a shared machine disturb less), the speed-up over fast mode, and how the reuse profile agrees with the fast one: Spearman correlation
over all query heads, overlap of the top-10 and top-20 heads, and the trials whose gate decision flips.
Results go to ``--out`` (JSON, with the per-length seconds) and are printed as a table;
``benchmarks/reuse_tables.py`` turns the JSON files into the docs table and figure.

    OMP_NUM_THREADS=1 python benchmarks/bench_reuse_curve.py --probe retrieval --lengths 1000 2000 4000 8000 \\
        --needles r01 r02 r03 --shares 0 5 10 25 100 --out reuse_curve/retrieval.json
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

import headprobe
from headprobe.head_ranking import rank_order
from headprobe.probes.aggregate import gate_name

FULL_DEPTHS = [round(100 * i / 9, 2) for i in range(10)]


def profile_means(records: list[dict], kind: str, gate: str) -> np.ndarray:
    """Mean scores ``[layers * heads]`` over the trials that passed ``gate``."""
    passed = [r["scores"][kind] for r in records if r["gates"].get(gate)]
    return np.mean(np.array(passed, dtype=np.float64), axis=0).ravel()


def top_overlap(a: np.ndarray, b: np.ndarray, k: int) -> int:
    """Heads the two top-``k`` sets share (ties broken as everywhere in headprobe)."""
    return len(set(rank_order(a)[:k].tolist()) & set(rank_order(b)[:k].tolist()))


def agreement(fast: list[dict], other: list[dict], kinds: list[str], gates: dict[str, str]) -> dict:
    """Spearman, top-10/20 overlap per kind; gate flips over the trials both runs have."""
    by_id = {r["trial"]: r for r in fast}
    out = {}
    for kind in kinds:
        a, b = profile_means(fast, kind, gates[kind]), profile_means(other, kind, gates[kind])
        gate = gates[kind]
        flips = sum(1 for r in other if bool(r["gates"].get(gate)) != bool(by_id[r["trial"]]["gates"].get(gate)))
        out[kind] = {"spearman": round(float(spearmanr(a, b)[0]), 4), "top10": top_overlap(a, b, 10),
                     "top20": top_overlap(a, b, 20), "gate_flips": flips,
                     "passed": sum(1 for r in other if r["gates"].get(gates[kind]))}
    return out


def run_mode(loaded, args, out: Path, mode: str, share: float) -> tuple[float, float, list[dict], dict]:
    request = headprobe.ProfileRequest(
        probes=[args.probe] + (["enhanced_retrieval"] if args.probe == "retrieval" else []),
        lengths=args.lengths, depths=[d / 100 for d in args.depths], out_dir=out, mode=mode,
        needle_ids=args.needles, gate=args.gate, batch_size=args.batch_size, recompute_share=share,
        force=True)
    start, cpu = time.perf_counter(), time.process_time()
    result = headprobe.run_profile(loaded, request)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    _, records = headprobe.read_log(result.logs[0])
    by_length = {}
    for r in records:
        by_length[r["length"]] = by_length.get(r["length"], 0.0) + r["seconds"]
    return elapsed, cpu, records, {str(k): round(v, 2) for k, v in sorted(by_length.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--probe", default="retrieval", choices=["retrieval", "retrieval_reasoning"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[1000, 2000, 4000, 8000])
    parser.add_argument("--depths", nargs="+", type=float, default=FULL_DEPTHS, help="percent")
    parser.add_argument("--needles", nargs="+", help="needle ids (default: the kind's first three)")
    parser.add_argument("--gate", default="likelihood", choices=["published", "likelihood"],
                        help="retrieval-reasoning gate (retrieval trials always use the published gate)")
    parser.add_argument("--shares", nargs="+", type=float, default=[0, 5, 10, 25, 100], help="percent")
    parser.add_argument("--batch-size", type=int, default=4, help="fast mode batch size")
    parser.add_argument("--out", default="reuse_curve.json")
    parser.add_argument("--work-dir", default=None, help="where the runs' logs go (default: next to --out)")
    args = parser.parse_args()

    loaded = headprobe.load_model(args.model, device="cpu")
    kind = "retrieval" if args.probe == "retrieval" else "reasoning"
    if not args.needles:
        args.needles = [n.id for n in headprobe.load_needles(headprobe.shipped_needle_file(kind))[:3]]
    kinds = ["retrieval", "enhanced_retrieval"] if args.probe == "retrieval" else ["retrieval_reasoning"]
    gates = {k: gate_name(k, {"gate": args.gate}) for k in kinds}
    work = Path(args.work_dir or Path(args.out).with_suffix(""))
    with open("/proc/loadavg") as handle:
        load_before = handle.read().split()[:3]
    print(f"model {loaded.identity.name}, torch threads {torch.get_num_threads()}, load {load_before}; "
          f"{args.probe}: lengths {args.lengths}, {len(args.depths)} depths, needles {args.needles}")
    fast_seconds, fast_cpu, fast_records, fast_by_length = run_mode(loaded, args, work / "fast", "fast", 1.0)
    n = len(fast_records)
    print(f"fast: {n} trials, {fast_seconds / n:.2f} s/trial ({fast_cpu / n:.2f} CPU s), per length {fast_by_length}",
          flush=True)
    rows = []
    for share in args.shares:
        seconds, cpu, records, by_length = run_mode(loaded, args, work / f"reuse-{share:g}", "reuse", share / 100)
        agree = agreement(fast_records, records, kinds, gates)
        row = {"share_percent": share, "seconds_per_trial": round(seconds / n, 3),
               "cpu_seconds_per_trial": round(cpu / n, 3), "speedup": round(fast_seconds / seconds, 2),
               "cpu_speedup": round(fast_cpu / cpu, 2), "seconds_by_length": by_length, "agreement": agree}
        rows.append(row)
        print(f"share {share:g}%: {seconds / n:.2f} s/trial, {fast_seconds / seconds:.2f}x (CPU {fast_cpu / cpu:.2f}x); "
              + "; ".join(f"{k}: rho {v['spearman']:.3f}, top10 {v['top10']}, top20 {v['top20']}, "
                          f"flips {v['gate_flips']}" for k, v in agree.items()), flush=True)
    with open("/proc/loadavg") as handle:
        load_after = handle.read().split()[:3]
    result = {"model": loaded.identity.name, "probe": args.probe, "lengths": args.lengths, "depths": args.depths,
              "needles": args.needles, "gate": args.gate, "trials": n, "threads": torch.get_num_threads(),
              "load_before": load_before, "load_after": load_after,
              "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
              "fast": {"seconds_per_trial": round(fast_seconds / n, 3), "cpu_seconds_per_trial": round(fast_cpu / n, 3),
                       "seconds_by_length": fast_by_length,
                       "passed": {k: sum(1 for r in fast_records if r["gates"].get(gates[k])) for k in kinds}},
              "reuse": rows, "date": time.strftime("%Y-%m-%d")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
