"""Reuse mode against exact fast mode: time per trial and agreement, over the recompute share.

One needle pass (retrieval or retrieval-reasoning) on a grid of lengths x depths x needles runs once in
fast mode (exact) and once per recompute share in reuse mode, in one process, length by length (at each
length fast mode, then every share, so that a change in the machine's load between lengths touches all
modes alike). For every share the script reports seconds per trial (wall time of the run, haystack forwards included, and
the process's CPU time, which other jobs on a shared machine disturb less), the speed-up over fast mode, and how the reuse profile agrees with the fast one: Spearman correlation
over all query heads, overlap of the top-10 and top-20 heads, and the trials whose gate decision flips.
Results go to ``--out`` (JSON, with the per-length seconds) and are printed as a table;
``benchmarks/reuse_tables.py`` turns the JSON files into the docs table and figure.

    OMP_NUM_THREADS=1 python benchmarks/bench_reuse_curve.py --probe retrieval --lengths 1000 2000 4000 8000 \\
        --needles r01 r02 --shares 0 5 10 25 100 --full-share-up-to 2000 --out reuse_curve/retrieval.json
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


def run_mode(loaded, args, length: int, out: Path, mode: str, share: float) -> tuple[float, float, list[dict]]:
    """One length in one mode: wall seconds, CPU seconds, the trial records."""
    request = headprobe.ProfileRequest(
        probes=[args.probe] + (["enhanced_retrieval"] if args.probe == "retrieval" else []),
        lengths=[length], depths=[d / 100 for d in args.depths], out_dir=out, mode=mode,
        needle_ids=args.needles, gate=args.gate, batch_size=args.batch_size, recompute_share=share,
        force=True)
    start, cpu = time.perf_counter(), time.process_time()
    result = headprobe.run_profile(loaded, request)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    _, records = headprobe.read_log(result.logs[0])
    return elapsed, cpu, records


def write_result(args, loaded, totals: dict, kinds: list[str], gates: dict[str, str], load_before: list[str]) -> None:
    """Summarise the lengths finished so far into ``args.out``."""
    fast = totals[("fast", 100.0)]
    rows = []
    for share in args.shares:
        entry = totals[("reuse", share)]
        lengths = [int(n) for n in entry["by_length"]]
        base_wall = sum(fast["by_length"][str(n)] for n in lengths)
        base_cpu = sum(fast["cpu_by_length"][str(n)] for n in lengths)
        base_records = [r for r in fast["records"] if r["length"] in lengths]
        n = len(entry["records"])
        agree = agreement(base_records, entry["records"], kinds, gates)
        rows.append({"share_percent": share, "lengths": lengths, "trials": n,
                     "seconds_per_trial": round(entry["wall"] / n, 3), "cpu_seconds_per_trial": round(entry["cpu"] / n, 3),
                     "speedup": round(base_wall / entry["wall"], 2), "cpu_speedup": round(base_cpu / entry["cpu"], 2),
                     "seconds_by_length": entry["by_length"], "cpu_by_length": entry["cpu_by_length"],
                     "agreement": agree})
        print(f"share {share:g}% ({n} trials): {entry['wall'] / n:.2f} s/trial, {base_wall / entry['wall']:.2f}x "
              f"(CPU {base_cpu / entry['cpu']:.2f}x); "
              + "; ".join(f"{k}: rho {v['spearman']:.3f}, top10 {v['top10']}, top20 {v['top20']}, "
                          f"flips {v['gate_flips']}" for k, v in agree.items()), flush=True)
    fast_records, n = fast["records"], len(fast["records"])
    fast_seconds, fast_cpu, fast_by_length = fast["wall"], fast["cpu"], fast["by_length"]
    with open("/proc/loadavg") as handle:
        load_after = handle.read().split()[:3]
    result = {"model": loaded.identity.name, "probe": args.probe, "lengths": args.lengths, "depths": args.depths,
              "needles": args.needles, "gate": args.gate, "trials": n, "threads": torch.get_num_threads(),
              "load_before": load_before, "load_after": load_after,
              "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
              "fast": {"seconds_per_trial": round(fast_seconds / n, 3), "cpu_seconds_per_trial": round(fast_cpu / n, 3),
                       "seconds_by_length": fast_by_length, "cpu_by_length": fast["cpu_by_length"],
                       "passed": {k: sum(1 for r in fast_records if r["gates"].get(gates[k])) for k in kinds}},
              "reuse": rows, "date": time.strftime("%Y-%m-%d")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--probe", default="retrieval", choices=["retrieval", "retrieval_reasoning"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[1000, 2000, 4000, 8000])
    parser.add_argument("--depths", nargs="+", type=float, default=FULL_DEPTHS, help="percent")
    parser.add_argument("--needles", nargs="+", help="needle ids (default: the kind's first two)")
    parser.add_argument("--gate", default="likelihood", choices=["published", "likelihood"],
                        help="retrieval-reasoning gate (retrieval trials always use the published gate)")
    parser.add_argument("--shares", nargs="+", type=float, default=[0, 5, 10, 25, 100], help="percent")
    parser.add_argument("--batch-size", type=int, default=4, help="fast mode batch size")
    parser.add_argument("--full-share-up-to", type=int, default=None,
                        help="run the 100%% share only at lengths up to this (it costs as much as fast mode)")
    parser.add_argument("--out", default="reuse_curve.json")
    parser.add_argument("--work-dir", default=None, help="where the runs' logs go (default: next to --out)")
    args = parser.parse_args()

    loaded = headprobe.load_model(args.model, device="cpu")
    kind = "retrieval" if args.probe == "retrieval" else "reasoning"
    if not args.needles:
        args.needles = [n.id for n in headprobe.load_needles(headprobe.shipped_needle_file(kind))[:2]]
    kinds = ["retrieval", "enhanced_retrieval"] if args.probe == "retrieval" else ["retrieval_reasoning"]
    gates = {k: gate_name(k, {"gate": args.gate}) for k in kinds}
    work = Path(args.work_dir or Path(args.out).with_suffix(""))
    with open("/proc/loadavg") as handle:
        load_before = handle.read().split()[:3]
    print(f"model {loaded.identity.name}, torch threads {torch.get_num_threads()}, load {load_before}; "
          f"{args.probe}: lengths {args.lengths}, {len(args.depths)} depths, needles {args.needles}")
    modes = [("fast", 100.0)] + [("reuse", share) for share in args.shares]
    totals = {m: {"wall": 0.0, "cpu": 0.0, "records": [], "by_length": {}, "cpu_by_length": {}} for m in modes}
    for length in args.lengths:
        for mode, share in modes:
            if mode == "reuse" and share == 100 and args.full_share_up_to and length > args.full_share_up_to:
                continue
            name = "fast" if mode == "fast" else f"reuse-{share:g}"
            wall, cpu, records = run_mode(loaded, args, length, work / name / str(length), mode, share / 100)
            entry = totals[(mode, share)]
            entry["wall"] += wall
            entry["cpu"] += cpu
            entry["records"] += records
            entry["by_length"][str(length)] = round(wall, 2)
            entry["cpu_by_length"][str(length)] = round(cpu, 2)
            print(f"length {length} {name}: {len(records)} trials, {wall / len(records):.2f} s/trial "
                  f"({cpu / len(records):.2f} CPU s)", flush=True)
        write_result(args, loaded, totals, kinds, gates, load_before)
        print(f"wrote {args.out} (lengths up to {length})", flush=True)



if __name__ == "__main__":
    main()
