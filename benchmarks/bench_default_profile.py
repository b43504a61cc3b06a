"""Candidate defaults for ``headprobe profile`` against an exact profile of a larger grid.

    # the reference: exact fast mode on a larger grid (lengths 1K-4K, five depths, every needle)
    headprobe profile --probe retrieval enhanced_retrieval retrieval_reasoning --lengths 1000 2000 4000 \\
        --depths 0 25 50 75 100 --gate likelihood --out-dir ref --name ref
    # a candidate: any profile command, timed
    /usr/bin/time -v -o cand/time.txt headprobe profile --mode reuse --recompute-share 0 --out-dir cand
    python benchmarks/bench_default_profile.py ref cand [cand2 ...] [--json out.json]

For every candidate folder and head-score kind (retrieval, enhanced_retrieval, retrieval_reasoning) it
prints the agreement of the candidate's profile with the reference's: Spearman correlation over all query
heads, overlap of the top-10 and top-20 heads (ties broken as everywhere in headprobe), and the trials
both logs hold whose gate decision differs (gate flips); and the candidate's wall and CPU time, read from
the ``time.txt`` that ``/usr/bin/time -v -o`` wrote in its folder (model load and writing included).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from headprobe.head_ranking import rank_order

KINDS = ("retrieval", "enhanced_retrieval", "retrieval_reasoning")
PASS_OF = {"retrieval": "retrieval", "enhanced_retrieval": "retrieval", "retrieval_reasoning": "reasoning"}


def _one(folder: Path, pattern: str) -> Path | None:
    found = sorted(folder.glob(pattern))
    return found[0] if found else None


def _scores(profile: Path) -> np.ndarray:
    return np.asarray(json.loads(profile.read_text())["scores"]["query_heads"], dtype=np.float64).ravel()


def _gates(log: Path | None, kind: str) -> dict[str, bool]:
    """Trial id → whether the trial passed the gate the ``kind`` profile averages over."""
    if log is None:
        return {}
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    settings = lines[0].get("settings", {})
    gate = "published" if kind != "retrieval_reasoning" else settings.get("gate", "published")
    return {r["trial"]: bool(r.get("gates", {}).get(gate)) for r in lines[1:] if "trial" in r}


def top_overlap(a: np.ndarray, b: np.ndarray, k: int) -> int:
    return len(set(rank_order(a)[:k].tolist()) & set(rank_order(b)[:k].tolist()))


def agreement(ref: Path, cand: Path) -> dict[str, dict]:
    out = {}
    for kind in KINDS:
        a, b = _one(ref, f"*.{kind}.json"), _one(cand, f"*.{kind}.json")
        if a is None or b is None:
            continue
        x, y = _scores(a), _scores(b)
        ref_gates = _gates(_one(ref, f"*.{PASS_OF[kind]}.trials.jsonl"), kind)
        cand_gates = _gates(_one(cand, f"*.{PASS_OF[kind]}*.trials.jsonl"), kind)
        both = set(ref_gates) & set(cand_gates)
        profile = json.loads(b.read_text())
        out[kind] = {"spearman": round(float(spearmanr(x, y)[0]), 4), "top10": top_overlap(x, y, 10),
                     "top20": top_overlap(x, y, 20),
                     "gate_flips": sum(ref_gates[t] != cand_gates[t] for t in both), "shared_trials": len(both),
                     "trials": profile["trials"]["total"], "passed": profile["trials"]["passed"]}
    return out


def _seconds(text: str, label: str) -> float | None:
    m = re.search(rf"{label}: ([\d:.]+)", text)
    if not m:
        return None
    parts = [float(p) for p in m.group(1).split(":")]
    return sum(p * 60 ** i for i, p in enumerate(reversed(parts)))


def timing(cand: Path) -> dict[str, float | None]:
    path = cand / "time.txt"
    if not path.exists():
        return {"wall_s": None, "cpu_s": None}
    text = path.read_text()
    user, system = _seconds(text, "User time \\(seconds\\)"), _seconds(text, "System time \\(seconds\\)")
    return {"wall_s": _seconds(text, "Elapsed \\(wall clock\\) time \\(h:mm:ss or m:ss\\)"),
            "cpu_s": None if user is None else round(user + (system or 0), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("reference", type=Path)
    parser.add_argument("candidates", type=Path, nargs="+")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    rows = {}
    print("| candidate | wall s | CPU s | kind | trials (passed) | Spearman | top-10 | top-20 | gate flips |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for cand in args.candidates:
        t, agree = timing(cand), agreement(args.reference, cand)
        rows[str(cand)] = {"timing": t, "agreement": agree}
        for kind, a in agree.items():
            print(f"| {cand.name} | {t['wall_s'] or ''} | {t['cpu_s'] or ''} | {kind} | {a['trials']} ({a['passed']}) "
                  f"| {a['spearman']:.3f} | {a['top10']}/10 | {a['top20']}/20 | {a['gate_flips']} of "
                  f"{a['shared_trials']} |")
    if args.json:
        args.json.write_text(json.dumps({"reference": str(args.reference), "candidates": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
